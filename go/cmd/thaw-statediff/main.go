// Command thaw-statediff is a dev tool that counts the objects in a runsc
// checkpoint's saved kernel state (checkpoint.img, gVisor's pkg/state
// stream) by Go type, and diffs two such counts: which types a later image
// has more of, and how many encoded bytes they take. It was written to find
// what grows when a restored sandbox is checkpointed again, generation after
// generation (docs/gvisor-notes.md, "Chained checkpoints").
//
// Usage:
//
//	thaw-statediff [-top N] IMAGE          objects of one image by type, most bytes first
//	thaw-statediff [-top N] OLD NEW        the types whose count or bytes differ, largest change first
//	thaw-statediff -dump IMAGE             every object, as gVisor's pkg/state/pretty prints them
//
// IMAGE is a checkpoint.img or the image directory holding it, written by the
// pinned runsc without an encryption key (thaw never gives one); compression
// is undone by the statefile reader. On failure prints the error and exits 1.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"sort"

	"gvisor.dev/gvisor/pkg/state/pretty"
)

func main() {
	top := flag.Int("top", 40, "print at most this many types (0: all)")
	dump := flag.Bool("dump", false, "print every object of IMAGE (pkg/state/pretty's text)")
	flag.Parse()
	var err error
	if *dump {
		err = runDump(os.Stdout, flag.Args())
	} else {
		err = run(os.Stdout, flag.Args(), *top)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "thaw-statediff: %v\n", err)
		os.Exit(1)
	}
}

func run(w io.Writer, args []string, top int) error {
	if len(args) < 1 || len(args) > 2 {
		return fmt.Errorf("usage: thaw-statediff [-top N] IMAGE | OLD NEW")
	}
	cs := make([]*Census, len(args))
	for i, a := range args {
		c, err := LoadFile(a)
		if err != nil {
			return err
		}
		cs[i] = c
	}
	if len(cs) == 1 {
		printCensus(w, cs[0], top)
	} else {
		printDiff(w, cs[0], cs[1], top)
	}
	return nil
}

func totals(c *Census) (count int, bytes int64) {
	for _, r := range c.Kinds {
		count += r.Count
		bytes += r.Bytes
	}
	return count, bytes
}

func printCensus(w io.Writer, c *Census, top int) {
	n, b := totals(c)
	fmt.Fprintf(w, "%d graphs, %d objects, %d object bytes, %d types, %d type bytes, %d raw bytes\n",
		c.Graphs, n, b, c.Types, c.TypeBytes, c.RawBytes)
	kinds := make([]string, 0, len(c.Kinds))
	for k := range c.Kinds {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool {
		a, b := c.Kinds[kinds[i]], c.Kinds[kinds[j]]
		if a.Bytes != b.Bytes {
			return a.Bytes > b.Bytes
		}
		return kinds[i] < kinds[j]
	})
	fmt.Fprintf(w, "%8s %10s  %s\n", "count", "bytes", "type")
	for i, k := range kinds {
		if top > 0 && i == top {
			fmt.Fprintf(w, "... %d more types\n", len(kinds)-top)
			break
		}
		fmt.Fprintf(w, "%8d %10d  %s\n", c.Kinds[k].Count, c.Kinds[k].Bytes, k)
	}
}

// Delta is one type's change from an old census to a new one.
type Delta struct {
	Kind  string
	Count int
	Bytes int64
}

// Diff gives the types whose count or bytes differ, the largest byte change
// (either way) first.
func Diff(old, new *Census) []Delta {
	var out []Delta
	seen := map[string]bool{}
	for _, c := range []*Census{old, new} {
		for k := range c.Kinds {
			if seen[k] {
				continue
			}
			seen[k] = true
			d := Delta{k, new.Kinds[k].Count - old.Kinds[k].Count, new.Kinds[k].Bytes - old.Kinds[k].Bytes}
			if d.Count != 0 || d.Bytes != 0 {
				out = append(out, d)
			}
		}
	}
	abs := func(x int64) int64 {
		if x < 0 {
			return -x
		}
		return x
	}
	sort.Slice(out, func(i, j int) bool {
		if abs(out[i].Bytes) != abs(out[j].Bytes) {
			return abs(out[i].Bytes) > abs(out[j].Bytes)
		}
		return out[i].Kind < out[j].Kind
	})
	return out
}

func printDiff(w io.Writer, old, new *Census, top int) {
	on, ob := totals(old)
	nn, nb := totals(new)
	fmt.Fprintf(w, "objects %d -> %d (%+d), object bytes %d -> %d (%+d), types %d -> %d, type bytes %d -> %d (%+d)\n",
		on, nn, nn-on, ob, nb, nb-ob, old.Types, new.Types, old.TypeBytes, new.TypeBytes, new.TypeBytes-old.TypeBytes)
	fmt.Fprintf(w, "%8s %10s  %s\n", "Δcount", "Δbytes", "type")
	for i, d := range Diff(old, new) {
		if top > 0 && i == top {
			fmt.Fprintf(w, "... more\n")
			break
		}
		fmt.Fprintf(w, "%+8d %+10d  %s\n", d.Count, d.Bytes, d.Kind)
	}
}

func runDump(w io.Writer, args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: thaw-statediff -dump IMAGE")
	}
	r, err := openStream(args[0])
	if err != nil {
		return err
	}
	defer r.Close()
	return pretty.PrintText(w, r)
}
