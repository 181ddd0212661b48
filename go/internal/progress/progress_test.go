package progress

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestTickerReportsChangesAndEndsWithTheWhole(t *testing.T) {
	var buf bytes.Buffer
	l := NewLines(&buf)
	var n atomic.Int64
	stop := l.Ticker(5*time.Millisecond, n.Load)
	for i := 0; i < 5; i++ {
		n.Add(10)
		time.Sleep(15 * time.Millisecond)
	}
	time.Sleep(30 * time.Millisecond) // unchanged: no more lines
	before := strings.Count(buf.String(), "\n")
	time.Sleep(30 * time.Millisecond)
	if after := strings.Count(buf.String(), "\n"); after != before {
		t.Fatalf("lines while the count did not change: %d -> %d", before, after)
	}
	stop()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) < 3 {
		t.Fatalf("too few progress lines: %q", lines)
	}
	last := -1.0
	for _, line := range lines {
		var m map[string]float64
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if m["done"] < last {
			t.Fatalf("done went backwards: %q", lines)
		}
		last = m["done"]
	}
	if last != 50 {
		t.Fatalf("the last line is not the whole: %v", last)
	}
}
