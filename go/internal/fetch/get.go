package fetch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"sync/atomic"
	"time"
)

// Getter GETs byte ranges of objects through presigned URLs, each GET
// retried under one RetryPolicy (retry.go).
type Getter struct {
	client  *http.Client
	policy  RetryPolicy
	timeout time.Duration
	Clock   Clock        // of the retry policy; tests put a fake one here
	Retries atomic.Int64 // GETs retried so far
}

// NewGetter makes a Getter keeping up to conns idle connections; timeout
// bounds connecting and waiting for the response headers (store.timeout_s),
// and each try's whole deadline is timeout plus the bytes left at 1 MB/s.
func NewGetter(conns int, policy RetryPolicy, timeout time.Duration) *Getter {
	return &Getter{policy: policy, timeout: timeout, Clock: SystemClock(), client: &http.Client{Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment, // as botocore honours HTTP(S)_PROXY
		DialContext:           (&net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost:   conns,
		DisableCompression:    true, // a ranged GET must come back as the stored bytes
		ResponseHeaderTimeout: timeout,
		ReadBufferSize:        256 << 10,
	}}}
}

// GetInto fills body with the object's bytes from start on. progress, when
// not nil, is called with how many leading bytes of body have arrived each
// time more did (so a caller can use whole chunks before the range ends); an
// error it returns ends the GET as is, not retried. A retry asks only for the
// bytes not yet received. A GET that is not retryable, or runs out of
// retries, fails with an *Error of kind "store" naming the store (never the
// URL's query: it holds the signature), the object, the last answer and,
// when it was retried to the end, how long and how often.
func (g *Getter) GetInto(ctx context.Context, rawURL, name string, start int64, body []byte,
	progress func(have int) error) error {
	got := 0
	rt := newRetrier(g.policy, g.Clock)
	for {
		err, f := g.getOnce(ctx, rawURL, start, body, &got, progress)
		if err == nil {
			return nil
		}
		var stop *stopError
		if errors.As(err, &stop) {
			return stop.err
		}
		fail := &Error{Kind: "store", Store: storeOf(rawURL), Object: name, Offset: start, Length: len(body),
			Detail: err.Error()}
		if ctx.Err() != nil {
			if errors.Is(err, context.Canceled) {
				fail.Detail = "cancelled"
			}
			return fail
		}
		wait, ok := rt.next(f)
		if !ok {
			if retryable, _ := classify(f); retryable {
				fail.Detail += "; " + rt.gaveUp()
			}
			return fail
		}
		g.Retries.Add(1)
		g.Clock.Sleep(ctx, wait)
	}
}

// stopError carries an error of the progress callback: not retried.
type stopError struct{ err error }

func (s *stopError) Error() string { return s.err.Error() }

// storeOf is a presigned URL's scheme and host, for messages.
func storeOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Scheme + "://" + u.Host
}

var xmlField = regexp.MustCompile(`<(Code|Message)>([^<]*)</`)

// getOnce is one try, for the bytes of body from *got on. On failure it says
// what happened as far as retrying cares (retry.go classify).
func (g *Getter) getOnce(ctx context.Context, rawURL string, start int64, body []byte, got *int,
	progress func(int) error) (error, failure) {
	rest := body[*got:]
	from := start + int64(*got)
	ctx, cancel := context.WithTimeout(ctx, g.timeout+time.Duration(len(rest))*time.Microsecond)
	defer cancel()
	transport := failure{transport: true, retryAfter: -1}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return err, failure{final: true}
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", from, from+int64(len(rest))-1))
	resp, err := g.client.Do(req)
	if err != nil {
		return err, transport
	}
	defer resp.Body.Close()
	whole := resp.StatusCode == http.StatusOK && from == 0
	if resp.StatusCode != http.StatusPartialContent && !whole {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		detail := fmt.Sprintf("HTTP %d", resp.StatusCode)
		f := failure{status: resp.StatusCode, retryAfter: retryAfterHeader(resp.Header)}
		for _, m := range xmlField.FindAllSubmatch(msg, 2) {
			detail += " " + string(m[1]) + ": " + string(m[2])
			if string(m[1]) == "Code" && f.code == "" {
				f.code = string(m[2])
			}
		}
		return errors.New(detail), f
	}
	if resp.ContentLength >= 0 && resp.ContentLength != int64(len(rest)) {
		return fmt.Errorf("asked for %d bytes at %d, got %d (the pack does not match its manifest)",
			len(rest), from, resp.ContentLength), failure{final: true}
	}
	// With progress, read in pieces of up to 256 KiB (a chunk's average) so
	// that it sees chunks as they complete; without, in as few reads as the
	// connection allows (a read of a whole range goes from the socket straight
	// into body, past the transport's buffer).
	piece := len(rest)
	if progress != nil {
		piece = 256 << 10
	}
	for len(rest) > 0 {
		n, err := io.ReadAtLeast(resp.Body, rest[:min(len(rest), piece)], 1)
		*got += n
		rest = rest[n:]
		if n > 0 && progress != nil {
			if perr := progress(*got); perr != nil {
				return &stopError{perr}, failure{final: true}
			}
		}
		if err != nil && len(rest) > 0 {
			return fmt.Errorf("read %d of %d bytes at %d: %v", len(body)-len(rest), len(body), start, err), transport
		}
	}
	var one [1]byte
	if n, _ := resp.Body.Read(one[:]); n > 0 {
		return fmt.Errorf("asked for %d bytes at %d, got more (the pack does not match its manifest)",
			len(body), start), failure{final: true}
	}
	return nil, failure{}
}
