"""thawd in a Kubernetes pod (the chart's DaemonSet): the copies of its own cgroup
mounts that its host /run brings, unmounted from its view at start (issue 29).

The DaemonSet mounts the node's /run (containerd's bundles, runsc's state, the
pods' network namespaces), and a hostPath is a recursive bind. thawd's own root
file system lives under that /run (/run/containerd/io.containerd.runtime.v2.task/
k8s.io/<id>/rootfs), and runc mounts the container's cgroups there before it binds
/run: so thawd's /proc/self/mountinfo lists every cgroup v1 hierarchy twice, at
/sys/fs/cgroup/<c> and at .../rootfs/sys/fs/cgroup/<c>, both rooted at thawd's cgroup.
runsc, when it cannot clone a child into a cgroup (cgroup v1) and joins it instead,
reads its own cgroup paths from those files, and the second mount of a hierarchy
makes it fail (runsc/cgroup/cgroup.go loadPathsHelper: filepath.Rel of the path it
already made relative, "Rel: can't make . relative to ..."). That is every `runsc
restore` thawd starts through a checkpoint gofer (streamed and cache-verified
restores): each pod's restore failed and it started cold (found on the dev cluster,
docs/cluster.md).

Those copies are nobody's: thawd unmounts them in its own mount namespace. Only
there: nothing happens when thawd shares the host's mount namespace (a node's
systemd unit), and a mount whose propagation is shared (a Bidirectional /run) is
left alone, since unmounting it would reach the host.

Second, runc mounts each cgroup v1 hierarchy at /sys/fs/cgroup/<c> rooted at the
container's own cgroup, so the pods' cgroups are not there. thawd's `runsc restore`
of a pod's sandbox puts the sandbox (and its checkpoint gofer) into the pod's cgroup,
which the kubelet named from the hierarchy's root: "open /sys/fs/cgroup/cpu/<the
pod's cgroup>/...: no such file" (every restore, again). thawd mounts each of those
hierarchies again from its root, over runc's (cgroup v1 without a cgroup namespace
of its own, containerd's default there: the same tree the node sees).
"""
from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

log = logging.getLogger("thawd")

MNT_DETACH = 2
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
CGROUP_TYPES = ("cgroup", "cgroup2")


def _rows(mountinfo: str):
    """(root, mount point, optional fields, fs type, super options) of each line of a
    proc(5) mountinfo; lines that are not whole are left out."""
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 10:
            continue
        sep = fields.index("-")
        yield fields[3], fields[4], fields[6:sep], fields[sep + 1], fields[sep + 3]


def stray_cgroup_mounts(mountinfo: str) -> list[str]:
    """Mount points of cgroup file systems outside /sys/fs/cgroup and not shared
    (proc(5) mountinfo), deepest first."""
    out = []
    for _, point, optional, fstype, _ in _rows(mountinfo):
        if fstype not in CGROUP_TYPES or point == "/sys/fs/cgroup" or point.startswith("/sys/fs/cgroup/"):
            continue
        if any(o.startswith("shared:") for o in optional):
            continue
        out.append(point.replace("\\040", " "))
    return sorted(out, key=lambda p: p.count("/"), reverse=True)


def own_cgroup_v1_mounts(mountinfo: str) -> list[tuple[str, str]]:
    """(mount point, controllers) of the cgroup v1 hierarchies under /sys/fs/cgroup that
    are rooted below the hierarchy's root (runc's for a container)."""
    out = []
    for root, point, _, fstype, opts in _rows(mountinfo):
        if fstype == "cgroup" and root != "/" and point.startswith("/sys/fs/cgroup/"):
            ctl = ",".join(o for o in opts.split(",") if o not in ("rw", "ro"))
            out.append((point, ctl))
    return out


def in_own_mount_namespace(proc: Path = Path("/proc")) -> bool:
    try:
        return os.readlink(proc / "self/ns/mnt") != os.readlink(proc / "1/ns/mnt")
    except OSError:   # no /proc/1 to compare with (no hostPID): a container's namespace
        return True


def drop_stray_cgroup_mounts() -> int:
    """Unmount the copies and mount the hierarchies from their root (see the module's
    doc); how many copies went. Never raises: what stays only costs the restores that
    meet it (they start cold)."""
    if not in_own_mount_namespace():
        return 0
    try:
        points = stray_cgroup_mounts(Path("/proc/self/mountinfo").read_text())
    except OSError as e:
        log.warning("cgroup mounts not read: %s", e)
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    dropped = 0
    for p in points:
        if libc.umount2(p.encode(), MNT_DETACH) == 0:
            dropped += 1
        else:
            log.warning("cgroup mount copy %s not unmounted: %s", p, os.strerror(ctypes.get_errno()))
    if dropped:
        log.info("unmounted %d copies of this pod's cgroup mounts from its view of the host's /run "
                 "(control/thawd/podmounts.py says why)", dropped)
    try:
        own = own_cgroup_v1_mounts(Path("/proc/self/mountinfo").read_text())
    except OSError:
        own = []
    for point, ctl in own:
        if libc.umount2(point.encode(), MNT_DETACH) != 0 or \
                libc.mount(b"cgroup", point.encode(), b"cgroup", MS_NOSUID | MS_NODEV | MS_NOEXEC, ctl.encode()) != 0:
            log.warning("cgroup hierarchy %s (%s) not mounted from its root: %s", point, ctl,
                        os.strerror(ctypes.get_errno()))
    if own:
        log.info("mounted %d cgroup v1 hierarchies from their root over this pod's own "
                 "(control/thawd/podmounts.py says why)", len(own))
    return dropped
