package main

// Unit tests of the retry policy alone (retry.go), on a fake clock. The
// fetch-level tests (a 10 s window through HTTP, a long outage) are in
// fetch_test.go. The Python twin (control/images/retry.py) must pass the
// same cases.

import (
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
		{failure{final: true}, false, false},
	} {
		r, th := classify(tc.f)
		if r != tc.retryable || th != tc.throttling {
			t.Errorf("%+v: retryable %v throttling %v, want %v %v", tc.f, r, th, tc.retryable, tc.throttling)
		}
	}
}

// The waits are botocore's: rand * min(scale * 2^(n-1), 20 s), scale 1 s for
// throttling and 50 ms otherwise; x-amz-retry-after raises a wait up to 5 s
// past it. With the budget off, exactly max_attempts retries.
func TestBackoffIsBotocores(t *testing.T) {
	clock := &tick{time.Unix(0, 0)}
	half := func() float64 { return 0.5 }
	p := retryPolicy{MaxAttempts: 7, BudgetS: 0, BaseS: 1, TransientBaseS: 0.05, MaxBackoffS: 20}
	r := newRetrier(p, clock.now, half)
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
	r = newRetrier(p, clock.now, half)
	if w, _ := r.next(failure{status: 502, retryAfter: -1}); seconds(w) != 0.025 {
		t.Fatalf("first transient wait %v, want 25ms", w)
	}
	if w, _ := r.next(failure{status: 502, retryAfter: -1}); seconds(w) != 0.05 {
		t.Fatalf("second transient wait %v, want 50ms", w)
	}
	h := http.Header{}
	h.Set("x-amz-retry-after", "3000")
	r = newRetrier(p, clock.now, half)
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
	p := retryPolicy{MaxAttempts: 2, BudgetS: 30, BaseS: 1, TransientBaseS: 0.05, MaxBackoffS: 20}
	r := newRetrier(p, clock.now, func() float64 { return 0.999999 })
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
	r = newRetrier(p, clock.now, func() float64 { return 0.5 })
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
			r := newRetrier(defaultRetry, clock.now, rnd.Float64)
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
	r := newRetrier(defaultRetry, clock.now, rnd.Float64)
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
