// Command thaw-runsc is the runsc the containerd shim executes (runsc.toml
// binary_name). It execs the real runsc for every subcommand but create,
// start, kill and delete, which it hands to thaw-runsc-hooks beside it
// (go/internal/standin). This binary imports no gRPC: Go runs every package
// initializer before main, and gRPC's cost ~4 ms on every pass-through call
// (bench/results/containerd-*.json) where this one costs well under 1 ms.
//
// A container that adopted a parked sandbox (one thawd restored ahead of
// demand under an id of its own, docs/parking.md) has an alias in the runsc
// root (runscargv.Alias): every call the shim makes for it goes to that
// sandbox's id instead, at the cost of one readlink per call for all others.
// An init container of a restoring pod that thaw answers as done (alias
// runscargv.Satisfied) has every call handed to the hooks.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
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
	a := runscargv.Parse(os.Args[1:])
	args := os.Args[1:]
	switch a.Command {
	case "create", "start", "kill", "delete":
		// kill: a pod stopped while it restores (go/internal/standin kill).
		// It costs the hooks binary's start (~4 ms) on every kill, which the
		// shim sends only to stop a container. The hooks translate aliases
		// themselves.
		// Without the hooks binary thaw can only get out of the way: a
		// container must never fail to start because thaw is broken.
		if hooks := filepath.Join(dir, "thaw-runsc-hooks"); isExecutable(hooks) {
			target = hooks
		}
	default:
		if i := a.TargetIndex(); i >= 0 {
			parked := runscargv.Alias(a.Root(), a.Args[i])
			if hooks := filepath.Join(dir, "thaw-runsc-hooks"); parked == runscargv.Satisfied && isExecutable(hooks) {
				// An init container thaw answers as done: there is no container
				// for runsc to ask; the hooks answer state, wait, events, ps.
				target = hooks
			} else if parked != "" {
				args = a.WithTarget(parked).Words()
				if a.Command == "state" {
					os.Exit(stateAs(target, args, a.Args[i]))
				}
			}
		}
	}
	err := syscall.Exec(target, append([]string{target}, args...), os.Environ())
	fmt.Fprintf(os.Stderr, "thaw-runsc: exec %s: %v\n", target, err)
	os.Exit(128)
}

// stateAs runs `runsc state` of the parked sandbox and prints its answer
// with the container id the caller asked about: the shim reads status and
// pid from it, and nothing it prints should name an id containerd never made.
func stateAs(runsc string, args []string, id string) int {
	cmd := exec.Command(runsc, args...)
	var out bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, &out, os.Stderr
	err := cmd.Run()
	var st map[string]any
	if err == nil && json.Unmarshal(out.Bytes(), &st) == nil {
		st["id"] = id
		if b, merr := json.MarshalIndent(st, "", "  "); merr == nil {
			os.Stdout.Write(append(b, '\n'))
			return 0
		}
	}
	os.Stdout.Write(out.Bytes())
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "thaw-runsc: %s: %v\n", runsc, err)
		return 128
	}
	return 0
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0
}
