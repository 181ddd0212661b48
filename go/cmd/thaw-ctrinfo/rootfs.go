package main

// rootfs-prepare and rootfs-remove: the root filesystem of a parked sandbox,
// an active snapshot of an image's layers in containerd's own snapshotter
// (see the doc comment in main.go for the contract).

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
)

const (
	opPrepare = "rootfs-prepare"
	opRemove  = "rootfs-remove"

	// labelGCRoot makes a snapshot a root of containerd's garbage collector
	// (pinned containerd v2.4.2 core/metadata/gc.go labelGCRoot; any value,
	// by convention an RFC3339 time). Its parent chain is kept through it.
	labelGCRoot = "containerd.io/gc.root"
	// labelParked names the key of a snapshot this command made; rootfs-remove
	// removes no snapshot without it.
	labelParked = "dev.thaw.parked"

	// cleanupGrace bounds undoing a failed rootfs-prepare, which runs even
	// after -timeout has passed (the caller's own timeout must allow for it).
	cleanupGrace = 2 * time.Second
)

type rootfsArgs struct {
	op          string // opPrepare or opRemove
	snapshotter string
	parent      string // the chain id of the image's layers; opPrepare only
	target      string // absolute and clean
	key         string
}

// parseRootfs reads a rootfs subcommand's own flags and its KEY.
func parseRootfs(op string, args []string) (*rootfsArgs, error) {
	a := &rootfsArgs{op: op}
	fs := flag.NewFlagSet(op, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&a.snapshotter, "snapshotter", "", "containerd snapshotter of the image's layers")
	fs.StringVar(&a.target, "target", "", "absolute directory the rootfs is mounted at")
	if op == opPrepare {
		fs.StringVar(&a.parent, "parent", "", "chain id of the image's layers (the rootfs snapshot's parent)")
	}
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	switch {
	case a.snapshotter == "":
		return nil, fmt.Errorf("%s: -snapshotter is required", op)
	case op == opPrepare && a.parent == "":
		return nil, fmt.Errorf("%s: -parent is required", op)
	case a.target == "" || !filepath.IsAbs(a.target) || filepath.Clean(a.target) == "/":
		return nil, fmt.Errorf("%s: -target must be an absolute directory other than /, got %q", op, a.target)
	case fs.NArg() != 1 || fs.Arg(0) == "":
		return nil, fmt.Errorf("%s: one snapshot KEY expected after the flags, got %q", op, fs.Args())
	}
	a.target = filepath.Clean(a.target)
	a.key = fs.Arg(0)
	return a, nil
}

type mountOut struct {
	Type    string   `json:"type"`
	Source  string   `json:"source"`
	Options []string `json:"options"`
}

type prepared struct {
	Key         string     `json:"key"`
	Target      string     `json:"target"`
	Snapshotter string     `json:"snapshotter"`
	Mounts      []mountOut `json:"mounts"`
}

type removed struct {
	Key     string `json:"key"`
	Removed bool   `json:"removed"`
}

// host is the seam to the host's mount table, so that tests need no root.
type host struct {
	mountAll     func(mounts []mount.Mount, target string) error
	unmountAll   func(target string) error // target and every mount under it
	isMountPoint func(dir string) (bool, error)
}

var realHost = host{
	mountAll:     mount.All,
	unmountAll:   func(target string) error { return mount.UnmountRecursive(target, 0) },
	isMountPoint: isMountPoint,
}

func runRootfs(ctx context.Context, g globals, a rootfsArgs) (any, error) {
	c, err := client.New(g.address, client.WithDefaultNamespace(g.namespace), client.WithTimeout(g.timeout))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	sn := c.SnapshotService(a.snapshotter)
	if a.op == opPrepare {
		return prepare(ctx, sn, realHost, a)
	}
	return remove(ctx, sn, realHost, a)
}

// prepare makes snapshot a.key on a.parent and mounts it at a.target; on any
// failure after the Prepare it removes the snapshot again.
func prepare(ctx context.Context, sn snapshots.Snapshotter, h host, a rootfsArgs) (_ *prepared, err error) {
	created, err := emptyTarget(h, a.target)
	if err != nil {
		return nil, err
	}
	if created {
		defer func() {
			if err != nil {
				os.Remove(a.target) // made empty here; still empty once unmounted
			}
		}()
	}
	// Stat first, so that missing layers are told apart from a missing key
	// (both are NotFound to Prepare).
	if _, err := sn.Stat(ctx, a.parent); err != nil {
		if errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("image layers %s not unpacked for snapshotter %s: %w", a.parent, a.snapshotter, err)
		}
		return nil, fmt.Errorf("image layers %s in snapshotter %s: %w", a.parent, a.snapshotter, err)
	}
	// The nanosecond stamp also marks this Prepare's snapshot as ours, for undo.
	stamp := time.Now().UTC().Format(time.RFC3339Nano)
	labels := map[string]string{labelGCRoot: stamp, labelParked: a.key}
	mounts, err := sn.Prepare(ctx, a.key, a.parent, snapshots.WithLabels(labels))
	if errdefs.IsAlreadyExists(err) {
		return nil, fmt.Errorf("snapshot %s in snapshotter %s: %w", a.key, a.snapshotter, err)
	}
	if err != nil {
		// The Prepare may have been done even so (a deadline on the way back).
		return nil, fmt.Errorf("prepare snapshot %s on %s: %w%s", a.key, a.parent, err, undo(ctx, sn, a.key, stamp))
	}
	if err := h.mountAll(mounts, a.target); err != nil {
		h.unmountAll(a.target) // the mounts that were made, of several
		return nil, fmt.Errorf("mount snapshot %s at %s: %w%s", a.key, a.target, err, undo(ctx, sn, a.key, stamp))
	}
	out := &prepared{Key: a.key, Target: a.target, Snapshotter: a.snapshotter, Mounts: []mountOut{}}
	for _, m := range mounts {
		out.Mounts = append(out.Mounts, mountOut{Type: m.Type, Source: m.Source, Options: append([]string{}, m.Options...)})
	}
	return out, nil
}

// emptyTarget checks that dir is an empty directory and no mount point, or
// makes it (created: true) if missing. Anything else is ErrAlreadyExists.
func emptyTarget(h host, dir string) (created bool, err error) {
	st, err := os.Lstat(dir)
	if errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return false, fmt.Errorf("target %s: %w", dir, err)
		}
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("target %s: %w", dir, err)
	}
	if !st.IsDir() {
		return false, fmt.Errorf("target %s is not a directory (%s): %w", dir, st.Mode().Type(), errdefs.ErrAlreadyExists)
	}
	if m, err := h.isMountPoint(dir); err != nil || m {
		if err != nil {
			return false, fmt.Errorf("target %s: %w", dir, err)
		}
		return false, fmt.Errorf("target %s is a mount point: %w", dir, errdefs.ErrAlreadyExists)
	}
	f, err := os.Open(dir)
	if err != nil {
		return false, fmt.Errorf("target %s: %w", dir, err)
	}
	defer f.Close()
	if names, _ := f.Readdirnames(1); len(names) > 0 {
		return false, fmt.Errorf("target %s is not empty: %w", dir, errdefs.ErrAlreadyExists)
	}
	return false, nil
}

// undo removes snapshot key if it is the one this prepare made (its gc.root
// stamp), within cleanupGrace even past ctx's deadline. It returns "" or a
// note for the error's detail (never an error of its own: the kind is the
// failure's, not the cleanup's).
func undo(ctx context.Context, sn snapshots.Snapshotter, key, stamp string) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupGrace)
	defer cancel()
	info, err := sn.Stat(ctx, key)
	if errdefs.IsNotFound(err) {
		return ""
	}
	if err == nil && (info.Labels[labelGCRoot] != stamp || info.Labels[labelParked] != key) {
		return "" // not ours: someone else's Prepare of the same key
	}
	if err == nil {
		err = sn.Remove(ctx, key)
	}
	if err != nil && !errdefs.IsNotFound(err) {
		return fmt.Sprintf(" (and removing snapshot %s again failed: %v; rootfs-remove it)", key, err)
	}
	return ""
}

// remove unmounts a.target, removes snapshot a.key if it is one prepare made,
// and removes a.target if it is then an empty directory. Idempotent.
func remove(ctx context.Context, sn snapshots.Snapshotter, h host, a rootfsArgs) (*removed, error) {
	info, err := sn.Stat(ctx, a.key)
	exists := err == nil
	if err != nil && !errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("snapshot %s in snapshotter %s: %w", a.key, a.snapshotter, err)
	}
	if exists && info.Labels[labelParked] != a.key {
		return nil, fmt.Errorf("snapshot %s in snapshotter %s has no label %s=%s: not a parked rootfs, not removed",
			a.key, a.snapshotter, labelParked, a.key)
	}
	st, err := os.Lstat(a.target)
	dirExists := err == nil
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("target %s: %w", a.target, err)
	}
	if dirExists && !st.IsDir() {
		return nil, fmt.Errorf("target %s is not a directory (%s)", a.target, st.Mode().Type())
	}
	if dirExists {
		// Never remove a snapshot that is still mounted: the snapshotter
		// deletes its directories under the live mount.
		if err := h.unmountAll(a.target); err != nil {
			return nil, fmt.Errorf("unmount %s: %w", a.target, err)
		}
		if m, err := h.isMountPoint(a.target); err != nil || m {
			if err == nil {
				err = errors.New("still a mount point")
			}
			return nil, fmt.Errorf("unmount %s: %w", a.target, err)
		}
	}
	out := &removed{Key: a.key}
	if exists {
		err := sn.Remove(ctx, a.key)
		if err != nil && !errdefs.IsNotFound(err) { // NotFound: removed meanwhile
			return nil, fmt.Errorf("remove snapshot %s: %w", a.key, err)
		}
		out.Removed = err == nil
	}
	if dirExists {
		// rmdir, not os.Remove: only an empty directory goes.
		if err := syscall.Rmdir(a.target); err != nil && !errors.Is(err, syscall.ENOTEMPTY) &&
			!errors.Is(err, syscall.EEXIST) && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("remove target %s: %w", a.target, err)
		}
	}
	return out, nil
}

// isMountPoint: whether dir is itself a mount point (false if it does not exist).
func isMountPoint(dir string) (bool, error) {
	canon, err := mount.CanonicalizePath(dir)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	info, err := mount.Lookup(canon)
	if err != nil {
		return false, err
	}
	return info.Mountpoint == canon, nil
}
