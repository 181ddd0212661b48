package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// proxy forwards every request to upstream unchanged (method, path and query
// as sent, every end-to-end header, the Host header as received, so SigV4
// signatures, presigned or not, still verify) unless a fault says otherwise.
type proxy struct {
	upstream *url.URL
	client   *http.Transport
	faults   *faults
	conns    *connSet

	requests, forwarded, bytesOut, upstreamErrors atomic.Int64
}

func newProxy(upstream *url.URL, t *faults, conns *connSet) *proxy {
	return &proxy{
		upstream: upstream,
		client: &http.Transport{
			Proxy:               nil, // never a proxy of the environment: upstream is on loopback
			DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 256,
			DisableCompression:  true, // pass bodies as stored; asking for gzip would change the signed request
			ReadBufferSize:      256 << 10,
			WriteBufferSize:     256 << 10,
		},
		faults: t,
		conns:  conns,
	}
}

// Hop-by-hop headers (RFC 9110 7.6.1), never forwarded; with Expect, which
// the server side has already answered. SigV4 signs none of them (botocore
// leaves expect, transfer-encoding, user-agent and x-amzn-trace-id unsigned).
var hopByHop = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Expect"}

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.requests.Add(1)
	var throttles, corrupts []*fault
	var stallAfter *fault
	for _, f := range p.faults.active(r) {
		switch f.Kind {
		case kindReset:
			p.faults.hit(f)
			p.reset(w)
			return
		case kindStall:
			p.faults.hit(f)
			if f.AfterBytes == nil {
				p.hang(w, f)
				return
			}
			stallAfter = f
		case kindError:
			p.faults.hit(f)
			writeS3Error(w, r, f)
			return
		case kindThrottle:
			p.faults.hit(f)
			throttles = append(throttles, f)
		case kindCorrupt:
			p.faults.hit(f)
			corrupts = append(corrupts, f)
		}
	}
	p.forward(w, r, throttles, corrupts, stallAfter)
}

func (p *proxy) forward(w http.ResponseWriter, r *http.Request, throttles, corrupts []*fault, stallAfter *fault) {
	u := *p.upstream
	u.Path, u.RawPath, u.RawQuery = r.URL.Path, r.URL.RawPath, r.URL.RawQuery
	var body io.Reader
	if r.ContentLength != 0 {
		body = r.Body
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, u.String(), body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	out.Host = r.Host // what the client signed
	out.Header = r.Header.Clone()
	for _, h := range hopByHop {
		out.Header.Del(h)
	}
	if _, ok := out.Header["User-Agent"]; !ok {
		out.Header["User-Agent"] = []string{""} // Go would add its own
	}
	out.ContentLength = r.ContentLength
	resp, err := p.client.RoundTrip(out)
	if err != nil {
		p.upstreamErrors.Add(1)
		http.Error(w, "thaw-s3proxy: upstream: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	p.forwarded.Add(1)
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	for _, h := range hopByHop {
		w.Header().Del(h)
	}
	if resp.ContentLength >= 0 && r.Method != http.MethodHead {
		w.Header().Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	}
	w.WriteHeader(resp.StatusCode)
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		corrupts = nil // only objects' bytes are corrupted, not error bodies
	}
	p.copyBody(w, resp, throttles, corrupts, stallAfter)
}

// copyBody sends the upstream body, paced by throttles, with corrupts
// applied, and hangs after stallAfter's after_bytes until its window ends.
func (p *proxy) copyBody(w http.ResponseWriter, resp *http.Response, throttles, corrupts []*fault, stallAfter *fault) {
	start := contentRangeStart(resp)
	rc := http.NewResponseController(w)
	buf := make([]byte, 256<<10)
	var sent int64
	for {
		n := len(buf)
		var pacers []*fault
		rate := 0.0
		for _, f := range throttles {
			if f.isActive() {
				pacers = append(pacers, f)
				if rate == 0 || f.RateBps < rate {
					rate = f.RateBps
				}
			}
		}
		if rate > 0 {
			n = piece(rate)
		}
		if stallAfter != nil && stallAfter.isActive() {
			if left := *stallAfter.AfterBytes - sent; left <= 0 {
				rc.Flush() // what was sent must reach the client before the hang
				<-stallAfter.closed
				p.abort(w)
				return
			} else if int64(n) > left {
				n = int(left)
			}
		}
		m, err := io.ReadFull(resp.Body, buf[:n])
		if m > 0 {
			for _, f := range pacers {
				f.pacer.wait(m, f.closed)
			}
			for _, f := range corrupts {
				if f.isActive() {
					corrupt(buf[:m], start+sent, f)
				}
			}
			if _, werr := w.Write(buf[:m]); werr != nil {
				return
			}
			if len(pacers) > 0 {
				rc.Flush() // a paced piece goes out now, not when net/http's buffer fills
			}
			sent += int64(m)
			p.bytesOut.Add(int64(m))
		}
		if err != nil { // io.EOF, io.ErrUnexpectedEOF: the body is over; else upstream broke off
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				p.abort(w)
			}
			return
		}
	}
}

// contentRangeStart is the object offset of a response body's first byte.
func contentRangeStart(resp *http.Response) int64 {
	cr := resp.Header.Get("Content-Range") // bytes START-END/TOTAL
	if rest, ok := strings.CutPrefix(cr, "bytes "); ok {
		if a, _, ok := strings.Cut(rest, "-"); ok {
			if v, err := strconv.ParseInt(a, 10, 64); err == nil {
				return v
			}
		}
	}
	return 0
}

func corrupt(b []byte, at int64, f *fault) {
	x := byte(f.XOR)
	for _, o := range f.Offsets {
		if o >= at && o < at+int64(len(b)) {
			b[o-at] ^= x
		}
	}
	if f.Every > 0 {
		for o := (at + f.Every - 1) / f.Every * f.Every; o < at+int64(len(b)); o += f.Every {
			if !slices.Contains(f.Offsets, o) { // flipped above already: a byte is flipped once
				b[o-at] ^= x
			}
		}
	}
}

// writeS3Error answers as S3 does when it slows a client down or fails: an
// XML error body (botocore reads the Code from it), or for 502 the plain
// text of a load balancer in front of the store.
func writeS3Error(w http.ResponseWriter, r *http.Request, f *fault) {
	if f.Code == "" {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(f.Status)
		if r.Method != http.MethodHead {
			fmt.Fprintf(w, "%d %s\n", f.Status, http.StatusText(f.Status))
		}
		return
	}
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(f.Status)
	if r.Method != http.MethodHead {
		fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>`+"\n"+
			`<Error><Code>%s</Code><Message>%s</Message><Resource>%s</Resource><RequestId>thaw-s3proxy-%d</RequestId></Error>`,
			xmlEscape(f.Code), xmlEscape(f.Message), xmlEscape(r.URL.Path), f.ID)
	}
}

func xmlEscape(s string) string {
	var b strings.Builder
	for _, c := range s {
		switch c {
		case '<':
			b.WriteString("&lt;")
		case '>':
			b.WriteString("&gt;")
		case '&':
			b.WriteString("&amp;")
		default:
			b.WriteRune(c)
		}
	}
	return b.String()
}

// reset ends the request's connection with a TCP RST and no answer.
func (p *proxy) reset(w http.ResponseWriter) {
	c, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	rst(c)
}

// hang holds the request's connection without answering until f's window
// ends, then closes it (the client sees a timeout, or EOF if it waits longer).
func (p *proxy) hang(w http.ResponseWriter, f *fault) {
	c, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	p.conns.holdHijacked(c)
	defer p.conns.releaseHijacked(c)
	<-f.closed
	c.Close()
}

// abort breaks off a response mid-body: the client sees a short body.
func (p *proxy) abort(http.ResponseWriter) {
	panic(http.ErrAbortHandler) // net/http closes the connection, quietly
}

func rst(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0) // close sends RST, not FIN
	}
	c.Close()
}

// connSet tracks the proxy's client connections, so that a refuse window
// can reset every open one (a dead server's kernel would).
type connSet struct {
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	hijacked map[net.Conn]struct{}
}

func newConnSet() *connSet {
	return &connSet{conns: map[net.Conn]struct{}{}, hijacked: map[net.Conn]struct{}{}}
}

func (s *connSet) track(c net.Conn, st http.ConnState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch st {
	case http.StateNew:
		s.conns[c] = struct{}{}
	case http.StateClosed, http.StateHijacked:
		delete(s.conns, c)
	}
}

func (s *connSet) holdHijacked(c net.Conn) {
	s.mu.Lock()
	s.hijacked[c] = struct{}{}
	s.mu.Unlock()
}

func (s *connSet) releaseHijacked(c net.Conn) {
	s.mu.Lock()
	delete(s.hijacked, c)
	s.mu.Unlock()
}

// resetAll resets every client connection; it returns how many.
func (s *connSet) resetAll() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for c := range s.conns {
		rst(c)
		n++
	}
	for c := range s.hijacked {
		rst(c)
		n++
	}
	return n
}

// gate is the proxy's listener: a refuse window closes the socket (so
// connect() gets ECONNREFUSED from the kernel) and re-opens it on the same
// address when the window ends, while http.Server keeps calling Accept.
type gate struct {
	addr string
	mu   sync.Mutex
	cur  net.Listener // nil while refusing
	open chan struct{}
	done chan struct{}
}

func newGate(addr string) (*gate, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &gate{addr: l.Addr().String(), cur: l, open: make(chan struct{}), done: make(chan struct{})}, nil
}

func (g *gate) Accept() (net.Conn, error) {
	for {
		g.mu.Lock()
		l, open := g.cur, g.open
		g.mu.Unlock()
		if l == nil {
			select {
			case <-open:
				continue
			case <-g.done:
				return nil, net.ErrClosed
			}
		}
		c, err := l.Accept()
		if err == nil {
			return c, nil
		}
		g.mu.Lock()
		refusing := g.cur != l
		g.mu.Unlock()
		select {
		case <-g.done:
			return nil, net.ErrClosed
		default:
		}
		if !refusing {
			return nil, err
		}
	}
}

// refuse closes the socket; resume re-opens it on the same address.
func (g *gate) refuse() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cur == nil {
		return nil
	}
	err := g.cur.Close()
	g.cur = nil
	g.open = make(chan struct{})
	return err
}

func (g *gate) resume() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cur != nil {
		return nil
	}
	// The port was ours a moment ago; SO_REUSEADDR (Go sets it) lets the bind
	// through connections still in TIME_WAIT.
	var l net.Listener
	var err error
	for i := 0; i < 50; i++ {
		if l, err = (&net.ListenConfig{}).Listen(context.Background(), "tcp", g.addr); err == nil ||
			!errors.Is(err, syscall.EADDRINUSE) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	g.cur = l
	close(g.open)
	return nil
}

func (g *gate) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.done:
	default:
		close(g.done)
	}
	if g.cur != nil {
		return g.cur.Close()
	}
	return nil
}

func (g *gate) Addr() net.Addr {
	a, _ := net.ResolveTCPAddr("tcp", g.addr)
	return a
}
