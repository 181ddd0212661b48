package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
)

func TestTheContainerFormIsParsedAsBefore(t *testing.T) {
	for _, argv := range [][]string{
		{"-address", "/s.sock", "-namespace", "k8s.io", "-timeout", "3s", "c1"},
		{"-address=/s.sock", "-namespace=k8s.io", "-timeout=3s", "c1"},
	} {
		cmd, err := parse(argv)
		if err != nil || cmd.id != "c1" || cmd.rootfs != nil || cmd.address != "/s.sock" ||
			cmd.namespace != "k8s.io" || cmd.timeout != 3*time.Second {
			t.Fatalf("%q: %+v %v", argv, cmd, err)
		}
	}
	cmd, err := parse([]string{"-namespace", "n", "c1"})
	if err != nil || cmd.address != "/run/containerd/containerd.sock" || cmd.timeout != 2*time.Second {
		t.Fatalf("defaults: %+v %v", cmd, err)
	}
	// A lone word is a container id, even one spelled like a subcommand.
	if cmd, err := parse([]string{"-namespace", "n", opPrepare}); err != nil || cmd.id != opPrepare || cmd.rootfs != nil {
		t.Fatalf("container named %s: %+v %v", opPrepare, cmd, err)
	}
}

func TestSubcommandsAreParsed(t *testing.T) {
	cmd, err := parse([]string{"-address", "/s", "-namespace", "n", "-timeout", "30s", opPrepare,
		"-snapshotter", "overlayfs", "-parent", "sha256:abc", "-target", "/var/lib/thaw/parked/k1/", "k1"})
	want := rootfsArgs{op: opPrepare, snapshotter: "overlayfs", parent: "sha256:abc", target: "/var/lib/thaw/parked/k1", key: "k1"}
	if err != nil || cmd.rootfs == nil || *cmd.rootfs != want || cmd.timeout != 30*time.Second || cmd.id != "" {
		t.Fatalf("prepare: %+v %+v %v", cmd, cmd.rootfs, err)
	}
	cmd, err = parse([]string{"-namespace", "n", opRemove, "-snapshotter=overlayfs", "-target=/t", "k1"})
	want = rootfsArgs{op: opRemove, snapshotter: "overlayfs", target: "/t", key: "k1"}
	if err != nil || cmd.rootfs == nil || *cmd.rootfs != want {
		t.Fatalf("remove: %+v %v", cmd.rootfs, err)
	}
}

func TestBadArgumentsAreUsageErrors(t *testing.T) {
	prep := []string{"-namespace", "n", opPrepare}
	for name, argv := range map[string][]string{
		"no positional":           {"-namespace", "n"},
		"no namespace":            {"c1"},
		"two ids":                 {"-namespace", "n", "c1", "c2"},
		"unknown flag":            {"-namespace", "n", "-bogus", "c1"},
		"flag after id":           {"-namespace", "n", "c1", "-timeout", "1s"},
		"prepare no key":          append(prep, "-snapshotter", "s", "-parent", "p", "-target", "/t"),
		"prepare two keys":        append(prep, "-snapshotter", "s", "-parent", "p", "-target", "/t", "k", "k2"),
		"prepare no parent":       append(prep, "-snapshotter", "s", "-target", "/t", "k"),
		"prepare no target":       append(prep, "-snapshotter", "s", "-parent", "p", "k"),
		"prepare no snap":         append(prep, "-parent", "p", "-target", "/t", "k"),
		"relative target":         append(prep, "-snapshotter", "s", "-parent", "p", "-target", "t", "k"),
		"root target":             append(prep, "-snapshotter", "s", "-parent", "p", "-target", "/", "k"),
		"global flag late":        append(prep, "-namespace", "m", "-snapshotter", "s", "-parent", "p", "-target", "/t", "k"),
		"remove takes no -parent": {"-namespace", "n", opRemove, "-snapshotter", "s", "-parent", "p", "-target", "/t", "k"},
		"remove no target":        {"-namespace", "n", opRemove, "-snapshotter", "s", "k"},
	} {
		if _, err := parse(argv); err == nil || errors.Is(err, flag.ErrHelp) {
			t.Errorf("%s: %q parsed (%v)", name, argv, err)
		}
	}
	if _, err := parse([]string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

func TestErrorsAreOneJSONObjectWithTheirKind(t *testing.T) {
	expired, cancel := context.WithTimeout(context.Background(), -time.Second)
	defer cancel()
	for _, c := range []struct {
		ctx  context.Context
		err  error
		kind string
	}{
		{context.Background(), fmt.Errorf("image layers sha256:x not unpacked for snapshotter s: %w", errdefs.ErrNotFound), "not-found"},
		{context.Background(), fmt.Errorf("snapshot k: %w", errdefs.ErrAlreadyExists), "exists"},
		{context.Background(), fmt.Errorf("dial: %w", errdefs.ErrUnavailable), "unavailable"},
		{context.Background(), fmt.Errorf("x: %w", context.DeadlineExceeded), "deadline"},
		{expired, errors.New("rpc error"), "deadline"},
		{context.Background(), errors.New("mount: operation not permitted"), "other"},
	} {
		var b bytes.Buffer
		if rc := emit(&b, c.ctx, nil, c.err); rc != 1 {
			t.Errorf("%v: exit %d", c.err, rc)
		}
		var out map[string]map[string]string
		if err := json.Unmarshal(b.Bytes(), &out); err != nil || len(out) != 1 || len(out["error"]) != 2 ||
			out["error"]["kind"] != c.kind || out["error"]["detail"] != c.err.Error() {
			t.Errorf("%v: %s (%v)", c.err, b.String(), err)
		}
	}
	var b bytes.Buffer
	if rc := emit(&b, context.Background(), &removed{Key: "k", Removed: true}, nil); rc != 0 ||
		b.String() != `{"key":"k","removed":true}`+"\n" {
		t.Errorf("success: %d %s", rc, b.String())
	}
}

// fakeSnapshotter holds snapshots in memory: the metadata store's answers
// (core/metadata/snapshot.go: NotFound, AlreadyExists) for what prepare and
// remove call.
type fakeSnapshotter struct {
	snapshots.Snapshotter // other methods: not called
	infos                 map[string]snapshots.Info
	prepareErr            error // returned by Prepare after it made the snapshot
}

func (f *fakeSnapshotter) Stat(_ context.Context, key string) (snapshots.Info, error) {
	if i, ok := f.infos[key]; ok {
		return i, nil
	}
	return snapshots.Info{}, fmt.Errorf("snapshot %v does not exist: %w", key, errdefs.ErrNotFound)
}

func (f *fakeSnapshotter) Prepare(_ context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	if _, ok := f.infos[key]; ok {
		return nil, fmt.Errorf("snapshot %q: %w", key, errdefs.ErrAlreadyExists)
	}
	if _, ok := f.infos[parent]; !ok {
		return nil, fmt.Errorf("parent snapshot %v does not exist: %w", parent, errdefs.ErrNotFound)
	}
	info := snapshots.Info{Name: key, Parent: parent, Kind: snapshots.KindActive}
	for _, o := range opts {
		o(&info)
	}
	f.infos[key] = info
	return []mount.Mount{{Type: "overlay", Source: "overlay", Options: []string{"upperdir=/u/" + key, "lowerdir=/l"}}},
		f.prepareErr
}

func (f *fakeSnapshotter) Remove(_ context.Context, key string) error {
	if _, ok := f.infos[key]; !ok {
		return fmt.Errorf("snapshot %v does not exist: %w", key, errdefs.ErrNotFound)
	}
	delete(f.infos, key)
	return nil
}

// fakeHost: a mount table of its own.
type fakeHost struct {
	mounted  map[string]bool
	mountErr error
}

func (f *fakeHost) host() host {
	return host{
		mountAll: func(ms []mount.Mount, target string) error {
			if f.mountErr != nil {
				return f.mountErr
			}
			f.mounted[target] = true
			return nil
		},
		unmountAll:   func(target string) error { delete(f.mounted, target); return nil },
		isMountPoint: func(dir string) (bool, error) { return f.mounted[dir], nil },
	}
}

func newFakes() (*fakeSnapshotter, *fakeHost) {
	return &fakeSnapshotter{infos: map[string]snapshots.Info{"sha256:chain": {Name: "sha256:chain", Kind: snapshots.KindCommitted}}},
		&fakeHost{mounted: map[string]bool{}}
}

func TestPrepareMakesAGCRootSnapshotAndMountsIt(t *testing.T) {
	sn, fh := newFakes()
	dir := filepath.Join(t.TempDir(), "parked", "k1")
	out, err := prepare(context.Background(), sn, fh.host(), rootfsArgs{op: opPrepare, snapshotter: "overlayfs",
		parent: "sha256:chain", target: dir, key: "k1"})
	if err != nil {
		t.Fatal(err)
	}
	info := sn.infos["k1"]
	if _, err := time.Parse(time.RFC3339, info.Labels[labelGCRoot]); err != nil || info.Labels[labelParked] != "k1" ||
		info.Parent != "sha256:chain" || info.Kind != snapshots.KindActive {
		t.Fatalf("snapshot: %+v (%v)", info, err)
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() || !fh.mounted[dir] {
		t.Fatalf("target: %v %v", err, fh.mounted)
	}
	b, _ := json.Marshal(out)
	want := `{"key":"k1","target":"` + dir + `","snapshotter":"overlayfs","mounts":[{"type":"overlay","source":"overlay",` +
		`"options":["upperdir=/u/k1","lowerdir=/l"]}]}`
	if string(b) != want {
		t.Fatalf("output:\n%s\nwant\n%s", b, want)
	}
}

func TestPrepareFailuresLeaveNothing(t *testing.T) {
	a := rootfsArgs{op: opPrepare, snapshotter: "overlayfs", parent: "sha256:chain", key: "k1"}

	sn, fh := newFakes()
	a.target = filepath.Join(t.TempDir(), "missing-layers")
	b := a
	b.parent = "sha256:other"
	_, err := prepare(context.Background(), sn, fh.host(), b)
	if kind(context.Background(), err) != "not-found" || !strings.Contains(err.Error(),
		"image layers sha256:other not unpacked for snapshotter overlayfs") {
		t.Errorf("missing layers: %v", err)
	}
	if _, err := os.Stat(a.target); !errors.Is(err, os.ErrNotExist) || len(sn.infos) != 1 {
		t.Errorf("missing layers left %v %v", err, sn.infos)
	}

	// The mount fails: the snapshot goes again, and the directory made for it.
	sn, fh = newFakes()
	fh.mountErr = errors.New("operation not permitted")
	a.target = filepath.Join(t.TempDir(), "mount-fails")
	if _, err := prepare(context.Background(), sn, fh.host(), a); kind(context.Background(), err) != "other" {
		t.Errorf("mount failure: %v", err)
	}
	if _, err := os.Stat(a.target); !errors.Is(err, os.ErrNotExist) || len(sn.infos) != 1 {
		t.Errorf("mount failure left %v %v", err, sn.infos)
	}

	// Prepare made the snapshot but answered an error (a deadline on the way back).
	sn, fh = newFakes()
	sn.prepareErr = context.DeadlineExceeded
	a.target = filepath.Join(t.TempDir(), "late")
	if _, err := prepare(context.Background(), sn, fh.host(), a); kind(context.Background(), err) != "deadline" {
		t.Errorf("late Prepare: %v", err)
	}
	if len(sn.infos) != 1 {
		t.Errorf("late Prepare left %v", sn.infos)
	}
}

func TestPrepareOfATakenKeyOrTargetIsExists(t *testing.T) {
	sn, fh := newFakes()
	theirs := snapshots.Info{Name: "k1", Labels: map[string]string{"other": "x"}}
	sn.infos["k1"] = theirs
	dir := t.TempDir()
	a := rootfsArgs{op: opPrepare, snapshotter: "overlayfs", parent: "sha256:chain", target: filepath.Join(dir, "k1"), key: "k1"}
	_, err := prepare(context.Background(), sn, fh.host(), a)
	if kind(context.Background(), err) != "exists" || sn.infos["k1"].Labels["other"] != "x" {
		t.Errorf("taken key: %v %v", err, sn.infos)
	}
	delete(sn.infos, "k1")

	full := filepath.Join(dir, "full")
	os.MkdirAll(filepath.Join(full, "x"), 0o700)
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	mnt := filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o700)
	fh.mounted[mnt] = true
	for _, target := range []string{full, file, mnt} {
		a.target = target
		if _, err := prepare(context.Background(), sn, fh.host(), a); kind(context.Background(), err) != "exists" {
			t.Errorf("target %s: %v", target, err)
		}
	}
	if len(sn.infos) != 1 {
		t.Errorf("a taken target made a snapshot: %v", sn.infos)
	}
	if _, err := os.Stat(filepath.Join(full, "x")); err != nil {
		t.Error(err)
	}
}

func TestRemoveIsIdempotentAndRemovesOnlyParkedSnapshots(t *testing.T) {
	sn, fh := newFakes()
	dir := filepath.Join(t.TempDir(), "k1")
	a := rootfsArgs{op: opPrepare, snapshotter: "overlayfs", parent: "sha256:chain", target: dir, key: "k1"}
	if _, err := prepare(context.Background(), sn, fh.host(), a); err != nil {
		t.Fatal(err)
	}
	a.op, a.parent = opRemove, ""
	for i, want := range []bool{true, false} {
		out, err := remove(context.Background(), sn, fh.host(), a)
		if err != nil || out.Key != "k1" || out.Removed != want {
			t.Fatalf("remove %d: %+v %v", i, out, err)
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) || fh.mounted[dir] || len(sn.infos) != 1 {
			t.Fatalf("remove %d left %v %v %v", i, err, fh.mounted, sn.infos)
		}
	}

	// A directory with files of its own (not the snapshot's) stays.
	os.MkdirAll(filepath.Join(dir, "x"), 0o700)
	if out, err := remove(context.Background(), sn, fh.host(), a); err != nil || out.Removed {
		t.Fatalf("non-empty target: %+v %v", out, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "x")); err != nil {
		t.Fatal(err)
	}

	// A container's snapshot is refused and nothing is unmounted.
	sn.infos["ctr"] = snapshots.Info{Name: "ctr", Parent: "sha256:chain"}
	fh.mounted[dir] = true
	a.key = "ctr"
	if _, err := remove(context.Background(), sn, fh.host(), a); err == nil || !fh.mounted[dir] {
		t.Fatalf("removed a snapshot without %s: %v", labelParked, err)
	}
	if _, ok := sn.infos["ctr"]; !ok {
		t.Fatal("a container's snapshot was removed")
	}
}
