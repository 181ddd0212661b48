// Command thaw-fetch fills an image's files from ranged GETs of the store's
// packs, verifying every chunk against its SHA-256 name before a byte of it
// is written: a thin CLI over go/internal/fetch (Fill), the one fetch engine,
// which thaw-gofer's stream uses too. It is the data path of
// control/images/transfer.py's fill: Python plans (which ranges, which
// chunks, where they go, presigned URLs from boto3, so credentials and
// endpoints stay configured the boto3 way), this executes
// (docs/store.md, "Why the fetch is in Go").
//
// Input, on stdin, one JSON plan: fetch.FillPlan (go/internal/fetch/plan.go
// has its format; twin: control/images/transfer.py fetch_plan). Its "retry"
// object is the one retry policy (go/internal/fetch/retry.go; docs/store.md,
// "Retry policy").
//
// Output, on stdout, one JSON object a line: {"done":BYTES} as bytes are
// written (running total), then {"stats":{...}} (fetch.FillStats) on success
// or {"error":{"kind":"integrity"|"store"|"io", ...}} (fetch.Error) on
// failure ("store" adds "store": the endpoint, scheme://host).
//
// Exit status 0 on success, 1 after an {"error":...} line, 2 for a plan
// that cannot be executed (message on stderr).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"

	"thaw.dev/thaw/go/internal/fetch"
	"thaw.dev/thaw/go/internal/progress"
)

func main() {
	// Die with the process that started us (thawd, `thaw pull`): a fetch
	// nobody waits for would keep writing into a partial entry that the next
	// pull's recovery removes. The starting thread blocks in wait() until we
	// exit (control/images/fetcher.py), so its exit means its process is gone.
	// (No getppid() == 1 check for a parent that died before this line: in a
	// container thawd may itself be pid 1.)
	syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0)
	os.Exit(run(os.Stdin, os.Stdout, os.Stderr))
}

// run executes the plan read from in, answering on out; the exit status.
func run(in io.Reader, out, errw io.Writer) int {
	var p fetch.FillPlan
	dec := json.NewDecoder(bufio.NewReaderSize(in, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		fmt.Fprintln(errw, "thaw-fetch: reading the plan:", err)
		return 2
	}
	f, err := fetch.NewFill(&p)
	if err != nil {
		fmt.Fprintln(errw, "thaw-fetch:", err)
		return 2
	}
	defer f.Close()
	lines := progress.NewLines(out)
	stop := lines.Ticker(progress.Every, f.Written)
	err = f.Run(context.Background())
	stop()
	if err != nil {
		var fe *fetch.Error
		if !errors.As(err, &fe) {
			fe = &fetch.Error{Kind: "io", Detail: err.Error()}
		}
		lines.Emit(map[string]any{"error": fe})
		return 1
	}
	lines.Emit(map[string]any{"stats": f.Stats()})
	return 0
}
