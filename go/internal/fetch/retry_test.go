package fetch

// Unit tests of the retry policy alone (retry.go), on a fake clock. The
// fetch-level tests (a 10 s window through HTTP, a long outage) are in
// fill_test.go. The Python twin (control/images/retry.py) must pass the
// same cases (tests/unit/test_retry.py).

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"
)

type tick struct{ t time.Time }

func (c *tick) now() time.Time { return c.t }

func seconds(d time.Duration) float64 { return d.Seconds() }

func TestClassifyIsBotocoreStandard(t *testing.T) {
	for _, tc := range []struct {
		f                     failure
		retryable, throttling bool
	}{
		{failure{status: 503, code: "SlowDown"}, true, true},
		{failure{status: 503}, true, false},
		{failure{status: 500, code: "InternalError"}, true, false},
		{failure{status: 502}, true, false},
		{failure{status: 504}, true, false},
		{failure{status: 429}, true, true},
		{failure{status: 429, code: "NoSuchKey"}, false, false}, // a modeled error: the model says no
		{failure{status: 400, code: "RequestTimeout"}, true, false},
		{failure{status: 400, code: "Throttling"}, true, true},
		{failure{status: 400, code: "PriorRequestNotComplete"}, true, true},
		{failure{transport: true}, true, false},
		{failure{status: 408}, false, false},
		{failure{status: 501}, false, false},
		{failure{status: 505}, false, false},
		{failure{status: 403, code: "AccessDenied"}, false, false},
		{failure{status: 404, code: "NoSuchKey"}, false, false},
		{failure{status: 416, code: "InvalidRange"}, false, false},
		{failure{status: 400, code: "BadDigest"}, false, false},
		{failure{status: 200}, false, false}, // a 200 for a range that does not start at 0
		{failure{final: true}, false, false},
		{failure{final: true, status: 503, code: "SlowDown"}, false, false}, // the pack does not match its manifest
	} {
		r, th := classify(tc.f)
		if r != tc.retryable || th != tc.throttling {
			t.Errorf("%+v: retryable %v throttling %v, want %v %v", tc.f, r, th, tc.retryable, tc.throttling)
		}
	}
	// Every code of botocore 1.44.8's lists, whatever the status it comes with.
	for _, code := range []string{"Throttling", "ThrottlingException", "ThrottledException",
		"RequestThrottledException", "TooManyRequestsException", "ProvisionedThroughputExceededException",
		"TransactionInProgressException", "RequestLimitExceeded", "BandwidthLimitExceeded", "LimitExceededException",
		"RequestThrottled", "SlowDown", "PriorRequestNotComplete", "EC2ThrottledException"} {
		if r, th := classify(failure{status: 400, code: code}); !r || !th {
			t.Errorf("%s: retryable %v throttling %v, want a retryable throttling error", code, r, th)
		}
	}
	for _, code := range []string{"RequestTimeout", "RequestTimeoutException"} {
		if r, th := classify(failure{status: 400, code: code}); !r || th {
			t.Errorf("%s: retryable %v throttling %v, want a retryable transient error", code, r, th)
		}
	}
	for status := 400; status < 600; status++ {
		r, _ := classify(failure{status: status})
		if want := status == 429 || status == 500 || status == 502 || status == 503 || status == 504; r != want {
			t.Errorf("HTTP %d without a code: retryable %v, want %v", status, r, want)
		}
	}
}

// Whatever the jitter draws, the n-th wait lies in [0, min(scale * 2^(n-1),
// max_backoff_s)): botocore's truncated binary exponential backoff.
func TestBackoffStaysWithinBotocoresBounds(t *testing.T) {
	clock := &tick{time.Unix(0, 0)}
	rnd := rand.New(rand.NewPCG(27, 5))
	p := RetryPolicy{MaxAttempts: 12, BudgetS: 0, BaseS: 1, TransientBaseS: 0.05, MaxBackoffS: 20}
	for _, f := range []struct {
		failure
		scale float64
	}{{failure{status: 503, code: "SlowDown", retryAfter: -1}, 1}, {failure{status: 502, retryAfter: -1}, 0.05},
		{failure{transport: true, retryAfter: -1}, 0.05}} {
		for draw := 0; draw < 1000; draw++ {
			r := newRetrier(p, Clock{Now: clock.now, Rand: rnd.Float64})
			for n := 1; ; n++ {
				w, ok := r.next(f.failure)
				if !ok {
					if n != p.MaxAttempts+1 {
						t.Fatalf("%+v: gave up at try %d", f.failure, n)
					}
					break
				}
				if bound := min(f.scale*float64(int(1)<<(n-1)), p.MaxBackoffS); w < 0 || seconds(w) >= bound {
					t.Fatalf("%+v: wait %d is %v, outside [0, %g s)", f.failure, n, w, bound)
				}
			}
		}
	}
}

// A request that keeps failing ends once the budget is spent, and not
// before: tried at least max_attempts+1 times, for budget_s, then no more.
func TestBudgetExhaustionEndsTheRequest(t *testing.T) {
	for _, budget := range []float64{0, 1, 5, 30} {
		clock := &tick{time.Unix(0, 0)}
		p := RetryPolicy{MaxAttempts: 3, BudgetS: budget, BaseS: 1, TransientBaseS: 0.05, MaxBackoffS: 20}
		r := newRetrier(p, Clock{Now: clock.now, Rand: func() float64 { return 0.5 }})
		for {
			w, ok := r.next(failure{status: 500, retryAfter: -1})
			if !ok {
				break
			}
			clock.t = clock.t.Add(w + 200*time.Millisecond)
		}
		el := clock.t.Sub(time.Unix(0, 0)).Seconds()
		if r.tries < p.MaxAttempts+1 || (budget > 0 && (el < budget || el > budget+0.2+1e-9)) {
			t.Fatalf("budget %g s: %d tries over %.3f s", budget, r.tries, el)
		}
		want := fmt.Sprintf("gave up after %d tries in %.1f s (retry policy: 3 retries or %g s)", r.tries, el, budget)
		if r.gaveUp() != want {
			t.Fatalf("%q, want %q", r.gaveUp(), want)
		}
	}
}

// The waits are botocore's: rand * min(scale * 2^(n-1), 20 s), scale 1 s for
// throttling and 50 ms otherwise; x-amz-retry-after raises a wait up to 5 s
// past it. With the budget off, exactly max_attempts retries.
func TestBackoffIsBotocores(t *testing.T) {
	clock := &tick{time.Unix(0, 0)}
	half := func() float64 { return 0.5 }
	p := RetryPolicy{MaxAttempts: 7, BudgetS: 0, BaseS: 1, TransientBaseS: 0.05, MaxBackoffS: 20}
	r := newRetrier(p, Clock{Now: clock.now, Rand: half})
	var got []float64
	for {
		w, ok := r.next(failure{status: 503, code: "SlowDown", retryAfter: -1})
		if !ok {
			break
		}
		got = append(got, seconds(w))
	}
	want := []float64{0.5, 1, 2, 4, 8, 10, 10}
	if len(got) != len(want) {
		t.Fatalf("waits %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("waits %v, want %v", got, want)
		}
	}
	r = newRetrier(p, Clock{Now: clock.now, Rand: half})
	if w, _ := r.next(failure{status: 502, retryAfter: -1}); seconds(w) != 0.025 {
		t.Fatalf("first transient wait %v, want 25ms", w)
	}
	if w, _ := r.next(failure{status: 502, retryAfter: -1}); seconds(w) != 0.05 {
		t.Fatalf("second transient wait %v, want 50ms", w)
	}
	h := http.Header{}
	h.Set("x-amz-retry-after", "3000")
	r = newRetrier(p, Clock{Now: clock.now, Rand: half})
	if w, _ := r.next(failure{status: 503, code: "SlowDown", retryAfter: retryAfterHeader(h)}); seconds(w) != 3 {
		t.Fatalf("retry-after 3 s: wait %v", w)
	}
	h.Set("x-amz-retry-after", "60000")
	if w, _ := r.next(failure{status: 503, code: "SlowDown", retryAfter: retryAfterHeader(h)}); seconds(w) != 6 {
		t.Fatalf("retry-after 60 s: wait %v, want t_i + 5 = 6 s", w)
	}
	h.Set("x-amz-retry-after", "soon")
	if retryAfterHeader(h) >= 0 || retryAfterHeader(http.Header{}) >= 0 {
		t.Fatal("a bad or absent x-amz-retry-after must be ignored")
	}
}

// Past max_attempts, retries go on until budget_s after the first try, and
// the last one starts exactly then (its wait cut short), not later.
func TestBudgetExtendsRetriesAndCutsTheLastWait(t *testing.T) {
	clock := &tick{time.Unix(0, 0)}
	p := RetryPolicy{MaxAttempts: 2, BudgetS: 30, BaseS: 1, TransientBaseS: 0.05, MaxBackoffS: 20}
	r := newRetrier(p, Clock{Now: clock.now, Rand: func() float64 { return 0.999999 }})
	start := clock.t
	n := 0
	for {
		w, ok := r.next(failure{status: 503, code: "SlowDown", retryAfter: -1})
		if !ok {
			break
		}
		n++
		clock.t = clock.t.Add(w + 100*time.Millisecond) // the wait, then a try that takes 100 ms
	}
	// waits ~1, 2, 4, 8, 16 (=31 s with the tries): the fifth is cut to end at 30 s.
	if n != 5 || r.retries != 5 || r.tries != 6 {
		t.Fatalf("%d retries, %d tries", r.retries, r.tries)
	}
	if el := clock.t.Sub(start); el != 30*time.Second+100*time.Millisecond {
		t.Fatalf("the last try started at %v, want 30 s", el-100*time.Millisecond)
	}
	// max_attempts is a floor: a budget shorter than botocore's retries does not cut them.
	p.MaxAttempts, p.BudgetS = 3, 0.001
	r = newRetrier(p, Clock{Now: clock.now, Rand: func() float64 { return 0.5 }})
	for i := 0; i < 3; i++ {
		w, ok := r.next(failure{status: 500, retryAfter: -1})
		if !ok {
			t.Fatalf("retry %d refused inside max_attempts", i+1)
		}
		clock.t = clock.t.Add(w)
	}
	if _, ok := r.next(failure{status: 500, retryAfter: -1}); ok {
		t.Fatal("retried past max_attempts and budget")
	}
}

// The defaults ride out a 10 s window of SlowDown or 5xx however the jitter
// falls and wherever in the window a request starts (10,000 draws), and end
// a request that meets an endless outage between 30 s and 30 s plus one try.
func TestDefaultsSurviveTenSecondWindows(t *testing.T) {
	rnd := rand.New(rand.NewPCG(14, 1))
	for i := 0; i < 10000; i++ {
		for _, f := range []failure{{status: 503, code: "SlowDown", retryAfter: -1}, {status: 502, retryAfter: -1}} {
			clock := &tick{time.Unix(0, 0)}
			end := clock.t.Add(time.Duration((10 - rnd.Float64()*10) * float64(time.Second))) // window left
			r := newRetrier(DefaultRetry, Clock{Now: clock.now, Rand: rnd.Float64})
			for clock.t.Before(end) { // a try inside the window fails
				w, ok := r.next(f)
				if !ok {
					t.Fatalf("draw %d, %+v: gave up %v before the window's end (%s)", i, f, end.Sub(clock.t), r.gaveUp())
				}
				clock.t = clock.t.Add(w + 10*time.Millisecond)
			}
		}
	}
	clock := &tick{time.Unix(0, 0)}
	r := newRetrier(DefaultRetry, Clock{Now: clock.now, Rand: rnd.Float64})
	for {
		w, ok := r.next(failure{status: 503, code: "SlowDown", retryAfter: -1})
		if !ok {
			break
		}
		clock.t = clock.t.Add(w + 10*time.Millisecond)
	}
	if el := clock.t.Sub(time.Unix(0, 0)); el < 30*time.Second || el > 30*time.Second+20*time.Millisecond {
		t.Fatalf("an endless outage ended after %v", el)
	}
}
