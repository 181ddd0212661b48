package standin

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestOrphanProcessesMatchesOnlyThisContainersSandboxAndGofer(t *testing.T) {
	proc := t.TempDir()
	root := "/run/containerd/runsc/k8s.io"
	procs := map[string][]string{
		"101": {"runsc-sandbox", "--log=/x/log.json", "--root=" + root, "--log-fd=3", "boot", "--bundle=/b", "c1"},
		"102": {"runsc-gofer", "--root=" + root, "gofer", "--bundle=/b", "c1"},
		"103": {"/opt/thaw/bin/runsc", "--root", root, "boot", "c1"},
		"104": {"runsc-sandbox", "--root=" + root, "boot", "c2"},          // another container
		"105": {"runsc-sandbox", "--root=/other/root", "boot", "c1"},      // another root
		"106": {"/opt/thaw/bin/runsc", "--root=" + root, "create", "c1"},  // not a sandbox or gofer
		"107": {"runsc-sandbox", "--root=" + root, "boot", "c1", "extra"}, // id not last
		"abc": {"runsc-sandbox", "--root=" + root, "boot", "c1"},          // not a pid
	}
	for pid, argv := range procs {
		if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		data := strings.Join(argv, "\x00") + "\x00"
		if err := os.WriteFile(filepath.Join(proc, pid, "cmdline"), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got := orphanProcesses(proc, root, "c1")
	if want := []int{101, 102, 103}; !reflect.DeepEqual(got, want) {
		t.Fatalf("orphanProcesses = %v, want %v", got, want)
	}
	if got := orphanProcesses(proc, root, "c3"); got != nil {
		t.Fatalf("no process of c3, got %v", got)
	}
}

func TestNotFoundIsRunscsMissingContainerMessage(t *testing.T) {
	if !notFound(`loading container "c1": file does not exist`) || notFound("permission denied") {
		t.Fatal("notFound must match runsc's missing-container message only")
	}
}
