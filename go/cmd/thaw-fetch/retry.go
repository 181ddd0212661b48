package main

// The retry policy of a ranged GET: botocore's "standard" retry mode, plus a
// time budget so that a pull rides out a store's slow-down or 5xx window
// (issue 14 item 1) instead of giving up after botocore's few seconds.
//
// Twin: control/images/retry.py RetryPolicy (the in-process engine and every
// other store call). The two must decide alike; the policy, its fields,
// defaults and formula are written out in docs/store.md, "Retry policy".
//
// What botocore's standard mode does, read from botocore 1.44.8
// (botocore/retries/standard.py, the version in thaw's .venv):
//
//   - Which failures are retried (StandardRetryConditions): "not max_attempts
//     and (transient or throttled or throttling_status or modeled_retry)":
//     TransientRetryableChecker: error codes 'RequestTimeout',
//     'RequestTimeoutException', 'PriorRequestNotComplete'; HTTP statuses
//     [500, 502, 503, 504]; exceptions ConnectionError, HTTPClientError
//     (connection refused/reset, connect and read timeouts, a connection
//     closed mid-response). ThrottledRetryableChecker: error codes
//     'Throttling', 'ThrottlingException', 'ThrottledException',
//     'RequestThrottledException', 'TooManyRequestsException',
//     'ProvisionedThroughputExceededException', 'TransactionInProgressException',
//     'RequestLimitExceeded', 'BandwidthLimitExceeded', 'LimitExceededException',
//     'RequestThrottled', 'SlowDown', 'PriorRequestNotComplete',
//     'EC2ThrottledException'. ThrottlingStatusCodeChecker: status 429 unless
//     its code is a modeled error of the operation. ModeledRetryableChecker:
//     errors the service model marks retryable (GetObject has none).
//     Nothing else is retried: 4xx, 501, 505, ...; 408 by status alone is not
//     (thaw-fetch retried it before; S3 says RequestTimeout in a 400).
//   - How many times (MaxAttemptsChecker): "context.attempt_number <
//     self._max_attempts" with a 1-based attempt number and max_attempts =
//     total_max_attempts. The client config's retries={"max_attempts": N}
//     counts retries: botocore/args.py "client config max_attempts means total
//     retries so we have to add one for 'total_max_attempts'", so N = 3 (thaw's
//     store.retries default) makes 4 tries in all. thaw-fetch used to make 3.
//   - How long to wait (ExponentialBackoff.delay_amount):
//     "t_i = rand(0, 1) * min(base_scale * 2 ** i, MAX_BACKOFF) where i is the
//     request attempt (0 based) and base_scale is 1 second for throttling
//     errors and 50 milliseconds otherwise"; MAX_BACKOFF = 20; "If the response
//     carries an x-amz-retry-after header, the delay is raised to that value,
//     capped at t_i + 5 seconds" (the header is in milliseconds).
//     (botocore 1.34 used one scale, 1 s, for every error:
//     "t_i = min(rand(0, 1) * 2 ** attempt, MAX_BACKOFF)".) thaw-fetch used
//     to wait half of that.
//   - A retry quota (RetryQuotaChecker, quota.RetryQuota): a bucket of 500 per
//     client, 5 per throttled retry and 14 per other retry, refilled by
//     successes. Not taken: with 8 ranges in flight, a 10 s window of 502s
//     costs ~8 retries a range (50 ms scale) = 64 x 14 = 896 > 500, so the
//     quota alone would end the pull inside the window the budget is there to
//     survive. The budget below bounds the retrying instead.
//
// What thaw adds, the budget: a request is retried while it is within
// max_attempts retries (botocore's count, a floor) OR within budget_s seconds
// of the start of its first try; a retry past the count never starts later
// than that instant (its delay is cut short), so any window shorter than the
// budget, less one try, is survived, and an outage longer than it ends in one
// error naming the object and how long it was tried. budget_s = 0 is
// botocore's standard mode exactly (less the quota).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"
)

// retryPolicy is the plan's "retry" object. Defaults: defaultRetry.
type retryPolicy struct {
	MaxAttempts    int     `json:"max_attempts"`     // retries after the first try, botocore's count (store.retries)
	BudgetS        float64 `json:"budget_s"`         // retry on past max_attempts until this long after the first try
	BaseS          float64 `json:"base_s"`           // backoff scale of throttling errors (SlowDown, 429, ...)
	TransientBaseS float64 `json:"transient_base_s"` // backoff scale of other retryable errors
	MaxBackoffS    float64 `json:"max_backoff_s"`    // cap of one backoff, before x-amz-retry-after
}

// defaultRetry: botocore 1.44.8's standard mode with thaw's store.retries
// default (3) and a 30 s budget, 3x the 10 s slow-down window issue 14 asks
// to survive. Twin: control/images/retry.py RetryPolicy defaults.
var defaultRetry = retryPolicy{MaxAttempts: 3, BudgetS: 30, BaseS: 1, TransientBaseS: 0.05, MaxBackoffS: 20}

// UnmarshalJSON starts from the defaults: a field left out keeps its default.
func (p *retryPolicy) UnmarshalJSON(b []byte) error {
	type plain retryPolicy
	v := plain(defaultRetry)
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return fmt.Errorf("retry: %v", err)
	}
	*p = retryPolicy(v)
	return nil
}

func (p retryPolicy) check() error {
	if p.MaxAttempts < 0 || p.BudgetS < 0 || p.BaseS <= 0 || p.TransientBaseS <= 0 || p.MaxBackoffS <= 0 ||
		math.IsInf(p.BudgetS, 0) || math.IsNaN(p.BudgetS) {
		return fmt.Errorf("retry: max_attempts and budget_s must be >= 0, base_s, transient_base_s and "+
			"max_backoff_s > 0 (got %+v)", p)
	}
	return nil
}

func (p retryPolicy) String() string {
	return fmt.Sprintf("%d retries or %g s", p.MaxAttempts, p.BudgetS)
}

// failure is what one try ended with, as far as retrying cares.
type failure struct {
	status     int           // HTTP status; 0 when no response came (transport)
	code       string        // S3 error code from the XML body, "" if none
	retryAfter time.Duration // x-amz-retry-after; < 0 when absent
	transport  bool          // no response, or the response broke off: botocore's ConnectionError/HTTPClientError
	final      bool          // a failure that no retry can fix (the pack does not match the manifest)
}

var transientCodes = map[string]bool{"RequestTimeout": true, "RequestTimeoutException": true,
	"PriorRequestNotComplete": true}

var throttlingCodes = map[string]bool{"Throttling": true, "ThrottlingException": true,
	"ThrottledException": true, "RequestThrottledException": true, "TooManyRequestsException": true,
	"ProvisionedThroughputExceededException": true, "TransactionInProgressException": true,
	"RequestLimitExceeded": true, "BandwidthLimitExceeded": true, "LimitExceededException": true,
	"RequestThrottled": true, "SlowDown": true, "PriorRequestNotComplete": true,
	"EC2ThrottledException": true}

// classify says whether botocore's standard mode retries f, and whether it
// is a throttling error (backoff scale base_s rather than transient_base_s).
func classify(f failure) (retryable, throttling bool) {
	if f.final {
		return false, false
	}
	throttling = throttlingCodes[f.code] || (f.status == http.StatusTooManyRequests && !modeledGetObjectError[f.code])
	transient := f.transport || transientCodes[f.code] ||
		f.status == 500 || f.status == 502 || f.status == 503 || f.status == 504
	return transient || throttling, throttling
}

// GetObject's modeled errors (botocore/data/s3/.../service-2.json): a 429
// carrying one of them is the model's to judge, and none is retryable.
var modeledGetObjectError = map[string]bool{"NoSuchKey": true, "InvalidObjectState": true}

// retryAfterHeader parses x-amz-retry-after (milliseconds); -1 when absent or bad.
func retryAfterHeader(h http.Header) time.Duration {
	v := h.Get("x-amz-retry-after")
	if v == "" {
		return -1
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms < 0 {
		return -1
	}
	return time.Duration(ms) * time.Millisecond
}

// retrier follows one request through its tries.
type retrier struct {
	p       retryPolicy
	first   time.Time // start of the first try
	tries   int       // tries made so far
	retries int
	now     func() time.Time
	rand    func() float64 // [0, 1)
}

func newRetrier(p retryPolicy, now func() time.Time, rnd func() float64) *retrier {
	return &retrier{p: p, first: now(), now: now, rand: rnd}
}

// next is called after a try failed with f: how long to wait before the next
// try, or ok=false to give up.
func (r *retrier) next(f failure) (wait time.Duration, ok bool) {
	r.tries++
	retryable, throttling := classify(f)
	if !retryable {
		return 0, false
	}
	scale := r.p.TransientBaseS
	if throttling {
		scale = r.p.BaseS
	}
	// botocore: rand(0,1) * min(base_scale * 2 ** (attempt_number - 1), MAX_BACKOFF), attempt 1-based.
	t := r.rand() * math.Min(scale*math.Pow(2, float64(r.tries-1)), r.p.MaxBackoffS)
	wait = time.Duration(t * float64(time.Second))
	if f.retryAfter >= 0 { // max(t_i, min(retry_after, t_i + 5))
		wait = max(wait, min(f.retryAfter, wait+5*time.Second))
	}
	if r.retries < r.p.MaxAttempts { // botocore's own count: always honoured
		r.retries++
		return wait, true
	}
	left := r.first.Add(time.Duration(r.p.BudgetS * float64(time.Second))).Sub(r.now())
	if left <= 0 {
		return 0, false
	}
	r.retries++
	return min(wait, left), true
}

// gaveUp says how long and how often the request was tried, for its error.
func (r *retrier) gaveUp() string {
	return fmt.Sprintf("gave up after %d tries in %.1f s (retry policy: %s)",
		r.tries, r.now().Sub(r.first).Seconds(), r.p)
}
