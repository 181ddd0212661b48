package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
)

// asMain makes the test binary run main() itself, so tests see the
// command's real exit status, stdout and stderr.
const asMain = "THAW_CTRINFO_TEST_AS_MAIN"

// containerdEnv names a containerd socket to run TestRootfsAgainstContainerd
// against (as root; e.g. one control/dev/containerd.py started). Unset: the
// test does not run; set: a missing precondition fails it.
const containerdEnv = "THAW_CTRINFO_TEST_CONTAINERD"

func TestMain(m *testing.M) {
	if os.Getenv(asMain) == "1" {
		os.Args = append([]string{"thaw-ctrinfo"}, os.Args[1:]...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// ctrinfo runs the command with argv, within 60 s.
func ctrinfo(t *testing.T, argv ...string) (rc int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], argv...)
	cmd.Env = append(os.Environ(), asMain+"=1")
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), o.String(), e.String()
}

func TestBadArgumentsExit2WithUsage(t *testing.T) {
	for _, argv := range [][]string{
		{"-namespace", "n"},
		{"-namespace", "n", opPrepare, "-snapshotter", "s", "-target", "/t", "k"},
		{"-namespace", "n", opRemove, "-snapshotter", "s", "k"},
	} {
		rc, out, errOut := ctrinfo(t, argv...)
		if rc != 2 || out != "" || !strings.Contains(errOut, "usage: thaw-ctrinfo") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", argv, rc, out, errOut)
		}
	}
}

func TestNoContainerdIsAJSONErrorExit1(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	for _, argv := range [][]string{
		{"c1"},
		{opRemove, "-snapshotter", "overlayfs", "-target", filepath.Join(t.TempDir(), "t"), "k"},
	} {
		rc, out, _ := ctrinfo(t, append([]string{"-address", sock, "-namespace", "n", "-timeout", "300ms"}, argv...)...)
		var e map[string]map[string]string
		if err := json.Unmarshal([]byte(out), &e); rc != 1 || err != nil || e["error"]["kind"] == "" ||
			e["error"]["detail"] == "" {
			t.Errorf("%q: exit %d, %q", argv, rc, out)
		}
	}
}

// TestRootfsAgainstContainerd makes an image's layer in containerd's
// overlayfs snapshotter itself (Prepare, write, Commit: what unpacking an
// image does), then runs rootfs-prepare and rootfs-remove on it.
func TestRootfsAgainstContainerd(t *testing.T) {
	sock := os.Getenv(containerdEnv)
	if sock == "" {
		t.Skipf("%s is not set", containerdEnv)
	}
	if os.Geteuid() != 0 {
		t.Fatalf("%s is set but the test is not root (mounts need it)", containerdEnv)
	}
	ns := "thaw-test-" + strings.ToLower(regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "-"))
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), ns), 60*time.Second)
	defer cancel()
	c, err := client.New(sock, client.WithDefaultNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sn := c.SnapshotService("overlayfs")
	layer, chain, key := ns+"-layer", ns+"-chain", ns+"-parked"
	cleanup := func() {
		mount.UnmountRecursive(filepath.Join(os.TempDir(), ns), 0)
		for _, k := range []string{key, layer, chain} {
			sn.Remove(ctx, k)
		}
		c.NamespaceService().Delete(ctx, ns)
	}
	cleanup()
	defer cleanup()

	root := snapshots.WithLabels(map[string]string{labelGCRoot: time.Now().UTC().Format(time.RFC3339)})
	ms, err := sn.Prepare(ctx, layer, "", root)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	if err := mount.All(ms, tmp); err != nil {
		t.Fatal(err)
	}
	err = os.WriteFile(filepath.Join(tmp, "hello"), []byte("from the layer\n"), 0o644)
	if err := errors.Join(err, mount.UnmountAll(tmp, 0)); err != nil {
		t.Fatal(err)
	}
	if err := sn.Commit(ctx, chain, layer, root); err != nil {
		t.Fatal(err)
	}

	target := filepath.Join(t.TempDir(), "parked", key)
	global := []string{"-address", sock, "-namespace", ns, "-timeout", "30s"}
	prep := append(append([]string{}, global...), opPrepare, "-snapshotter", "overlayfs", "-parent", chain,
		"-target", target, key)
	rc, out, errOut := ctrinfo(t, prep...)
	if rc != 0 {
		t.Fatalf("prepare: exit %d %s %s", rc, out, errOut)
	}
	var p prepared
	if err := json.Unmarshal([]byte(out), &p); err != nil || p.Key != key || p.Target != target || len(p.Mounts) == 0 {
		t.Fatalf("prepare: %s (%v)", out, err)
	}
	if b, err := os.ReadFile(filepath.Join(target, "hello")); err != nil || string(b) != "from the layer\n" {
		t.Fatalf("the layer's file in the rootfs: %q %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(target, "written"), nil, 0o644); err != nil {
		t.Fatalf("the rootfs is not writable: %v", err)
	}
	if info, err := sn.Stat(ctx, key); err != nil || info.Kind != snapshots.KindActive || info.Parent != chain ||
		info.Labels[labelParked] != key || info.Labels[labelGCRoot] == "" {
		t.Fatalf("snapshot: %+v %v", info, err)
	}
	if rc, out, _ := ctrinfo(t, prep...); rc != 1 || !strings.Contains(out, `"kind":"exists"`) {
		t.Fatalf("prepare again: exit %d %s", rc, out)
	}
	missing := append(append([]string{}, global...), opPrepare, "-snapshotter", "overlayfs", "-parent", "sha256:none",
		"-target", target+"-2", key+"-2")
	if rc, out, _ := ctrinfo(t, missing...); rc != 1 || !strings.Contains(out, `"kind":"not-found"`) ||
		!strings.Contains(out, "not unpacked for snapshotter overlayfs") {
		t.Fatalf("prepare on missing layers: exit %d %s", rc, out)
	}

	rm := append(append([]string{}, global...), opRemove, "-snapshotter", "overlayfs", "-target", target, key)
	for _, want := range []string{`{"key":"` + key + `","removed":true}`, `{"key":"` + key + `","removed":false}`} {
		if rc, out, errOut := ctrinfo(t, rm...); rc != 0 || strings.TrimSpace(out) != want {
			t.Fatalf("remove: exit %d %s %s, want %s", rc, out, errOut, want)
		}
		if _, err := os.Stat(target); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("target after remove: %v", err)
		}
	}
	if _, err := sn.Stat(ctx, chain); err != nil {
		t.Fatalf("the image's layer went with the parked rootfs: %v", err)
	}
	fmt.Fprintf(os.Stderr, "rootfs against %s: mounts %+v\n", sock, p.Mounts)
}
