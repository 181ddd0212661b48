// Command thaw-fetch fills an image's files from ranged GETs of the store's
// packs, verifying every chunk against its SHA-256 name before a byte of it
// is written. It is the data path of control/images/transfer.py's fill: Python
// plans (which ranges, which chunks, where they go, presigned URLs from
// boto3, so credentials and endpoints stay configured the boto3 way), this
// executes. The same work in Python ran at parity with boto3's download_file
// on a 2-core machine (docs/store.md, "Why the fetch is in Go").
//
// Input, on stdin, one JSON plan (see plan; twin: control/images/transfer.py _fetch_with):
//
//	{"version":2, "workers":8, "timeout_s":60, "direct_io":true,
//	 "retry":{"max_attempts":3, "budget_s":30, "base_s":1, "transient_base_s":0.05, "max_backoff_s":20},
//	 "files":["/abs/dir/pages.img", ...],        created at full size by the caller
//	 "objects":[{"url":"https://...presigned...", "name":"packs/<h>"}, ...],
//	 "ranges":[[OBJECT, START, LENGTH, [[HASH, RAW_LEN, POS, STORED, CODEC, [[FILE, OFFSET], ...], CHECK], ...]], ...]}
//
// HASH is the chunk's SHA-256, its name, which its bytes must match. CHECK is
// its BLAKE3-256 in hex from a schema-2 manifest, or "": read, not used (the
// name is what the node trusts later; docs/store.md, "Integrity"). "retry"
// (retry.go, docs/store.md "Retry policy") may leave fields out (defaults);
// a plan without it may give "attempts", botocore's count of retries, and
// gets the defaults otherwise.
//
// Output, on stdout, one JSON object a line: {"done":BYTES} as bytes are
// written (running total), then {"stats":{...}} on success or
// {"error":{"kind":"integrity"|"store"|"io", ...}} on failure ("store" adds
// "store": the endpoint, scheme://host).
//
// Exit status 0 on success, 1 after an {"error":...} line, 2 for a plan
// that cannot be executed (message on stderr).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"syscall"

	"thaw.dev/thaw/go/internal/progress"
)

func main() {
	// Die with the process that started us (thawd, `thaw pull`): a fetch
	// nobody waits for would keep writing into a partial entry that the next
	// pull's recovery removes. The starting thread blocks in wait() until we
	// exit (control/images/transfer.py), so its exit means its process is gone.
	// (No getppid() == 1 check for a parent that died before this line: in a
	// container thawd may itself be pid 1.)
	syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0)
	var p plan
	dec := json.NewDecoder(bufio.NewReaderSize(os.Stdin, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		fmt.Fprintln(os.Stderr, "thaw-fetch: reading the plan:", err)
		os.Exit(2)
	}
	job, err := newJob(&p)
	if err != nil {
		fmt.Fprintln(os.Stderr, "thaw-fetch:", err)
		os.Exit(2)
	}
	defer job.close()

	out := progress.NewLines(os.Stdout)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := out.Ticker(progress.Every, job.written.Load)
	ferr := job.run(ctx)
	stop()
	if ferr != nil {
		out.Emit(map[string]any{"error": ferr})
		os.Exit(1)
	}
	out.Emit(map[string]any{"stats": job.stats()})
}
