"""control/thawd/podmounts.py: which cgroup mounts of a pod's mountinfo are the copies
its host /run brought (the chart's thawd, found on the dev cluster)."""
from __future__ import annotations

from control.thawd import podmounts

CG = "/kubepods/burstable/pod1/abc"
TASK = "/run/containerd/io.containerd.runtime.v2.task/k8s.io/abc/rootfs"
MOUNTINFO = "\n".join([
    "268 267 0:86 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs rw,mode=755",
    f"269 268 0:29 {CG} /sys/fs/cgroup/cpu rw,nosuid - cgroup cgroup rw,cpu",
    f"277 268 0:37 {CG} /sys/fs/cgroup/systemd rw,nosuid - cgroup cgroup rw,name=systemd",
    f"289 288 0:86 / {TASK}/sys/fs/cgroup rw,nosuid - tmpfs tmpfs rw,mode=755",
    f"290 289 0:29 {CG} {TASK}/sys/fs/cgroup/cpu rw,nosuid master:55 - cgroup cgroup rw,cpu",
    f"298 289 0:37 {CG} {TASK}/sys/fs/cgroup/systemd rw,nosuid - cgroup cgroup rw,name=systemd",
    f"299 289 0:38 / {TASK}/sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw",
    # A Bidirectional /run: shared with the host, never unmounted from here.
    f"300 289 0:39 {CG} /run/other/sys/fs/cgroup/pids rw shared:62 - cgroup cgroup rw,pids",
    "301 22 0:40 / /run/netns/cni-1 rw shared:5 - nsfs nsfs rw",
])


def test_the_copies_under_run_are_found_deepest_first_and_the_real_and_shared_ones_kept():
    got = podmounts.stray_cgroup_mounts(MOUNTINFO)
    assert sorted(got) == sorted([f"{TASK}/sys/fs/cgroup/cpu", f"{TASK}/sys/fs/cgroup/systemd",
                                  f"{TASK}/sys/fs/cgroup/unified"])
    assert podmounts.stray_cgroup_mounts("") == []


def test_the_hosts_own_mount_namespace_is_left_alone(tmp_path):
    for pid, ns in (("self", "mnt:[1]"), ("1", "mnt:[1]")):
        (tmp_path / pid / "ns").mkdir(parents=True)
        (tmp_path / pid / "ns" / "mnt").symlink_to(ns)
    assert not podmounts.in_own_mount_namespace(tmp_path)
    (tmp_path / "self" / "ns" / "mnt").unlink()
    (tmp_path / "self" / "ns" / "mnt").symlink_to("mnt:[2]")
    assert podmounts.in_own_mount_namespace(tmp_path)


def test_the_hierarchies_runc_rooted_at_the_container_are_named_with_their_controllers():
    info = MOUNTINFO + f"\n310 268 0:41 {CG} /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n" \
        "311 22 0:42 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids"
    assert podmounts.own_cgroup_v1_mounts(info) == [
        ("/sys/fs/cgroup/cpu", "cpu"), ("/sys/fs/cgroup/systemd", "name=systemd"),
        ("/sys/fs/cgroup/cpu,cpuacct", "cpu,cpuacct")]
