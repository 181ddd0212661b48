package main

import (
	"bytes"
	"fmt"
	"testing"
)

func TestTailKeepsTheLastBytesAndCountsTheRest(t *testing.T) {
	var all []byte
	tl := tail{max: 1000}
	for i := 0; i < 3000; i++ {
		p := []byte(fmt.Sprintf("%d,", i)) // chunks of 2 to 5 bytes
		if i%700 == 0 {
			p = bytes.Repeat([]byte{byte('a' + i%26)}, 1500) // one larger than the bound
		}
		tl.write(p)
		all = append(all, p...)
		want := all[max(0, len(all)-1000):]
		if !bytes.Equal(tl.bytes(), want) {
			t.Fatalf("after %d writes: kept %d bytes, not the last %d", i, len(tl.bytes()), len(want))
		}
		if tl.dropped != int64(len(all)-len(want)) {
			t.Fatalf("after %d writes: dropped %d, want %d", i, tl.dropped, len(all)-len(want))
		}
		if cap(tl.buf) > 2*tl.max {
			t.Fatalf("array of %d bytes for a bound of %d", cap(tl.buf), tl.max)
		}
	}
}

func TestATailOfZeroKeepsNothing(t *testing.T) {
	tl := tail{max: 0}
	tl.write([]byte("abc"))
	tl.write([]byte("de"))
	if len(tl.bytes()) != 0 || tl.dropped != 5 {
		t.Fatalf("kept %q, dropped %d", tl.bytes(), tl.dropped)
	}
}
