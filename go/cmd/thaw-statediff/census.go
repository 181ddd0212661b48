package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"gvisor.dev/gvisor/pkg/state"
	"gvisor.dev/gvisor/pkg/state/statefile"
	"gvisor.dev/gvisor/pkg/state/wire"
)

// Row is one kind of object in a state stream: how many and their encoded bytes.
type Row struct {
	Count int
	Bytes int64
}

// Census is a state file's objects by kind. A struct is its type's registered
// name ("pkg/sentry/kernel.Task"); an object with no type of its own on the
// wire (a slice's backing array, a map, a pointed-to int) is named after its
// elements' type when those are structs ("[]pkg/sentry/mm.vmaFlatSegment"),
// else after a struct field that points to it, the referrer with the lowest
// object id ("pkg/tcpip/stack.Stack.resumableEndpoints ->").
type Census struct {
	Kinds     map[string]Row
	Graphs    int   // state.Save calls in the stream (two at the pin: CPUID features, then the kernel)
	Objects   int   // all objects in all graphs
	RawBytes  int64 // non-object data (headers with the object flag clear)
	Types     int   // type descriptions (each graph has its own table)
	TypeBytes int64
	Metadata  map[string]string
}

// countingReader counts what the wire decoder consumes, so that an object's
// size is the stream offset after it minus before it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// LoadFile reads the census of a runsc checkpoint image: checkpoint.img
// itself or the image directory that holds it. The image must be unencrypted
// (runsc writes it so unless given a key); compressed or not, the statefile
// layer undoes it.
func LoadFile(path string) (*Census, error) {
	r, err := openStream(path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	c, err := Read(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.path, err)
	}
	c.Metadata = r.meta
	return c, nil
}

// stream is a statefile's state stream, its header read.
type stream struct {
	io.Reader
	f    *os.File
	path string
	meta map[string]string
}

func (s *stream) Close() error { return s.f.Close() }

func openStream(path string) (*stream, error) {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		path = filepath.Join(path, "checkpoint.img")
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	r, meta, err := statefile.NewReader(f, nil)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: not a gVisor state file: %w", path, err)
	}
	return &stream{Reader: r, f: f, path: path, meta: meta}, nil
}

type object struct {
	obj   wire.Object
	bytes int64
}

// graph is one state.Save's output: its type table and its objects by id.
type graph struct {
	types   []*wire.Type // type id i+1 is types[i]
	objects map[uint64]object
}

// Read decodes a state stream (what follows a statefile's header) into a census.
// It follows pkg/state/pretty's reading loop at the pin.
func Read(r io.Reader) (c *Census, err error) {
	cr := &countingReader{r: r}
	wr := &wire.Reader{Reader: cr}
	c = &Census{Kinds: map[string]Row{}}
	defer func() {
		// wire panics on malformed input (its error control flow).
		if p := recover(); p != nil {
			c, err = nil, fmt.Errorf("malformed state stream at byte %d: %v", cr.n, p)
		}
	}()
	for {
		length, isObject, err := state.ReadHeader(wr)
		if errors.Is(err, io.EOF) {
			return c, nil
		}
		if err != nil {
			return nil, err
		}
		if !isObject {
			c.RawBytes += int64(length)
			if _, err := io.CopyN(io.Discard, cr, int64(length)); err != nil {
				return nil, fmt.Errorf("non-object data: %w", err)
			}
			continue
		}
		g := &graph{objects: map[uint64]object{}}
		for i := uint64(0); i < length; {
			start := cr.n
			switch x := wire.Load(wr).(type) {
			case *wire.Type:
				g.types = append(g.types, x)
				c.Types++
				c.TypeBytes += cr.n - start
			case wire.Uint:
				start = cr.n
				o := wire.Load(wr)
				g.objects[uint64(x)] = object{obj: o, bytes: cr.n - start}
				i++
			default:
				return nil, fmt.Errorf("wanted a type or an object id, got %T", x)
			}
		}
		c.Graphs++
		c.Objects += len(g.objects)
		for id, name := range g.names() {
			row := c.Kinds[name]
			row.Count++
			row.Bytes += g.objects[id].bytes
			c.Kinds[name] = row
		}
	}
}

func (g *graph) typeName(id wire.TypeID) string {
	if id >= 1 && int(id) <= len(g.types) {
		return g.types[id-1].Name
	}
	return fmt.Sprintf("type#%d", id)
}

// names gives every object of the graph its kind (see Census).
func (g *graph) names() map[uint64]string {
	names := make(map[uint64]string, len(g.objects))
	for id, o := range g.objects {
		switch x := o.obj.(type) {
		case *wire.Struct:
			names[id] = g.typeName(x.TypeID)
		case *wire.Array:
			if len(x.Contents) > 0 {
				if s, ok := x.Contents[0].(*wire.Struct); ok {
					names[id] = "[]" + g.typeName(s.TypeID)
				}
			}
		}
	}
	// Untyped objects take the name of a named referrer; repeat so that a
	// chain (a map's array of pointers to arrays) is named from its head.
	// Ids are visited in order so that the name is the same run to run.
	ids := make([]uint64, 0, len(g.objects))
	for id := range g.objects {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for changed := true; changed; {
		changed = false
		for _, id := range ids {
			owner, ok := names[id]
			if !ok {
				continue
			}
			g.refs(g.objects[id].obj, func(field string, root uint64) {
				if _, named := names[root]; !named && root != 0 {
					if _, exists := g.objects[root]; exists {
						names[root] = referrerName(owner, field)
						changed = true
					}
				}
			})
		}
	}
	for _, id := range ids {
		if _, ok := names[id]; !ok {
			names[id] = fmt.Sprintf("(unreferenced %T)", g.objects[id].obj)
		}
	}
	return names
}

func referrerName(owner, field string) string {
	if strings.HasSuffix(owner, " ->") || field == "" {
		return strings.TrimSuffix(owner, " ->") + " ->" // a chain keeps its head's name
	}
	return owner + "." + field + " ->"
}

// refs calls f for every reference inside o, with the name of the field of o
// it sits under ("" when o is not a struct).
func (g *graph) refs(o wire.Object, f func(field string, root uint64)) {
	s, ok := o.(*wire.Struct)
	if !ok {
		walkRefs(o, func(root uint64) { f("", root) })
		return
	}
	var fields []string
	if s.TypeID >= 1 && int(s.TypeID) <= len(g.types) {
		fields = g.types[s.TypeID-1].Fields
	}
	for i := 0; i < s.Fields(); i++ {
		name := fmt.Sprint(i)
		if i < len(fields) {
			name = fields[i]
		}
		walkRefs(*s.Field(i), func(root uint64) { f(name, root) })
	}
}

// walkRefs calls f for the root of every reference inside o.
func walkRefs(o wire.Object, f func(root uint64)) {
	switch x := o.(type) {
	case *wire.Ref:
		f(uint64(x.Root))
	case *wire.Slice:
		f(uint64(x.Ref.Root))
	case *wire.Array:
		for _, e := range x.Contents {
			walkRefs(e, f)
		}
	case *wire.Map:
		for i := range x.Keys {
			walkRefs(x.Keys[i], f)
			walkRefs(x.Values[i], f)
		}
	case *wire.Interface:
		walkRefs(x.Value, f)
	case *wire.Struct:
		for i := 0; i < x.Fields(); i++ {
			walkRefs(*x.Field(i), f)
		}
	}
}
