package main

import (
	"sync"
	"time"
)

// pacer spreads bytes over time at rate bytes/s, shared by every response a
// throttle fault matches (a link, not a per-connection limit). It schedules
// rather than sleeps per piece: each reservation is placed right after the
// previous one on a virtual timeline, so a sleep that overshoots (Go's timers
// wake tens of microseconds to a millisecond late) is paid back by the next
// pieces going out at once, and the long-run rate stays exact. Credit left by
// an idle link is capped at burst, so a new response does not start with a
// burst of saved-up bytes; 20 ms keeps the rate within 1 % over a second
// while absorbing scheduling delays (with 2 ms, runs on this 2-core VM with
// busy cores fell 6-15 % short at 1 GB/s).
type pacer struct {
	mu   sync.Mutex
	rate float64   // bytes/s
	next time.Time // when the link is free again on the virtual timeline
}

const burst = 20 * time.Millisecond

// wait blocks until n more bytes may go out; it returns at once when done is closed.
func (p *pacer) wait(n int, done <-chan struct{}) {
	p.mu.Lock()
	now := time.Now()
	if p.next.Before(now.Add(-burst)) {
		p.next = now.Add(-burst)
	}
	at := p.next
	p.next = p.next.Add(time.Duration(float64(n) / p.rate * float64(time.Second)))
	p.mu.Unlock()
	if d := time.Until(at); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-done:
		}
	}
}

// piece is how many bytes to write between waits at rate: about 1 ms worth,
// between 4 KiB and 256 KiB.
func piece(rate float64) int {
	return min(256<<10, max(4<<10, int(rate/1000)))
}
