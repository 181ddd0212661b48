package stream

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/sentry/memmap"
	"gvisor.dev/gvisor/pkg/sentry/state/stateio"
)

// GoferConfigVersion is the gcs_opts.json format (2: verify and corrupt, for
// a cache entry served with every chunk checked, verify.go). Twin:
// control/images/stream.py GOFER_CONFIG_VERSION.
const GoferConfigVersion = 2

// GoferConfig is gcs_opts.json, which control/images/stream.py writes into
// the directory `runsc restore --image-path` names; runsc hands it to the
// gofer unread as an FD (its content is opaque to runsc).
type GoferConfig struct {
	Version int    `json:"version"`
	Socket  string `json:"socket"`   // the stream's Unix socket
	Done    string `json:"complete"` // the stream's complete marker
	// Files, indexed as in the stream's plan. Paths are hard links of the
	// partial entry's files in the image directory, valid across the
	// entry's install by rename.
	Files []GoferFile `json:"files"`
	// DeadlineS: a read whose bytes have not arrived after this long fails
	// (EIO); the sentry then kills the sandbox and the caller starts cold.
	DeadlineS float64 `json:"deadline_s"`
	// BoostS: a sweep read still waiting after this long is asked for
	// ahead of the bulk order like a fault (but not recorded as one).
	BoostS       float64 `json:"boost_s"`
	MaxParallel  int     `json:"max_parallel"`   // reads the sentry may have in flight per file
	MaxReadBytes uint64  `json:"max_read_bytes"` // largest read
	Log          string  `json:"log"`            // where the gofer logs (appended), or ""
	// Verify: the entry's manifest; every chunk it names is checked against
	// its SHA-256 as reads touch it (verify.go). Without Socket the files are
	// complete already (a cache entry, not a stream).
	Verify  string `json:"verify,omitempty"`
	Corrupt string `json:"corrupt,omitempty"` // where the first bad chunk is reported (CorruptReport)
}

// GoferFile is one file the gofer serves.
type GoferFile struct {
	Name  string `json:"name"` // checkpoint.img, pages_meta.img, pages.img
	Path  string `json:"path"`
	Size  int64  `json:"size"`
	Pages bool   `json:"pages"` // pages.img: classify reads into the loader's sweep and faults
}

// ReadGoferConfig parses and checks gcs_opts.json.
func ReadGoferConfig(r io.Reader) (*GoferConfig, error) {
	var c GoferConfig
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("gcs_opts.json: %v", err)
	}
	if c.Version != GoferConfigVersion {
		return nil, fmt.Errorf("gcs_opts.json version %d, this thaw-gofer reads %d", c.Version, GoferConfigVersion)
	}
	if (c.Verify == "" && (c.Socket == "" || c.Done == "")) || len(c.Files) == 0 || c.DeadlineS <= 0 ||
		c.MaxParallel < 1 || c.MaxParallel > 4096 || c.MaxReadBytes < 4096 {
		return nil, fmt.Errorf("gcs_opts.json: socket and complete (or verify), files, deadline_s > 0, " +
			"max_parallel 1..4096 and max_read_bytes >= 4096 are required")
	}
	return &c, nil
}

var errStreamFailed = errors.New("the stream failed")

// Gofer serves an image's files to the sentry (stateipc.AsyncFileServerImpl).
type Gofer struct {
	cfg     *GoferConfig
	fds     []*os.File
	started time.Time
	logMu   sync.Mutex
	logw    io.Writer

	mu       sync.Mutex
	have     []Extents
	complete bool
	failed   string
	waiters  map[*waiter]struct{}

	connMu sync.Mutex
	conn   net.Conn

	reads, readBytes, waited, faults, boosts, failures atomic.Int64
	waitNs, maxWaitNs                                  atomic.Int64

	tables                      []*chunkTable // verify mode: each file's chunks (verify.go); nil otherwise
	reported                    atomic.Bool
	checkedChunks, checkedBytes atomic.Int64
}

type waiter struct {
	file   int
	off, n int64
	ch     chan struct{}
	woken  bool
}

// NewGofer opens the files and connects to the stream. A stream that cannot
// be reached counts as complete only if its marker says so; otherwise every
// read of data not known present fails at once.
func NewGofer(cfg *GoferConfig) (*Gofer, error) {
	g := &Gofer{cfg: cfg, started: time.Now(), have: make([]Extents, len(cfg.Files)), waiters: map[*waiter]struct{}{},
		logw: io.Discard}
	if cfg.Log != "" {
		if f, err := os.OpenFile(cfg.Log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600); err == nil {
			g.logw = f
		}
	}
	for _, f := range cfg.Files {
		fd, err := os.Open(f.Path)
		if err != nil {
			g.Destroy()
			return nil, err
		}
		if st, err := fd.Stat(); err != nil || st.Size() != f.Size {
			g.Destroy()
			return nil, fmt.Errorf("%s: not %d bytes", f.Path, f.Size)
		}
		g.fds = append(g.fds, fd)
	}
	if cfg.Verify != "" {
		t0 := time.Now()
		t, err := loadChunkTables(cfg.Verify, cfg.Files)
		if err != nil {
			g.Destroy()
			return nil, err
		}
		g.tables = t
		n := 0
		for _, x := range t {
			n += len(x.sums)
		}
		// Before the sentry's first read: a cost every verified restore pays up front.
		g.logf("verify: %d chunks of %d files loaded in %.3f s; reads %d x %d KiB", n, len(t),
			time.Since(t0).Seconds(), cfg.MaxParallel, cfg.MaxReadBytes>>10)
	}
	if cfg.Socket == "" { // a cache entry: everything is on disk (each chunk checked as it is read)
		g.complete = true
		return g, nil
	}
	conn, err := net.Dial("unix", cfg.Socket)
	if err != nil {
		if CompleteMarker(cfg.Done) {
			g.logf("stream already complete (%v)", err)
			g.complete = true
		} else {
			g.logf("stream unreachable and not complete: %v", err)
			g.failed = "stream unreachable: " + err.Error()
		}
		return g, nil
	}
	g.conn = conn
	go g.listen(conn)
	return g, nil
}

func (g *Gofer) logf(format string, args ...any) {
	g.logMu.Lock()
	defer g.logMu.Unlock()
	fmt.Fprintf(g.logw, "%8.3f %s\n", time.Since(g.started).Seconds(), fmt.Sprintf(format, args...))
}

// listen applies the stream's messages until it goes away.
func (g *Gofer) listen(conn net.Conn) {
	sc := bufio.NewScanner(conn)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var m message
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			g.fail("bad message from the stream: " + err.Error())
			return
		}
		switch {
		case m.Error != "":
			g.fail("the stream failed: " + m.Error)
			return
		case m.Complete:
			g.setComplete("complete")
			return
		default:
			g.add(m.Have)
		}
	}
	// Gone without saying complete: its marker decides (it writes the marker
	// before it says so, and may exit before the line is read).
	if CompleteMarker(g.cfg.Done) {
		g.setComplete("marker")
		return
	}
	g.fail(fmt.Sprintf("the stream went away (%v)", sc.Err()))
}

func (g *Gofer) add(have [][3]int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, h := range have {
		if h[0] >= 0 && int(h[0]) < len(g.have) {
			g.have[h[0]].Add(h[1], h[2])
		}
	}
	for w := range g.waiters {
		if g.have[w.file].Covers(w.off, w.n) {
			g.wakeLocked(w)
		}
	}
}

func (g *Gofer) wakeLocked(w *waiter) {
	if !w.woken {
		w.woken = true
		close(w.ch)
	}
	delete(g.waiters, w)
}

func (g *Gofer) setComplete(how string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.failed != "" {
		return
	}
	g.complete = true
	g.logf("stream complete (%s)", how)
	for w := range g.waiters {
		g.wakeLocked(w)
	}
}

func (g *Gofer) fail(why string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.complete || g.failed != "" {
		return
	}
	g.failed = why
	g.logf("%s: failing every read of data not present", why)
	for w := range g.waiters {
		g.wakeLocked(w)
	}
}

// presentLocked tells whether [off, off+n) of file may be served.
func (g *Gofer) presentLocked(file int, off, n int64) bool {
	return g.complete || g.have[file].Covers(off, n)
}

// await blocks until [off, off+n) of file is present (nil), the stream
// failed, ctx ends, or d passes.
func (g *Gofer) await(ctx context.Context, file int, off, n int64, d time.Duration) error {
	g.mu.Lock()
	if g.presentLocked(file, off, n) {
		g.mu.Unlock()
		return nil
	}
	if g.failed != "" {
		g.mu.Unlock()
		return errStreamFailed
	}
	w := &waiter{file: file, off: off, n: n, ch: make(chan struct{})}
	g.waiters[w] = struct{}{}
	g.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	var err error
	select {
	case <-w.ch:
	case <-t.C:
		err = context.DeadlineExceeded
	case <-ctx.Done():
		err = ctx.Err()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.waiters, w)
	switch {
	case g.presentLocked(file, off, n):
		return nil
	case g.failed != "":
		return errStreamFailed
	}
	return err
}

// want asks the stream for a range ahead of its order.
func (g *Gofer) want(file int, off, n int64, fault bool) {
	g.connMu.Lock()
	defer g.connMu.Unlock()
	if g.conn == nil {
		return
	}
	b, _ := json.Marshal(message{Want: &[3]int64{int64(file), off, n}, Fault: fault})
	g.conn.SetWriteDeadline(time.Now().Add(time.Second))
	g.conn.Write(append(b, '\n'))
}

// readAt fills b from the file at off: checked chunk by chunk in verify mode.
func (g *Gofer) readAt(file int, b []byte, off int64) error {
	if g.tables != nil {
		return g.readVerified(file, b, off)
	}
	_, err := g.fds[file].ReadAt(b, off)
	return err
}

// -- stateipc.AsyncFileServerImpl -----------------------------------------------------

// OpenRead implements stateipc.AsyncFileServerImpl.OpenRead.
func (g *Gofer) OpenRead(path string) (stateio.AsyncReader, error) {
	name := filepath.Base(path)
	for i, f := range g.cfg.Files {
		if f.Name == name {
			g.logf("open %s (%d bytes)", name, f.Size)
			r := &reader{g: g, file: i, pages: f.Pages, size: f.Size,
				done:   make(chan stateio.Completion, g.cfg.MaxParallel),
				window: int64(g.cfg.MaxParallel)*int64(g.cfg.MaxReadBytes) + 16<<20}
			r.ctx, r.cancel = context.WithCancel(context.Background())
			return r, nil
		}
	}
	g.logf("open %s: not served", name)
	return nil, fmt.Errorf("open %s: %w", name, fs.ErrNotExist)
}

// OpenWrite implements stateipc.AsyncFileServerImpl.OpenWrite: this gofer only restores.
func (g *Gofer) OpenWrite(path string) (stateio.AsyncWriter, error) {
	return nil, fmt.Errorf("thaw-gofer serves restores only (asked to write %s)", path)
}

// Destroy implements stateipc.AsyncFileServerImpl.Destroy.
func (g *Gofer) Destroy() {
	g.logf("done: %d reads, %d bytes; %d waited (%.3f s in all, longest %.3f s); %d faults, %d boosted, %d failed; "+
		"%d chunks (%d bytes) checked", g.reads.Load(), g.readBytes.Load(), g.waited.Load(),
		float64(g.waitNs.Load())/1e9, float64(g.maxWaitNs.Load())/1e9, g.faults.Load(), g.boosts.Load(),
		g.failures.Load(), g.checkedChunks.Load(), g.checkedBytes.Load())
	for _, f := range g.fds {
		f.Close()
	}
	g.connMu.Lock()
	if g.conn != nil {
		g.conn.Close()
		g.conn = nil
	}
	g.connMu.Unlock()
}

// reader serves one file (stateio.AsyncReader). AddRead, AddReadv and Wait
// come from one goroutine (stateipc's readerMain); each read runs on its own.
type reader struct {
	stateio.NoRegisterClientFD
	g      *Gofer
	file   int
	pages  bool
	size   int64
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	done   chan stateio.Completion
	// The sentry's loader sweeps pages.img front to back with up to
	// MaxParallel reads of MaxReadBytes in flight; a read further ahead than
	// that (plus slack) is a page a task waits on (save_restore.go
	// awaitLoad): a fault.
	sweepEnd int64
	window   int64
}

func (r *reader) MaxReadBytes() uint64 { return r.g.cfg.MaxReadBytes }
func (r *reader) MaxRanges() int       { return 64 }
func (r *reader) MaxParallel() int     { return r.g.cfg.MaxParallel }

func (r *reader) Close() error {
	r.cancel()
	r.wg.Wait()
	return nil
}

func (r *reader) AddRead(id int, off int64, _ stateio.DestinationFile, _ memmap.FileRange, dst []byte) {
	r.start(id, off, [][]byte{dst}, int64(len(dst)))
}

func (r *reader) AddReadv(id int, off int64, total uint64, _ stateio.DestinationFile, _ []memmap.FileRange,
	iovecs []unix.Iovec) {
	bufs := make([][]byte, len(iovecs))
	for i, iov := range iovecs {
		bufs[i] = stateio.SliceFromIovec(iov)
	}
	r.start(id, off, bufs, int64(total))
}

func (r *reader) Wait(cs []stateio.Completion, minCompletions int) ([]stateio.Completion, error) {
	return stateio.CompletionChanWait(r.done, cs, minCompletions)
}

func (r *reader) start(id int, off int64, bufs [][]byte, total int64) {
	fault := false
	if r.pages {
		if off > r.sweepEnd+r.window {
			fault = true
		} else {
			r.sweepEnd = max(r.sweepEnd, off+total)
		}
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.done <- r.serve(id, off, bufs, total, fault)
	}()
}

// serve is one read: never a short read or zeros for bytes that are only
// late; EOF only past the file's end, as a regular file would.
func (r *reader) serve(id int, off int64, bufs [][]byte, total int64, fault bool) stateio.Completion {
	g := r.g
	n := max(0, min(total, r.size-off))
	g.reads.Add(1)
	if n == 0 {
		return stateio.Completion{ID: id, Err: io.EOF}
	}
	if fault {
		g.faults.Add(1)
		g.want(r.file, off, n, true)
	}
	t0 := time.Now()
	deadline := time.Duration(g.cfg.DeadlineS * float64(time.Second))
	boost := time.Duration(g.cfg.BoostS * float64(time.Second))
	var err error
	if !fault && boost > 0 && boost < deadline {
		if err = g.await(r.ctx, r.file, off, n, boost); err == context.DeadlineExceeded {
			g.boosts.Add(1)
			g.want(r.file, off, n, false)
			err = g.await(r.ctx, r.file, off, n, deadline-boost)
		}
	} else {
		err = g.await(r.ctx, r.file, off, n, deadline)
	}
	if w := time.Since(t0); w > time.Millisecond {
		g.waited.Add(1)
		g.waitNs.Add(int64(w))
		for {
			m := g.maxWaitNs.Load()
			if int64(w) <= m || g.maxWaitNs.CompareAndSwap(m, int64(w)) {
				break
			}
		}
		if fault {
			g.logf("fault %s+%d (%d bytes) waited %.3f s", g.cfg.Files[r.file].Name, off, n, w.Seconds())
		}
	}
	if err != nil {
		g.failures.Add(1)
		g.logf("read %s+%d (%d bytes) failed after %.3f s: %v", g.cfg.Files[r.file].Name, off, n,
			time.Since(t0).Seconds(), err)
		return stateio.Completion{ID: id, Err: unix.EIO}
	}
	left := n
	at := off
	for _, b := range bufs {
		if left == 0 {
			break
		}
		b = b[:min(int64(len(b)), left)]
		if err := g.readAt(r.file, b, at); err != nil {
			g.failures.Add(1)
			g.logf("read %s+%d: %v", g.cfg.Files[r.file].Name, at, err)
			return stateio.Completion{ID: id, N: uint64(at - off), Err: unix.EIO}
		}
		at += int64(len(b))
		left -= int64(len(b))
	}
	g.readBytes.Add(n)
	if n < total {
		return stateio.Completion{ID: id, N: uint64(n), Err: io.EOF}
	}
	return stateio.Completion{ID: id, N: uint64(n)}
}
