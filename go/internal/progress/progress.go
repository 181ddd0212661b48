// Package progress writes what thaw's Go helpers tell their Python caller on
// stdout: one JSON object a line, each flushed at once, and the bytes done so
// far at most every 100 ms. thaw-fetch (control/images/transfer.py reads it)
// and thaw-gofer stream (control/images/stream.py) answer this way.
package progress

import (
	"bufio"
	"encoding/json"
	"io"
	"sync"
	"time"
)

// Every is how often a Ticker reports; twin: control/images/transfer.py and
// control/images/stream.py read "done" lines as they come, at any rate.
const Every = 100 * time.Millisecond

// Lines writes JSON lines; safe for concurrent use.
type Lines struct {
	mu sync.Mutex
	w  *bufio.Writer
}

// NewLines writes to w.
func NewLines(w io.Writer) *Lines { return &Lines{w: bufio.NewWriter(w)} }

// Emit writes v as one line and flushes it.
func (l *Lines) Emit(v any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, _ := json.Marshal(v)
	l.w.Write(append(b, '\n'))
	l.w.Flush()
}

// Ticker emits {"done": done()} every `every` while the count changes, until
// the returned stop is called; stop waits for the ticker to end and emits the
// final count once more, so the last "done" line is always the whole.
func (l *Lines) Ticker(every time.Duration, done func() int64) (stop func()) {
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		last := int64(-1)
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				if d := done(); d != last {
					last = d
					l.Emit(map[string]any{"done": d})
				}
			}
		}
	}()
	return func() {
		close(quit)
		wg.Wait()
		l.Emit(map[string]any{"done": done()})
	}
}
