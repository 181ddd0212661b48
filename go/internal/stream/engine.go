// Package stream restores a sandbox while its image is still arriving from
// the store (issue 18; docs/notes/2026-11-30-stream-restore.md has the
// measurements this design follows).
//
// Two processes of one binary (go/cmd/thaw-gofer) share the work:
//
//   - the stream (Engine, `thaw-gofer stream`): a child of thawd or of
//     `thaw restore`, so it dies with them (PDEATHSIG) and its CPU and memory
//     are not the workload's. It fetches the chunks of a plan into the files
//     of a cache partial entry, verifying each before a byte of it is
//     written, in the plan's order except that ranges a sandbox faults on
//     jump the queue; it tells every connected gofer which byte ranges are on
//     disk and verified, and once all are, fsyncs, writes the complete marker
//     and exits; the caller then installs the entry by rename.
//   - the gofer (Gofer, `runsc-checkpointgofer ... checkpointgofer`):
//     started by `runsc restore` because the image directory holds
//     gcs_opts.json (runsc/sandbox/sandbox.go
//     maybeStartCheckpointGoferAndGetSocket), it serves the sentry's reads
//     of checkpoint.img, pages_meta.img and pages.img (stateipc) from those
//     files, each read only once its bytes are verified, blocking until then
//     and failing it (EIO: the sentry kills the sandbox, the caller starts
//     cold) after a deadline or at once when the stream failed.
//
// They talk over a Unix socket, one JSON object a line:
//
//	stream -> gofer: {"have":[[FILE, OFF, LEN], ...]} {"complete":true} {"error":"..."}
//	gofer -> stream: {"want":[FILE, OFF, LEN], "fault":true}
//
// On connecting a gofer first gets everything present so far. "fault"
// marks a read the sandbox waits on out of the loader's sweep (an awaited
// page): the stream records it and reports it at the end, and the caller
// stores those ranges beside the manifest, to be fetched first next time.
package stream

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"thaw.dev/thaw/go/internal/fetch"
)

// Chunk states.
const (
	pending = iota
	bulk    // in a bulk GET
	urgent  // in an urgent GET (maybe also in a bulk one)
	done    // verified and written
)

// gapBytes: read through a hole this small in a pack rather than issue
// another GET. Twin: control/images/transfer.py GAP_BYTES.
const gapBytes = 1 << 20

// maxFaults bounds what one restore records for the learned order.
const maxFaults = 8192

type span struct {
	off, end int64
	chunk    int
}

type batch struct {
	obj        int
	start, end int64
	chunks     []int // plan indices, by offset in the object
	urgent     bool
}

// Stats is what a stream reports at the end (its "stats" line).
type Stats struct {
	Chunks         int     `json:"chunks"`
	FetchedChunks  int64   `json:"fetched_chunks"`
	FetchedBytes   int64   `json:"fetched_bytes"` // stored bytes received
	FetchedRaw     int64   `json:"fetched_raw_bytes"`
	WrittenBytes   int64   `json:"written_bytes"`
	UrgentChunks   int64   `json:"urgent_chunks"` // fetched ahead of the bulk for a waiting read
	DuplicateBytes int64   `json:"duplicate_bytes"`
	Wants          int64   `json:"wants"`
	Retries        int64   `json:"retries"`
	Peers          int64   `json:"peers"` // gofers that connected
	Seconds        float64 `json:"seconds"`
}

// Engine executes one stream plan.
type Engine struct {
	p       *Plan
	files   []*os.File
	getter  *fetch.Getter
	started time.Time
	Logf    func(format string, args ...any)

	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	cond     *sync.Cond // urgent batches or the end
	state    []uint8
	left     int
	next     int // bulk cursor into p.Chunks
	urgentQ  []batch
	have     []Extents
	spans    [][]span
	faults   [][3]int64
	failed   *fetch.Error
	complete bool
	peers    map[*peer]struct{}
	finished chan struct{} // closed when every chunk is done or the stream failed

	fetchedChunks, fetchedBytes, fetchedRaw, written, urgentChunks, dup, wants, peersSeen atomic.Int64
}

// NewEngine opens the plan's files for writing. The caller calls Run.
func NewEngine(p *Plan) (*Engine, error) {
	if err := p.Check(); err != nil {
		return nil, err
	}
	e := &Engine{p: p, started: time.Now(), Logf: func(string, ...any) {}, peers: map[*peer]struct{}{},
		finished: make(chan struct{}), state: make([]uint8, len(p.Chunks)), left: len(p.Chunks),
		have: make([]Extents, len(p.Files)), spans: make([][]span, len(p.Files))}
	e.cond = sync.NewCond(&e.mu)
	for _, f := range p.Files {
		fd, err := os.OpenFile(f.Path, os.O_WRONLY, 0)
		if err != nil {
			e.Close()
			return nil, err
		}
		e.files = append(e.files, fd)
	}
	for i, c := range p.Chunks {
		for _, pl := range c.Places {
			e.spans[pl.File] = append(e.spans[pl.File], span{pl.Off, pl.Off + int64(c.Raw), i})
		}
	}
	for f := range e.spans {
		sort.Slice(e.spans[f], func(a, b int) bool { return e.spans[f][a].off < e.spans[f][b].off })
	}
	for _, r := range p.Ready {
		e.have[r[0]].Add(r[1], r[2])
	}
	e.getter = fetch.NewGetter(p.Workers+p.UrgentWorkers, p.Retry.OrDefault(), time.Duration(p.TimeoutS*float64(time.Second)))
	return e, nil
}

// Close closes the files.
func (e *Engine) Close() {
	for _, f := range e.files {
		f.Close()
	}
}

// Listen binds the plan's socket; gofers may connect from then on.
func (e *Engine) Listen() (net.Listener, error) {
	os.Remove(e.p.Listen)
	return net.Listen("unix", e.p.Listen)
}

// Run fetches every chunk (serving gofers on l), then fsyncs the files and
// writes the complete marker. The first failure ends it.
func (e *Engine) Run(parent context.Context, l net.Listener) error {
	e.ctx, e.cancel = context.WithCancel(parent)
	defer e.cancel()
	go e.accept(l)
	var wg sync.WaitGroup
	for w := 0; w < e.p.Workers; w++ {
		wg.Add(1)
		go func() { defer wg.Done(); e.worker(false) }()
	}
	for w := 0; w < e.p.UrgentWorkers; w++ {
		wg.Add(1)
		go func() { defer wg.Done(); e.worker(true) }()
	}
	e.mu.Lock()
	if e.left == 0 {
		e.finishLocked()
	}
	e.mu.Unlock()
	select {
	case <-e.finished:
	case <-parent.Done():
		e.fail(&fetch.Error{Kind: "store", Detail: "stopped"})
	}
	e.cancel()
	e.mu.Lock()
	e.cond.Broadcast()
	e.mu.Unlock()
	wg.Wait()
	if err := e.err(); err != nil {
		return err
	}
	for i, f := range e.files {
		if err := f.Sync(); err != nil {
			return e.fail(&fetch.Error{Kind: "io", Object: e.p.Files[i].Path, Detail: "fsync: " + err.Error()})
		}
	}
	if err := writeMarker(e.p.Complete); err != nil {
		return e.fail(&fetch.Error{Kind: "io", Object: e.p.Complete, Detail: err.Error()})
	}
	e.mu.Lock()
	e.complete = true
	e.broadcastLocked(message{Complete: true})
	e.mu.Unlock()
	return nil
}

func (e *Engine) err() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.failed != nil {
		return e.failed
	}
	return nil
}

// writeMarker makes path exist, durably (write, fsync, rename, fsync the directory).
func writeMarker(path string) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := f.WriteString("complete\n"); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	f.Close()
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Stats of the run so far; Faults, the ranges gofers reported faulting on.
func (e *Engine) Stats() Stats {
	return Stats{Chunks: len(e.p.Chunks), FetchedChunks: e.fetchedChunks.Load(), FetchedBytes: e.fetchedBytes.Load(),
		FetchedRaw: e.fetchedRaw.Load(), WrittenBytes: e.written.Load(), UrgentChunks: e.urgentChunks.Load(),
		DuplicateBytes: e.dup.Load(), Wants: e.wants.Load(), Retries: e.getter.Retries.Load(),
		Peers: e.peersSeen.Load(), Seconds: time.Since(e.started).Seconds()}
}

// Faults are the ranges gofers faulted on, in the order first reported.
func (e *Engine) Faults() [][3]int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([][3]int64(nil), e.faults...)
}

// Written is the number of bytes written so far (progress).
func (e *Engine) Written() int64 { return e.written.Load() }

func (e *Engine) fail(err *fetch.Error) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.failed == nil && !e.complete {
		e.failed = err
		e.Logf("stream failed: %v", err)
		e.broadcastLocked(message{Error: err.Error()})
		e.finishLocked()
	}
	return e.failed
}

func (e *Engine) finishLocked() {
	select {
	case <-e.finished:
	default:
		close(e.finished)
	}
	e.cond.Broadcast()
}

// -- scheduling ---------------------------------------------------------------

// nextBulkLocked takes the next run of pending chunks in plan order that one
// ranged GET covers: same object, increasing offsets, holes of at most
// gapBytes, at most RangeBytes in all.
func (e *Engine) nextBulkLocked() (batch, bool) {
	cs := e.p.Chunks
	for e.next < len(cs) && e.state[e.next] != pending {
		e.next++
	}
	if e.next >= len(cs) {
		return batch{}, false
	}
	head := e.next
	first := &cs[head]
	b := batch{obj: first.Object, start: first.Offset, end: first.Offset + int64(first.Stored)}
	for k := head; k < len(cs); k++ {
		c := &cs[k]
		if k > head && (e.state[k] != pending || c.Object != b.obj || c.Offset < b.end ||
			c.Offset-b.end > gapBytes || c.Offset+int64(c.Stored)-b.start > int64(e.p.RangeBytes)) {
			break
		}
		e.state[k] = bulk
		b.chunks = append(b.chunks, k)
		b.end = c.Offset + int64(c.Stored)
		e.next = k + 1
	}
	return b, true
}

// Want asks for [off, off+n) of file ahead of the bulk order (plus
// UrgentAheadBytes after it: faults come in runs); with fault, the range is
// also recorded for the learned order.
func (e *Engine) Want(file int, off, n int64, fault bool) {
	if file < 0 || file >= len(e.p.Files) || off < 0 || n <= 0 {
		return
	}
	e.wants.Add(1)
	e.mu.Lock()
	defer e.mu.Unlock()
	if fault && len(e.faults) < maxFaults {
		e.faults = append(e.faults, [3]int64{int64(file), off, n})
	}
	end := min(off+n+e.p.UrgentAheadBytes, e.p.Files[file].Size)
	sp := e.spans[file]
	var idx []int
	for i := sort.Search(len(sp), func(i int) bool { return sp[i].end > off }); i < len(sp) && sp[i].off < end; i++ {
		if s := e.state[sp[i].chunk]; s == pending || s == bulk {
			e.state[sp[i].chunk] = urgent
			idx = append(idx, sp[i].chunk)
		}
	}
	if len(idx) == 0 {
		return
	}
	cs := e.p.Chunks
	sort.Slice(idx, func(a, b int) bool {
		ca, cb := &cs[idx[a]], &cs[idx[b]]
		return ca.Object < cb.Object || ca.Object == cb.Object && ca.Offset < cb.Offset
	})
	var b *batch
	for _, k := range idx {
		c := &cs[k]
		if b == nil || c.Object != b.obj || c.Offset < b.end || c.Offset-b.end > gapBytes ||
			c.Offset+int64(c.Stored)-b.start > int64(e.p.RangeBytes) {
			e.urgentQ = append(e.urgentQ, batch{obj: c.Object, start: c.Offset, urgent: true})
			b = &e.urgentQ[len(e.urgentQ)-1]
		}
		b.chunks = append(b.chunks, k)
		b.end = c.Offset + int64(c.Stored)
	}
	e.cond.Broadcast()
}

func (e *Engine) worker(isUrgent bool) {
	var buf []byte
	v := &fetch.Verifier{}
	for {
		e.mu.Lock()
		var b batch
		ok := false
		// Bulk workers keep to the plan's order (a flood of wants must not
		// turn the whole stream into small GETs); urgent workers serve wants,
		// and once the bulk order is all handed out, bulk workers help them.
		for e.ctx.Err() == nil && e.failed == nil && e.left > 0 {
			if !isUrgent {
				if b, ok = e.nextBulkLocked(); ok {
					break
				}
			}
			if len(e.urgentQ) > 0 {
				b, ok = e.urgentQ[0], true
				e.urgentQ = e.urgentQ[1:]
				break
			}
			e.cond.Wait()
		}
		e.mu.Unlock()
		if !ok {
			return
		}
		if n := int(b.end - b.start); cap(buf) < n {
			buf = make([]byte, max(n, e.p.RangeBytes))
		}
		if err := e.run(b, buf[:b.end-b.start], v); err != nil {
			var fe *fetch.Error
			if !errors.As(err, &fe) {
				fe = &fetch.Error{Kind: "io", Detail: err.Error()}
			}
			if e.ctx.Err() == nil {
				e.fail(fe)
			}
			return
		}
	}
}

// run GETs one batch and uses each chunk as soon as its bytes are in.
func (e *Engine) run(b batch, body []byte, v *fetch.Verifier) error {
	obj := e.p.Objects[b.obj]
	next := 0
	use := func(have int) error {
		for ; next < len(b.chunks); next++ {
			k := b.chunks[next]
			c := &e.p.Chunks[k]
			pos := int(c.Offset - b.start)
			if pos+c.Stored > have {
				return nil
			}
			if e.isDone(k) { // the other queue got it first
				e.dup.Add(int64(c.Stored))
				continue
			}
			data, err := v.Open(&c.Chunk, body[pos:pos+c.Stored], obj.Name, c.Offset)
			if err != nil {
				return err
			}
			for _, pl := range c.Places {
				if _, err := e.files[pl.File].WriteAt(data, pl.Off); err != nil {
					return &fetch.Error{Kind: "io", Object: e.p.Files[pl.File].Path, Offset: pl.Off, Length: len(data),
						Detail: err.Error()}
				}
				e.written.Add(int64(len(data)))
			}
			e.fetchedChunks.Add(1)
			e.fetchedBytes.Add(int64(c.Stored))
			e.fetchedRaw.Add(int64(c.Raw))
			if b.urgent {
				e.urgentChunks.Add(1)
			}
			e.markDone(k)
		}
		return nil
	}
	if err := e.getter.GetInto(e.ctx, obj.URL, obj.Name, b.start, body, use); err != nil {
		return err
	}
	return use(len(body))
}

func (e *Engine) isDone(k int) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.state[k] == done
}

func (e *Engine) markDone(k int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state[k] == done {
		return
	}
	e.state[k] = done
	c := &e.p.Chunks[k]
	have := make([][3]int64, 0, len(c.Places))
	for _, pl := range c.Places {
		e.have[pl.File].Add(pl.Off, int64(c.Raw))
		have = append(have, [3]int64{int64(pl.File), pl.Off, int64(c.Raw)})
	}
	e.broadcastLocked(message{Have: have})
	e.left--
	if e.left == 0 {
		e.finishLocked()
	}
}

// -- gofers -----------------------------------------------------------------------

type message struct {
	Have     [][3]int64 `json:"have,omitempty"`
	Complete bool       `json:"complete,omitempty"`
	Error    string     `json:"error,omitempty"`
	Want     *[3]int64  `json:"want,omitempty"`
	Fault    bool       `json:"fault,omitempty"`
}

type peer struct {
	conn   net.Conn
	mu     sync.Mutex
	cond   *sync.Cond
	out    [][]byte
	closed bool
}

func (e *Engine) accept(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		e.peersSeen.Add(1)
		p := &peer{conn: c}
		p.cond = sync.NewCond(&p.mu)
		e.mu.Lock()
		// Everything present so far, then every change: under e.mu, so
		// nothing falls between the snapshot and the first update.
		var snap [][3]int64
		for f := range e.have {
			for _, r := range e.have[f].List() {
				snap = append(snap, [3]int64{int64(f), r[0], r[1]})
			}
		}
		p.send(message{Have: snap})
		switch {
		case e.complete:
			p.send(message{Complete: true})
		case e.failed != nil:
			p.send(message{Error: e.failed.Error()})
		}
		e.peers[p] = struct{}{}
		e.mu.Unlock()
		go p.write()
		go e.read(p)
	}
}

func (e *Engine) broadcastLocked(m message) {
	for p := range e.peers {
		p.send(m)
	}
}

func (p *peer) send(m message) {
	b, _ := json.Marshal(m)
	p.mu.Lock()
	p.out = append(p.out, append(b, '\n'))
	p.cond.Signal()
	p.mu.Unlock()
}

func (p *peer) write() {
	w := bufio.NewWriter(p.conn)
	for {
		p.mu.Lock()
		for len(p.out) == 0 && !p.closed {
			p.cond.Wait()
		}
		out := p.out
		p.out = nil
		closed := p.closed
		p.mu.Unlock()
		for _, b := range out {
			w.Write(b)
		}
		if w.Flush() != nil || closed {
			p.conn.Close()
			return
		}
	}
}

func (e *Engine) read(p *peer) {
	defer func() {
		e.mu.Lock()
		delete(e.peers, p)
		e.mu.Unlock()
		p.mu.Lock()
		p.closed = true
		p.cond.Signal()
		p.mu.Unlock()
	}()
	sc := bufio.NewScanner(p.conn)
	for sc.Scan() {
		var m message
		if json.Unmarshal(sc.Bytes(), &m) != nil || m.Want == nil {
			continue
		}
		e.Want(int(m.Want[0]), m.Want[1], m.Want[2], m.Fault)
	}
}

// CompleteMarker tells whether a stream wrote its complete marker at path.
func CompleteMarker(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}
