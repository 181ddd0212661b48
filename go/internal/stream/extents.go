package stream

import "sort"

// Extents is a set of byte ranges of one file, kept merged and sorted. Both
// sides of a stream keep one per file: the fetcher for what it has written
// and verified, the gofer for what it was told of. Not safe for concurrent use.
type Extents struct {
	r [][2]int64 // [start, end), sorted, disjoint, not touching
}

// Add marks [off, off+n) present.
func (e *Extents) Add(off, n int64) {
	if n <= 0 {
		return
	}
	end := off + n
	// Fast path: the stream mostly arrives in order.
	if k := len(e.r); k == 0 || e.r[k-1][1] < off {
		e.r = append(e.r, [2]int64{off, end})
		return
	} else if e.r[k-1][0] <= off {
		e.r[k-1][1] = max(e.r[k-1][1], end)
		return
	}
	// First range that ends at or after off (it may touch or overlap).
	i := sort.Search(len(e.r), func(i int) bool { return e.r[i][1] >= off })
	j := i
	for j < len(e.r) && e.r[j][0] <= end {
		off = min(off, e.r[j][0])
		end = max(end, e.r[j][1])
		j++
	}
	e.r = append(e.r[:i], append([][2]int64{{off, end}}, e.r[j:]...)...)
}

// Covers tells whether every byte of [off, off+n) is present.
func (e *Extents) Covers(off, n int64) bool {
	if n <= 0 {
		return true
	}
	i := sort.Search(len(e.r), func(i int) bool { return e.r[i][1] > off })
	return i < len(e.r) && e.r[i][0] <= off && e.r[i][1] >= off+n
}

// Bytes is the number of bytes present.
func (e *Extents) Bytes() int64 {
	var t int64
	for _, x := range e.r {
		t += x[1] - x[0]
	}
	return t
}

// List is the merged ranges as [start, length] pairs.
func (e *Extents) List() [][2]int64 {
	out := make([][2]int64, len(e.r))
	for i, x := range e.r {
		out[i] = [2]int64{x[0], x[1] - x[0]}
	}
	return out
}
