package standin

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"thaw.dev/thaw/go/internal/runscargv"
)

// capture runs f with os.Stdout redirected and returns what it printed.
func capture(t *testing.T, f func() int) (int, []byte) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	rc := f()
	os.Stdout = old
	w.Close()
	var buf bytes.Buffer
	io.Copy(&buf, r)
	return rc, buf.Bytes()
}

// The shim's calls for an init container thaw answered as done read as those
// for a container that exited 0 (pkg/shim/v1/runsccmd parses state as
// go-runc's Container and wait as {"id", "exitStatus"}).
func TestASatisfiedContainerReadsAsOneThatExitedZero(t *testing.T) {
	root := t.TempDir()
	state := t.TempDir()
	s := &Standin{cfg: Config{StateDir: state, LogPath: filepath.Join(state, "standin.log"), Socket: filepath.Join(state, "none.sock")}}
	s.log = openDecisionLog(s.cfg.LogPath, 0, 0)
	defer s.log.Close()
	call := func(args ...string) (int, map[string]any) {
		s.a = runscargv.Parse(append([]string{"--root=" + root}, args...))
		rc, out := capture(t, func() int { return s.satisfiedCall("init-1") })
		var v map[string]any
		json.Unmarshal(out, &v)
		return rc, v
	}
	s.a = runscargv.Parse([]string{"--root=" + root, "create", "init-1"})
	m := &marker{ID: "init-1", Root: root, Bundle: "/b", Decision: "satisfied", Pid: 4242, Created: 1.5}
	if err := s.saveMarker(m); err != nil {
		t.Fatal(err)
	}
	if err := s.writeAlias("init-1", runscargv.Satisfied); err != nil {
		t.Fatal(err)
	}
	if got := runscargv.Alias(root, "init-1"); got != runscargv.Satisfied {
		t.Fatalf("alias %q", got)
	}
	if rc, v := call("state", "init-1"); rc != 0 || v["status"] != "created" {
		t.Fatalf("state before start: %d %v", rc, v)
	}
	if rc, _ := call("start", "init-1"); rc != 0 {
		t.Fatalf("start: %d", rc)
	}
	if rc, v := call("wait", "init-1"); rc != 0 || v["exitStatus"] != float64(0) || v["id"] != "init-1" {
		t.Fatalf("wait: %d %v", rc, v)
	}
	if rc, v := call("state", "init-1"); rc != 0 || v["status"] != "stopped" || v["pid"] != float64(4242) {
		t.Fatalf("state: %d %v", rc, v)
	}
	if rc, _ := call("kill", "init-1", "9"); rc != 0 {
		t.Fatalf("kill: %d", rc)
	}
	if rc, _ := call("exec", "init-1", "true"); rc == 0 {
		t.Fatal("exec into a container that has exited succeeded")
	}
	if rc, _ := call("delete", "init-1"); rc != 0 {
		t.Fatalf("delete: %d", rc)
	}
	if runscargv.Alias(root, "init-1") != "" || s.loadMarker("init-1") != nil {
		t.Fatal("delete left the alias or the marker")
	}
}
