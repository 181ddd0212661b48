package fetch

// Unit tests of Getter alone against an in-process HTTP server, on the real
// clock (the policies here wait milliseconds). Fill's tests (fill_test.go)
// cover the same policy through a whole plan on a fake clock.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// script serves body to ranged GETs, answering request i (1-based) with
// answer(i) instead when that is not 0; it records each request's Range.
func script(t *testing.T, body []byte, answer func(i int64) (int, string)) (*httptest.Server, func() []string) {
	var n atomic.Int64
	var mu sync.Mutex
	var ranges []string
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		mu.Lock()
		ranges = append(ranges, r.Header.Get("Range"))
		mu.Unlock()
		if status, code := answer(i); status != 0 {
			w.WriteHeader(status)
			fmt.Fprintf(w, "<Error><Code>%s</Code><Message>scripted</Message></Error>", code)
			return
		}
		http.ServeContent(w, r, "pack", time.Time{}, bytes.NewReader(body))
	}))
	t.Cleanup(s.Close)
	return s, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), ranges...)
	}
}

var quick = RetryPolicy{MaxAttempts: 3, BudgetS: 0, BaseS: 0.01, TransientBaseS: 0.001, MaxBackoffS: 0.05}

func TestGetterRetriesA503AndGetsTheBytes(t *testing.T) {
	body := randBytes(21, 50000)
	srv, ranges := script(t, body, func(i int64) (int, string) {
		if i == 1 {
			return 503, "SlowDown"
		}
		return 0, ""
	})
	g := NewGetter(1, quick, 5*time.Second)
	got := make([]byte, 30000)
	if err := g.GetInto(context.Background(), srv.URL+"/p?X-Amz-Signature=secret", "packs/p", 1000, got, nil); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, body[1000:31000]) || g.Retries.Load() != 1 || len(ranges()) != 2 {
		t.Fatalf("retries %d, requests %v", g.Retries.Load(), ranges())
	}
}

func TestGetterDoesNotRetryA404(t *testing.T) {
	srv, ranges := script(t, nil, func(int64) (int, string) { return 404, "NoSuchKey" })
	g := NewGetter(1, quick, 5*time.Second)
	err := g.GetInto(context.Background(), srv.URL+"/p?X-Amz-Signature=secret", "packs/p", 0, make([]byte, 10), nil)
	var fe *Error
	if !errors.As(err, &fe) || fe.Kind != "store" || fe.Object != "packs/p" || fe.Store != srv.URL ||
		fe.Detail != "HTTP 404 Code: NoSuchKey Message: scripted" || len(ranges()) != 1 || g.Retries.Load() != 0 {
		t.Fatalf("%#v after %d requests", err, len(ranges()))
	}
	if strings.Contains(err.Error(), "secret") {
		t.Fatalf("the error shows the URL's signature: %v", err)
	}
}

// A store that keeps failing is tried for the budget, then the GET ends
// with one error saying so.
func TestGetterBudgetEndsAnOutage(t *testing.T) {
	srv, ranges := script(t, nil, func(int64) (int, string) { return 503, "SlowDown" })
	p := quick
	p.MaxAttempts, p.BudgetS = 1, 0.3
	g := NewGetter(1, p, 5*time.Second)
	t0 := time.Now()
	err := g.GetInto(context.Background(), srv.URL+"/p", "packs/p", 0, make([]byte, 10), nil)
	el := time.Since(t0)
	var fe *Error
	if !errors.As(err, &fe) || !strings.HasPrefix(fe.Detail, "HTTP 503 Code: SlowDown") ||
		!strings.Contains(fe.Detail, "; gave up after") || !strings.HasSuffix(fe.Detail, "(retry policy: 1 retries or 0.3 s)") {
		t.Fatalf("%v", err)
	}
	if el < 300*time.Millisecond || el > 3*time.Second || len(ranges()) < 3 {
		t.Fatalf("ended after %v and %d requests", el, len(ranges()))
	}
}

// A body that breaks off is retried for the bytes not yet received only, and
// progress sees every byte once, in order.
func TestGetterResumesABrokenBody(t *testing.T) {
	body := randBytes(22, 600<<10)
	var n atomic.Int64
	var ranges []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ranges = append(ranges, r.Header.Get("Range"))
		if n.Add(1) == 1 {
			w.Header().Set("Content-Length", fmt.Sprint(len(body)))
			w.WriteHeader(http.StatusPartialContent)
			w.Write(body[:300<<10])
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // closes the connection mid-body
		}
		http.ServeContent(w, r, "pack", time.Time{}, bytes.NewReader(body))
	}))
	t.Cleanup(srv.Close)
	g := NewGetter(1, quick, 5*time.Second)
	got := make([]byte, len(body))
	last := 0
	err := g.GetInto(context.Background(), srv.URL+"/p", "packs/p", 0, got, func(have int) error {
		if have <= last {
			t.Errorf("progress went from %d to %d", last, have)
		}
		last = have
		return nil
	})
	if err != nil || !bytes.Equal(got, body) || last != len(body) || g.Retries.Load() != 1 {
		t.Fatalf("%v, retries %d, progress %d", err, g.Retries.Load(), last)
	}
	if len(ranges) != 2 || ranges[0] != fmt.Sprintf("bytes=0-%d", len(body)-1) ||
		!strings.HasPrefix(ranges[1], "bytes=") || strings.HasPrefix(ranges[1], "bytes=0-") {
		t.Fatalf("ranges asked: %v", ranges)
	}
}

// An error of the progress callback (a chunk that does not verify) ends the
// GET at once: a retry cannot fix it.
func TestGetterStopsOnAProgressError(t *testing.T) {
	srv, ranges := script(t, randBytes(23, 1000), func(int64) (int, string) { return 0, "" })
	g := NewGetter(1, quick, 5*time.Second)
	bad := errors.New("chunk does not verify")
	err := g.GetInto(context.Background(), srv.URL+"/p", "packs/p", 0, make([]byte, 1000),
		func(int) error { return bad })
	if err != bad || len(ranges()) != 1 || g.Retries.Load() != 0 {
		t.Fatalf("%v after %d requests", err, len(ranges()))
	}
}
