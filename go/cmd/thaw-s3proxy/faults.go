package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
)

// Fault kinds (docs/s3proxy.md).
const (
	kindError    = "error"    // answer status (500/502/503) with S3's error body instead of forwarding
	kindRefuse   = "refuse"   // close the listening socket: connections are refused; open ones are reset
	kindReset    = "reset"    // reset the connection of each matching request (TCP RST, no answer)
	kindStall    = "stall"    // accept, then hang: no answer (or after_bytes of the body) until the window ends
	kindThrottle = "throttle" // response bodies at rate_bps bytes/s, shared by every matching response
	kindCorrupt  = "corrupt"  // flip bytes of matching response bodies at given object offsets
)

// fault is one injected fault and its window, as given to POST /faults.
type fault struct {
	ID   int    `json:"id"`
	Kind string `json:"kind"`
	// Window: opens when added ("now") or at the first matching request
	// ("first"); lasts duration_s (0: until removed).
	Start     string  `json:"start,omitempty"`
	DurationS float64 `json:"duration_s,omitempty"`
	// Which requests: a regular expression searched in the URL path
	// (/bucket/key, as sent), and methods (empty: all). Not for refuse.
	Key     string   `json:"key,omitempty"`
	Methods []string `json:"methods,omitempty"`
	// error
	Status  int    `json:"status,omitempty"`  // 500, 502 or 503 (default 503)
	Code    string `json:"code,omitempty"`    // S3 error code; default SlowDown (503), InternalError (500); none for 502
	Message string `json:"message,omitempty"` // default S3's message for the code
	// stall: answer the headers and this many body bytes first (absent: nothing at all)
	AfterBytes *int64 `json:"after_bytes,omitempty"`
	// throttle
	RateBps float64 `json:"rate_bps,omitempty"`
	// corrupt: object offsets (the Content-Range start counts) whose bytes are XORed with xor (default 0xff)
	Offsets []int64 `json:"offsets,omitempty"`
	Every   int64   `json:"every,omitempty"` // also every byte at an offset divisible by every
	XOR     int     `json:"xor,omitempty"`

	// State, reported by GET /faults.
	Hits   int64      `json:"hits"`             // requests (or connections, for refuse) it acted on
	Opened *time.Time `json:"opened,omitempty"` // when its window opened
	Active bool       `json:"active"`

	key    *regexp.Regexp
	closed chan struct{} // closed when the window ends or the fault is removed (stall waits on it)
	timer  *time.Timer
	pacer  *pacer
}

func (f *fault) validate() error {
	switch f.Kind {
	case kindError:
		if f.Status == 0 {
			f.Status = 503
		}
		if f.Status != 500 && f.Status != 502 && f.Status != 503 {
			return fmt.Errorf("error: status must be 500, 502 or 503")
		}
		if f.Code == "" {
			f.Code = map[int]string{500: "InternalError", 503: "SlowDown"}[f.Status]
		}
		if f.Message == "" {
			f.Message = s3Messages[f.Code]
		}
	case kindRefuse:
		if f.Key != "" || len(f.Methods) > 0 || f.Start == "first" {
			return fmt.Errorf("refuse: acts on the listening socket, so it takes no key, methods or start=first")
		}
	case kindReset:
	case kindStall:
		if f.AfterBytes != nil && *f.AfterBytes < 0 {
			return fmt.Errorf("stall: after_bytes must be >= 0")
		}
	case kindThrottle:
		if f.RateBps <= 0 {
			return fmt.Errorf("throttle: rate_bps must be > 0")
		}
		f.pacer = &pacer{rate: f.RateBps}
	case kindCorrupt:
		if len(f.Offsets) == 0 && f.Every <= 0 {
			return fmt.Errorf("corrupt: give offsets or every")
		}
		if f.XOR == 0 {
			f.XOR = 0xff
		}
		if f.XOR < 0 || f.XOR > 0xff {
			return fmt.Errorf("corrupt: xor is one byte")
		}
	default:
		return fmt.Errorf("unknown kind %q (error, refuse, reset, stall, throttle, corrupt)", f.Kind)
	}
	if f.Start != "" && f.Start != "now" && f.Start != "first" {
		return fmt.Errorf("start is \"now\" or \"first\"")
	}
	if f.DurationS < 0 {
		return fmt.Errorf("duration_s must be >= 0")
	}
	if f.Key != "" {
		re, err := regexp.Compile(f.Key)
		if err != nil {
			return fmt.Errorf("key: %v", err)
		}
		f.key = re
	}
	for i, m := range f.Methods {
		f.Methods[i] = strings.ToUpper(m)
	}
	return nil
}

// s3Messages: what S3 says with each code it sends (AWS S3 error responses).
var s3Messages = map[string]string{
	"SlowDown":           "Please reduce your request rate.",
	"InternalError":      "We encountered an internal error. Please try again.",
	"ServiceUnavailable": "Reduce your request rate.",
}

func (f *fault) matches(r *http.Request) bool {
	if f.key != nil && !f.key.MatchString(r.URL.EscapedPath()) {
		return false
	}
	return len(f.Methods) == 0 || slices.Contains(f.Methods, r.Method)
}

// faults is the proxy's fault table. Every method is safe for concurrent use.
type faults struct {
	mu     sync.Mutex
	list   []*fault
	nextID int
	// onRefuse is called with true when a refuse window opens and false when
	// the last one closes (the listener is closed and re-opened); it returns
	// how many open connections it reset.
	onRefuse func(bool) int
}

func (t *faults) add(f *fault) error {
	if err := f.validate(); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.nextID++
	f.ID = t.nextID
	f.closed = make(chan struct{})
	t.list = append(t.list, f)
	if f.Start != "first" {
		t.openLocked(f, time.Now())
	}
	return nil
}

// openLocked opens f's window at now and arms its end.
func (t *faults) openLocked(f *fault, now time.Time) {
	f.Opened, f.Active = &now, true
	if f.DurationS > 0 {
		f.timer = time.AfterFunc(time.Duration(f.DurationS*float64(time.Second)), func() { t.end(f) })
	}
	if f.Kind == kindRefuse && t.refusingLocked() == 1 {
		f.Hits += int64(t.onRefuse(true))
	}
}

func (t *faults) refusingLocked() int {
	n := 0
	for _, f := range t.list {
		if f.Kind == kindRefuse && f.Active {
			n++
		}
	}
	return n
}

// end closes f's window (its time is up, or it is removed).
func (t *faults) end(f *fault) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.endLocked(f)
}

func (t *faults) endLocked(f *fault) {
	if f.timer != nil {
		f.timer.Stop()
	}
	select {
	case <-f.closed:
		return
	default:
		close(f.closed)
	}
	was := f.Active
	f.Active = false
	if f.Kind == kindRefuse && was && t.refusingLocked() == 0 {
		t.onRefuse(false)
	}
}

func (t *faults) remove(id int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, f := range t.list {
		if f.ID == id || id == 0 {
			t.endLocked(f)
			if id != 0 {
				t.list = slices.Delete(t.list, i, i+1)
				return true
			}
		}
	}
	if id == 0 {
		t.list = nil
		return true
	}
	return false
}

// active returns the faults acting on r now, opening "first" windows that r
// is the first match of, and counts a hit on each returned.
func (t *faults) active(r *http.Request) []*fault {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	var out []*fault
	for _, f := range t.list {
		if f.Kind == kindRefuse || !f.matches(r) {
			continue
		}
		if f.Opened == nil && f.Start == "first" {
			t.openLocked(f, now)
		}
		if f.Active {
			out = append(out, f)
		}
	}
	return out
}

func (t *faults) hit(f *fault) {
	t.mu.Lock()
	f.Hits++
	t.mu.Unlock()
}

// isActive says whether f's window is still open (a throttle or corrupt
// fault is looked at again for every piece of a long body).
func (f *fault) isActive() bool {
	select {
	case <-f.closed:
		return false
	default:
		return true
	}
}

func (t *faults) snapshot() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	b, _ := json.Marshal(append([]*fault{}, t.list...))
	return b
}
