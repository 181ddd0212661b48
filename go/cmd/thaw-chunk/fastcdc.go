package main

import (
	"fmt"
	"math/bits"
	"unsafe"
)

// Algorithm names the chunker's output: the gear table below, the masks and
// the cut rule. Changing any of them changes every chunk boundary (and so
// ends dedup against images packed before): bump the name then.
// Twin: control/images/chunk.py ALGORITHM and its reference implementation (_gear).
const Algorithm = "fastcdc-gear-v1"

// gearSeed seeds the splitmix64 generator that fills the gear table.
// Twin: control/images/chunk.py _GEAR_SEED.
const gearSeed uint64 = 0x7468617763646331 // "thawcdc1"

var gear [256]uint64

func init() {
	s := gearSeed
	for i := range gear {
		s += 0x9E3779B97F4A7C15
		z := s
		z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
		z = (z ^ (z >> 27)) * 0x94D049BB133111EB
		gear[i] = z ^ (z >> 31)
	}
}

// Params of FastCDC with normalized chunking, level 2 (Xia et al., USENIX
// ATC '16): a stricter mask (more bits) before the average size, a looser one
// after, which narrows the size distribution around Avg.
type Params struct {
	Min, Avg, Max int
	maskS, maskL  uint64
}

func NewParams(min, avg, max int) (Params, error) {
	if avg <= 0 || avg&(avg-1) != 0 {
		return Params{}, fmt.Errorf("-avg %d: must be a power of two", avg)
	}
	if min < 64 || min > avg || avg > max {
		return Params{}, fmt.Errorf("need 64 <= min <= avg <= max, got %d %d %d", min, avg, max)
	}
	b := bits.TrailingZeros(uint(avg))
	if b < 4 || b > 40 {
		return Params{}, fmt.Errorf("-avg %d: out of range", avg)
	}
	return Params{Min: min, Avg: avg, Max: max, maskS: topBits(b + 2), maskL: topBits(b - 2)}, nil
}

// topBits: a mask of the n highest bits. A gear hash's high bits depend on
// the last 64 bytes; its low bits only on the last few.
func topBits(n int) uint64 { return ^uint64(0) << (64 - n) }

// Cut returns the length of the next chunk at the start of data.
func (p Params) Cut(data []byte) int {
	n := len(data)
	if n <= p.Min {
		return n
	}
	if n > p.Max {
		n = p.Max
	}
	normal := p.Avg
	if n < normal {
		normal = n
	}
	var h uint64
	i := p.Min
	for ; i < normal; i++ {
		h = (h << 1) + gear[data[i]]
		if h&p.maskS == 0 {
			return i + 1
		}
	}
	for ; i < n; i++ {
		h = (h << 1) + gear[data[i]]
		if h&p.maskL == 0 {
			return i + 1
		}
	}
	return n
}

func unsafePointer(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }
