// Command thaw-s3proxy is a fault-injecting HTTP proxy in front of an S3
// endpoint, for thaw's fault tests and benchmarks (issue 14,
// tests/integration/faults/, bench/faults_store.py). Clients use its address
// as their S3 endpoint; it forwards every request unchanged, Host header
// included, so SigV4 signatures (boto3's and presigned URLs) stay valid, and
// injects, on demand through a small HTTP control API on a second port:
// 5xx answers with S3's error body (503 SlowDown, 500 InternalError, 502),
// a full outage (connections refused, or reset), stalls, a bandwidth limit
// on response bodies, and corrupted bytes in responses for chosen keys.
// docs/s3proxy.md has the API.
//
//	thaw-s3proxy -upstream http://127.0.0.1:8333 [-listen 127.0.0.1:0] [-control 127.0.0.1:0]
//
// When ready it prints one JSON line on stdout:
//
//	{"endpoint":"http://127.0.0.1:P","control":"http://127.0.0.1:C","upstream":"http://127.0.0.1:8333","pid":N}
//
// and serves until SIGTERM or SIGINT, or until its parent dies. Exit status 2
// for bad arguments, 1 if it cannot listen.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	upstream := flag.String("upstream", "", "S3 endpoint to forward to, http://host:port (required)")
	listen := flag.String("listen", "127.0.0.1:0", "address clients use as their S3 endpoint")
	control := flag.String("control", "127.0.0.1:0", "address of the control API")
	flag.Parse()
	u, err := url.Parse(*upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "thaw-s3proxy: -upstream http://host:port is required (and no other arguments)")
		os.Exit(2)
	}
	// A proxy left behind by a killed test would hold its ports and keep
	// answering: die with whoever started us.
	syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(syscall.SIGTERM), 0)

	s, err := start(u, *listen, *control)
	if err != nil {
		fmt.Fprintln(os.Stderr, "thaw-s3proxy:", err)
		os.Exit(1)
	}
	b, _ := json.Marshal(map[string]any{"endpoint": "http://" + s.gate.addr, "control": "http://" + s.ctl.Addr().String(),
		"upstream": u.String(), "pid": os.Getpid()})
	os.Stdout.Write(append(b, '\n'))

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	s.close()
}

// server is a running proxy: its data port (gate), its control port.
type server struct {
	gate   *gate
	ctl    net.Listener
	proxy  *proxy
	faults *faults
	conns  *connSet
	data   *http.Server
	api    *http.Server
}

func start(upstream *url.URL, listen, control string) (*server, error) {
	g, err := newGate(listen)
	if err != nil {
		return nil, err
	}
	ctl, err := net.Listen("tcp", control)
	if err != nil {
		g.Close()
		return nil, err
	}
	s := &server{gate: g, ctl: ctl, conns: newConnSet()}
	s.faults = &faults{onRefuse: func(on bool) int {
		if on {
			if err := g.refuse(); err != nil {
				fmt.Fprintln(os.Stderr, "thaw-s3proxy: closing the listener:", err)
			}
			return s.conns.resetAll()
		}
		if err := g.resume(); err != nil {
			fmt.Fprintln(os.Stderr, "thaw-s3proxy: re-opening the listener:", err)
		}
		return 0
	}}
	s.proxy = newProxy(upstream, s.faults, s.conns)
	s.data = &http.Server{Handler: s.proxy, ConnState: s.conns.track, ReadHeaderTimeout: time.Minute}
	s.api = &http.Server{Handler: s.controlAPI(), ReadHeaderTimeout: 10 * time.Second}
	go s.data.Serve(g)
	go s.api.Serve(ctl)
	return s, nil
}

func (s *server) close() {
	s.faults.remove(0) // ends every window: stalled connections close
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s.api.Shutdown(ctx)
	s.data.Shutdown(ctx)
	s.gate.Close()
	s.conns.resetAll()
}

// controlAPI: POST /faults (a fault, JSON) -> {"id":N}; GET /faults -> every
// fault with its hits and state; DELETE /faults/{id}; DELETE /faults (all);
// GET /stats -> the proxy's counters.
func (s *server) controlAPI() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /faults", func(w http.ResponseWriter, r *http.Request) {
		var f fault
		dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&f); err != nil {
			http.Error(w, "fault: "+err.Error(), http.StatusBadRequest)
			return
		}
		f.Hits, f.Opened, f.Active = 0, nil, false
		if err := s.faults.add(&f); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		writeJSON(w, map[string]int{"id": f.ID})
	})
	mux.HandleFunc("GET /faults", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(s.faults.snapshot())
	})
	mux.HandleFunc("DELETE /faults", func(w http.ResponseWriter, r *http.Request) {
		s.faults.remove(0)
		writeJSON(w, map[string]bool{"ok": true})
	})
	mux.HandleFunc("DELETE /faults/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.Atoi(r.PathValue("id"))
		if err != nil || id <= 0 || !s.faults.remove(id) {
			http.Error(w, "no such fault", http.StatusNotFound)
			return
		}
		writeJSON(w, map[string]bool{"ok": true})
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		p := s.proxy
		writeJSON(w, map[string]int64{"requests": p.requests.Load(), "forwarded": p.forwarded.Load(),
			"bytes_out": p.bytesOut.Load(), "upstream_errors": p.upstreamErrors.Load()})
	})
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(v); err != nil && !errors.Is(err, net.ErrClosed) {
		fmt.Fprintln(os.Stderr, "thaw-s3proxy: control answer:", err)
	}
}
