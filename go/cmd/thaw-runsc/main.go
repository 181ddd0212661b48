// Command thaw-runsc is the runsc the containerd shim executes (runsc.toml
// binary_name). It execs the real runsc for every subcommand but create,
// start, kill and delete, which it hands to thaw-runsc-hooks beside it
// (go/internal/standin). This binary imports no gRPC: Go runs every package
// initializer before main, and gRPC's cost ~4 ms on every pass-through call
// (bench/results/containerd-*.json) where this one costs well under 1 ms.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"thaw.dev/thaw/go/internal/runscargv"
)

func main() {
	dir := "."
	if exe, err := os.Executable(); err == nil {
		dir = filepath.Dir(exe)
	}
	target := os.Getenv("THAW_REAL_RUNSC")
	if target == "" {
		target = filepath.Join(dir, "runsc") // twin: standin.LoadConfig
	}
	switch runscargv.Parse(os.Args[1:]).Command {
	case "create", "start", "kill", "delete":
		// kill: a pod stopped while it restores (go/internal/standin kill).
		// It costs the hooks binary's start (~4 ms) on every kill, which the
		// shim sends only to stop a container.
		// Without the hooks binary thaw can only get out of the way: a
		// container must never fail to start because thaw is broken.
		if hooks := filepath.Join(dir, "thaw-runsc-hooks"); isExecutable(hooks) {
			target = hooks
		}
	}
	err := syscall.Exec(target, append([]string{target}, os.Args[1:]...), os.Environ())
	fmt.Fprintf(os.Stderr, "thaw-runsc: exec %s: %v\n", target, err)
	os.Exit(128)
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0
}
