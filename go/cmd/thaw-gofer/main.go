// Command thaw-gofer restores a sandbox while its image is still arriving
// from the store (issue 18; go/internal/stream says how). One binary, two
// roles:
//
//	thaw-gofer stream < PLAN
//	    The stream: fetch a plan's chunks into a cache partial entry, verified,
//	    serving gofers on the plan's socket. Started by control/images/stream.py.
//	    Output, one JSON object a line: {"listening":PATH} once gofers may
//	    connect, {"done":BYTES} as bytes are written, then {"stats":{...},
//	    "faults":[[FILE, OFF, LEN], ...]} on success or {"error":{"kind":
//	    "integrity"|"store"|"io", ...}} on failure (exit 1). Exit 2: a plan
//	    that cannot be executed (message on stderr).
//
//	runsc-checkpointgofer [runsc global flags] checkpointgofer -sock-fd=3 -gcs-opts-fd=4 [-allow-checkpoint-reads]
//	    The checkpoint gofer: runsc starts it for `runsc restore` when the
//	    image directory holds gcs_opts.json, found as `checkpointgofer` in
//	    $GVISOR_SIDECAR_BINARIES_DIR, which thaw sets for that call only
//	    (runsc/gvisorbinaries; runsc/sandbox/sandbox.go
//	    maybeStartCheckpointGoferAndGetSocket). FD 3 is the sentry's urpc
//	    socket, FD 4 gcs_opts.json (go/internal/stream GoferConfig).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"gvisor.dev/gvisor/pkg/sentry/state/stateipc"
	"gvisor.dev/gvisor/pkg/unet"
	"gvisor.dev/gvisor/pkg/urpc"

	"thaw.dev/thaw/go/internal/fetch"
	"thaw.dev/thaw/go/internal/progress"
	"thaw.dev/thaw/go/internal/stream"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "stream" {
		os.Exit(streamMain())
	}
	// runsc passes its global flags (all --name=value) before the subcommand.
	for i, a := range args {
		if !strings.HasPrefix(a, "-") {
			if a == "checkpointgofer" {
				os.Exit(goferMain(args[i+1:]))
			}
			break
		}
	}
	fmt.Fprintln(os.Stderr, "usage: thaw-gofer stream < PLAN | [runsc flags] checkpointgofer -sock-fd=N -gcs-opts-fd=M")
	os.Exit(2)
}

// goferFlags reads -sock-fd and -gcs-opts-fd (-x=N, --x=N, -x N); other flags are ignored.
func goferFlags(args []string) (sock, opts int, err error) {
	sock, opts = -1, -1
	for i := 0; i < len(args); i++ {
		name, val, hasVal := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		if name != "sock-fd" && name != "gcs-opts-fd" {
			continue
		}
		if !hasVal && i+1 < len(args) {
			i++
			val = args[i]
		}
		n, perr := strconv.Atoi(val)
		if perr != nil || n < 0 {
			return 0, 0, fmt.Errorf("-%s %q is not an FD", name, val)
		}
		if name == "sock-fd" {
			sock = n
		} else {
			opts = n
		}
	}
	if sock < 0 || opts < 0 {
		return 0, 0, errors.New("-sock-fd and -gcs-opts-fd are required")
	}
	return sock, opts, nil
}

func goferMain(args []string) int {
	sockFD, optsFD, err := goferFlags(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, "thaw-gofer:", err)
		return 2
	}
	f := os.NewFile(uintptr(optsFD), "gcs_opts.json")
	cfg, err := stream.ReadGoferConfig(f)
	f.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "thaw-gofer:", err)
		return 2
	}
	g, err := stream.NewGofer(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "thaw-gofer:", err)
		return 1
	}
	srv, err := stateipc.NewAsyncFileServer(g)
	if err != nil {
		g.Destroy()
		fmt.Fprintln(os.Stderr, "thaw-gofer:", err)
		return 1
	}
	sock, err := unet.NewSocket(sockFD)
	if err != nil {
		g.Destroy()
		fmt.Fprintln(os.Stderr, "thaw-gofer:", err)
		return 1
	}
	u := urpc.NewServer()
	u.Register(srv)
	u.Handle(sock) // until the sentry closes its side: every file loaded, or the sandbox gone
	u.Stop(0)      // AsyncFileServer.Stop: files closed, then Gofer.Destroy
	return 0
}

func streamMain() int {
	// Die with the process that started us (thawd, `thaw restore`): the
	// partial entry we fill is theirs to install or remove, and a stream
	// nobody waits for must not go on writing into it (as thaw-fetch). The
	// starting thread waits for us until we exit (control/images/stream.py).
	syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0)
	var p stream.Plan
	dec := json.NewDecoder(bufio.NewReaderSize(os.Stdin, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		fmt.Fprintln(os.Stderr, "thaw-gofer stream: reading the plan:", err)
		return 2
	}
	e, err := stream.NewEngine(&p)
	if err != nil {
		fmt.Fprintln(os.Stderr, "thaw-gofer stream:", err)
		return 2
	}
	defer e.Close()
	out := progress.NewLines(os.Stdout)
	e.Logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	l, err := e.Listen()
	if err != nil {
		fmt.Fprintln(os.Stderr, "thaw-gofer stream: listen:", err)
		return 2
	}
	defer l.Close()
	out.Emit(map[string]any{"listening": p.Listen})
	stop := out.Ticker(progress.Every, e.Written)
	err = e.Run(context.Background(), l)
	stop()
	if err != nil {
		var fe *fetch.Error
		if !errors.As(err, &fe) {
			fe = &fetch.Error{Kind: "io", Detail: err.Error()}
		}
		out.Emit(map[string]any{"error": fe, "stats": e.Stats(), "faults": e.Faults()})
		return 1
	}
	out.Emit(map[string]any{"stats": e.Stats(), "faults": e.Faults()})
	return 0
}
