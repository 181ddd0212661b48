package standin

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// A `runsc create` killed part way (its stand-in was SIGKILLed, and its
// Pdeathsig took runsc along) may already have forked the sandbox
// (`runsc-sandbox ... boot ... ID`) and the gofer (`runsc-gofer ... gofer ...
// ID`) without having saved the container's state. Those two run in sessions
// of their own, outlive it, and runsc knows nothing of them, so the `runsc
// delete --force` of containerd's cleanup after the failed create cannot
// remove them: a sandbox (~64 MB) nothing reclaims, found by
// tests/integration/faults/test_standin_kills.py (issue 14). delete kills
// them, and only when runsc has no state for the container: otherwise the
// container is runsc's to delete.

// runscNotFound is what `runsc state` prints for an id its root does not
// hold (runsc/container/container.go Load). Twin: runsc_hooks/runsc.py
// _NOT_FOUND_MARKERS.
var runscNotFound = []string{"file does not exist", "container with id"}

// unknownToRunsc says whether runsc root `root` has no state for container
// id: then what a killed create left of it is nobody's.
func (s *Standin) unknownToRunsc(id, root string) bool {
	if id == "" || root == "" {
		return false
	}
	runtime.LockOSThread() // never unlocked: Pdeathsig watches the forking thread (runscCmd)
	cmd := s.runscCmd("state", id)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// runsc knows the container (or cannot tell): its delete decides.
	return cmd.Run() != nil && notFound(out.String())
}

// reapOrphans kills the sandbox and gofer processes of container id under
// runsc root `root` (which has no state for it); it returns their pids.
func reapOrphans(id, root string) []int {
	pids := orphanProcesses("/proc", root, id)
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	return pids
}

func notFound(msg string) bool {
	for _, m := range runscNotFound {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// orphanProcesses lists, from proc (a /proc), the runsc sandbox and gofer
// processes of container id under runsc root `root`: argv[0] runsc-sandbox
// or runsc-gofer (runsc names them so; plain "runsc" with the boot or gofer
// subcommand too), the root flag, and the id as the last argument.
func orphanProcesses(proc, root, id string) []int {
	entries, err := os.ReadDir(proc)
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(proc, e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(argv) < 3 || argv[len(argv)-1] != id || !hasRoot(argv, root) {
			continue
		}
		switch filepath.Base(argv[0]) {
		case "runsc-sandbox", "runsc-gofer":
			pids = append(pids, pid)
		case "runsc":
			if contains(argv[1:len(argv)-1], "boot") || contains(argv[1:len(argv)-1], "gofer") {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

func hasRoot(argv []string, root string) bool {
	for i, a := range argv {
		if a == "--root="+root || a == "-root="+root || ((a == "--root" || a == "-root") && i+1 < len(argv) && argv[i+1] == root) {
			return true
		}
	}
	return false
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
