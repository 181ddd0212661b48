package stream

// The stream's GETs follow the one retry policy (go/internal/fetch/retry.go,
// the plan's "retry"), the same as a pull's: botocore's standard mode plus
// the budget. Before, the stream retried 408, 501 and 505 too, with its own
// backoff and no budget.

import (
	"strings"
	"sync/atomic"
	"testing"

	"thaw.dev/thaw/go/internal/fetch"
)

// quickRetry is botocore's policy with waits of milliseconds, for tests.
var quickRetry = fetch.RetryPolicy{MaxAttempts: 2, BudgetS: 0, BaseS: 0.01, TransientBaseS: 0.001, MaxBackoffS: 0.05}

func TestStreamRetriesWhatBotocoreRetries(t *testing.T) {
	for _, status := range []int{500, 502, 503, 504, 429} {
		im := newImage(t, 64<<10, randBytes(31, 300<<10))
		s := newStore(t, im.pack)
		var n atomic.Int64
		s.gate = func(string) int {
			if n.Add(1) <= 2 { // the first two GETs fail: within max_attempts
				return status
			}
			return 0
		}
		r := startStream(t, im.plan(s.srv.URL))
		if err := r.wait(t); err != nil {
			t.Fatalf("HTTP %d: %v", status, err)
		}
		if st := r.e.Stats(); st.Retries < 1 {
			t.Fatalf("HTTP %d: %d retries", status, st.Retries)
		}
	}
}

func TestStreamDoesNotRetryWhatBotocoreDoesNot(t *testing.T) {
	for _, status := range []int{404, 403, 408, 501, 505} {
		im := newImage(t, 64<<10, randBytes(32, 100<<10))
		s := newStore(t, im.pack)
		s.gate = func(string) int { return status }
		p := im.plan(s.srv.URL)
		p.Workers, p.UrgentWorkers = 1, 1
		r := startStream(t, p)
		err := r.wait(t)
		if err == nil || !strings.Contains(err.Error(), "HTTP") || strings.Contains(err.Error(), "gave up") {
			t.Fatalf("HTTP %d: %v", status, err)
		}
		if st := r.e.Stats(); st.Retries != 0 || len(s.requested()) != 1 {
			t.Fatalf("HTTP %d: %d retries, requests %v", status, st.Retries, s.requested())
		}
	}
}

// An outage longer than the budget ends the stream with the policy's one
// error, naming how long it was tried.
func TestStreamBudgetEndsAnOutage(t *testing.T) {
	im := newImage(t, 64<<10, randBytes(33, 100<<10))
	s := newStore(t, im.pack)
	s.gate = func(string) int { return 503 }
	p := im.plan(s.srv.URL)
	pol := quickRetry
	pol.BudgetS = 0.2
	p.Retry = &pol
	r := startStream(t, p)
	err := r.wait(t)
	if err == nil || !strings.Contains(err.Error(), "HTTP 503") ||
		!strings.Contains(err.Error(), "(retry policy: 2 retries or 0.2 s)") {
		t.Fatalf("%v", err)
	}
}
