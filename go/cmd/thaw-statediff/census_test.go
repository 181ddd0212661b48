package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gvisor.dev/gvisor/pkg/state"
	"gvisor.dev/gvisor/pkg/state/statefile"
)

// testNode is a savable type written by hand the way stateify generates them,
// so that the census reads what the real encoder (pkg/state.Save) writes.
type testNode struct {
	Name  string
	Next  *testNode
	Items []uint32
}

func (n *testNode) StateTypeName() string { return "thaw/statediff.testNode" }
func (n *testNode) StateFields() []string { return []string{"Name", "Next", "Items"} }
func (n *testNode) StateSave(s state.Sink) {
	s.Save(0, &n.Name)
	s.Save(1, &n.Next)
	s.Save(2, &n.Items)
}
func (n *testNode) StateLoad(_ context.Context, s state.Source) {
	s.Load(0, &n.Name)
	s.Load(1, &n.Next)
	s.Load(2, &n.Items)
}

func init() { state.Register((*testNode)(nil)) }

// chain is a list of n nodes, each with its own backing array of 3 items.
func chain(n int) *testNode {
	var head *testNode
	for i := 0; i < n; i++ {
		head = &testNode{Name: "node", Next: head, Items: []uint32{uint32(i), 2, 3}}
	}
	return head
}

// writeImage writes root as runsc writes checkpoint.img: a statefile header
// with runsc-like metadata, then state.Save's stream (two graphs, as the
// sentry saves its CPUID feature set before the kernel).
func writeImage(t *testing.T, dir string, root *testNode, compression string) string {
	t.Helper()
	path := filepath.Join(dir, "checkpoint.img")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := statefile.NewWriter(f, nil, map[string]string{"compression": compression, "runsc_version": "test"})
	if err != nil {
		t.Fatal(err)
	}
	first := &testNode{Name: "first graph"}
	if _, err := state.Save(context.Background(), w, first); err != nil {
		t.Fatal(err)
	}
	if _, err := state.Save(context.Background(), w, root); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestCensusCountsObjectsByTypeAndNamesArraysByReferrer(t *testing.T) {
	dir := t.TempDir()
	path := writeImage(t, dir, chain(4), "none")
	c, err := LoadFile(dir) // the image directory, as thaw stores it
	if err != nil {
		t.Fatal(err)
	}
	if c.Graphs != 2 || c.Metadata["runsc_version"] != "test" {
		t.Fatalf("graphs %d metadata %v", c.Graphs, c.Metadata)
	}
	if got := c.Kinds["thaw/statediff.testNode"]; got.Count != 5 || got.Bytes <= 0 {
		t.Fatalf("testNode: %+v (want 4 + the first graph's 1)", got)
	}
	// A slice's backing array has no type of its own on the wire.
	if got := c.Kinds["thaw/statediff.testNode.Items ->"]; got.Count != 4 || got.Bytes <= 0 {
		t.Fatalf("arrays: %+v in %v", got, c.Kinds)
	}
	if len(c.Kinds) != 2 {
		t.Fatalf("kinds: %v", c.Kinds)
	}
	fi, _ := os.Stat(path)
	n, b := totals(c)
	if n != c.Objects || b+c.TypeBytes >= fi.Size() {
		t.Fatalf("objects %d/%d, %d object + %d type bytes of a %d byte file", n, c.Objects, b, c.TypeBytes, fi.Size())
	}
}

func TestCompressedImageHasTheSameCensus(t *testing.T) {
	plain, err := LoadFile(writeImage(t, t.TempDir(), chain(3), "none"))
	if err != nil {
		t.Fatal(err)
	}
	flate, err := LoadFile(writeImage(t, t.TempDir(), chain(3), "flate-best-speed"))
	if err != nil {
		t.Fatal(err)
	}
	if d := Diff(plain, flate); len(d) != 0 {
		t.Fatalf("compression changed the census: %v", d)
	}
}

func TestDiffNamesWhatGrew(t *testing.T) {
	old, err := LoadFile(writeImage(t, t.TempDir(), chain(2), "none"))
	if err != nil {
		t.Fatal(err)
	}
	grown, err := LoadFile(writeImage(t, t.TempDir(), chain(5), "none"))
	if err != nil {
		t.Fatal(err)
	}
	d := Diff(old, grown)
	if len(d) != 2 {
		t.Fatalf("diff: %v", d)
	}
	for _, x := range d {
		if x.Count != 3 || x.Bytes <= 0 {
			t.Fatalf("diff: %v", d)
		}
	}
	if d := Diff(grown, grown); len(d) != 0 {
		t.Fatalf("an image differs from itself: %v", d)
	}
	var out bytes.Buffer
	if err := run(&out, []string{filepath.Dir(writeImage(t, t.TempDir(), chain(2), "none")),
		filepath.Dir(writeImage(t, t.TempDir(), chain(5), "none"))}, 0); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "objects 5 -> 11 (+6)") || !strings.Contains(out.String(), "+3") {
		t.Fatalf("printed:\n%s", out.String())
	}
}

func TestBadInputIsOneClearError(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(dir, "checkpoint.img")
	if err := os.WriteFile(junk, []byte("not a state file at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadFile(junk); err == nil || !strings.Contains(err.Error(), junk+": not a gVisor state file") {
		t.Fatalf("err %v", err)
	}
	// A valid header followed by a cut-off stream.
	good := writeImage(t, t.TempDir(), chain(3), "none")
	b, _ := os.ReadFile(good)
	if err := os.WriteFile(junk, b[:len(b)-20], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadFile(junk); err == nil || !strings.Contains(err.Error(), "malformed state stream") {
		t.Fatalf("err %v", err)
	}
	for _, args := range [][]string{nil, {"a", "b", "c"}} {
		if err := run(&bytes.Buffer{}, args, 0); err == nil || !strings.Contains(err.Error(), "usage") {
			t.Fatalf("%v: err %v", args, err)
		}
	}
	if err := runDump(&bytes.Buffer{}, []string{filepath.Join(dir, "missing")}); err == nil {
		t.Fatal("dump of a missing file succeeded")
	}
}
