"""One node of the dev cluster (control/dev/cluster.py): a containerd and a
kubelet on this machine that look to Kubernetes, and to a DaemonSet's host
paths, like a machine of their own. docs/cluster.md says why each piece is so.

- Namespaces: a holder process (`unshare --mount --net`, then `sleep`) keeps
  the node's mount and network namespaces; containerd, the kubelet and every
  command the harness runs "on the node" enter them (`nsenter -t HOLDER`).
  Nothing is bind-mounted on the host to keep them: when the node's last
  process is gone, so are its namespaces, their mounts and its veths.
- Filesystem: in the node's mount namespace /etc, /opt, /var/lib and /var/log
  are overlays of the host's (writes land in the node's upper directory, the
  host's files are untouched), and the directories a node's software owns are
  bind mounts of the node's own: /run, /etc/containerd, /etc/thaw, /etc/cdi,
  /opt/thaw, /var/lib/{containerd,kubelet,thaw}, /var/log/{pods,containers,thaw}.
  thaw's DaemonSet, as users deploy it, sees through its hostPath volumes the
  node's, not the machine's; `mount --make-rshared /` gives its Bidirectional
  /run what a systemd host gives it.
- The kernel tunables the kubelet insists on (vm.overcommit_memory=1,
  kernel.panic=10, ...: pkg/kubelet/cm/container_manager_linux.go
  setupKernelTunables) are machine-wide; the node's /proc/sys shows the kubelet
  files holding the values it wants, and protectKernelDefaults makes it fail
  rather than write the real ones.
- Network: the namespace's eth0 is one end of a veth whose other end is a port
  of the cluster's bridge on the host; routes to the other node's pod range go
  through that node's address; the pods' veths (CNI ptp) live in the node's
  namespace.
- cgroups (v1, cgroupfs): every node process runs in <root>/<letter>/node, the
  kubelet's pods under <root>/<letter>/kubepods (its cgroupRoot); stopping a
  node kills whatever is left in <root>/<letter> and removes the directories.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from control.dev import cgroups
from control.errors import PreconditionError, ThawError, Timeout

# Directories the node owns: node path -> its directory under <node>/fs.
OWN_DIRS = ("/run", "/etc/containerd", "/etc/thaw", "/etc/cdi", "/opt/thaw", "/var/lib/containerd",
            "/var/lib/kubelet", "/var/lib/thaw", "/var/log/pods", "/var/log/containers", "/var/log/thaw")
# Host directories the node sees copy-on-write (mount points for OWN_DIRS are made in them).
OVERLAID = ("/etc", "/opt", "/var/lib", "/var/log")
# What the kubelet's setupKernelTunables wants (k8s.io/component-helpers/node/util/sysctl at the pin).
KERNEL_TUNABLES = {"vm/overcommit_memory": "1", "vm/panic_on_oom": "0", "kernel/panic": "10",
                   "kernel/panic_on_oops": "1", "kernel/keys/root_maxkeys": "1000000",
                   "kernel/keys/root_maxbytes": "25000000"}
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"   # the node's view; containerd.address's default
CRI_NAMESPACE = "k8s.io"
# The node's containerd restarts as `systemctl restart containerd` would restart a
# node's: this script (in the node's /run, so a pod with the node's /run and hostPID
# reaches it) stops it and waits for the supervisor to bring the next one up.
RESTART_SCRIPT = "/run/thaw-cluster/restart-containerd"
SUPERVISE_SCRIPT = "/run/thaw-cluster/supervise-containerd"
RESTART_COMMAND = ("sh", RESTART_SCRIPT)   # containerd.restart_command for this node's thaw config
RUNSC_ROOT = "/run/containerd/runsc-plain"   # the plain `runsc` handler's (provision's runsc-thaw uses /run/containerd/runsc)


@dataclass(frozen=True)
class NodeNet:
    ip: str            # eth0 in the node's namespace: its InternalIP
    gateway: str       # the cluster bridge's address on the host
    prefix: int
    pod_cidr: str
    bridge: str        # the host's bridge
    veth: str          # the host end of the node's veth
    routes: tuple[tuple[str, str], ...]   # (other node's pod range, its address)


class Node:
    def __init__(self, cluster: str, letter: str, dir: Path, build: Path, net: NodeNet, cgroup: str) -> None:
        self.cluster, self.letter, self.dir, self.build, self.net = cluster, letter, dir, build, net
        self.name = f"{cluster}-{letter}"
        self.cgroup = cgroup           # e.g. /thaw-cluster-dev/a: the kubelet's cgroupRoot
        self.fs = dir / "fs"
        # The daemons this object started, reaped by stop(); a node started by another
        # process (`make cluster`) is stopped through its pid files and cgroup alone.
        self.procs: list[subprocess.Popen] = []

    # -- paths ---------------------------------------------------------------
    def host_path(self, node_path: str) -> Path:
        """Where a path under one of the node's own directories is on the host."""
        for d in OWN_DIRS:
            if node_path == d or node_path.startswith(d + "/"):
                return self.fs / node_path.lstrip("/")
        raise ValueError(f"{node_path} is not under a directory the node owns ({', '.join(OWN_DIRS)})")

    @property
    def socket(self) -> Path:
        """containerd's socket, as the host reaches it."""
        return self.host_path(CONTAINERD_SOCKET)

    def holder_pid(self) -> int | None:
        try:
            pid = int((self.dir / "holder.pid").read_text())
        except (OSError, ValueError):
            return None
        return pid if cgroups.member(pid, self.cgroup) else None

    # -- commands on the node -------------------------------------------------
    def _argv(self, argv: list[str], join_cgroup: bool) -> list[str]:
        holder = self.holder_pid()
        if holder is None:
            raise PreconditionError(f"node {self.name} is not running (no holder process)")
        enter = ["nsenter", "-t", str(holder), "-m", "-n", "--", *argv]
        if not join_cgroup:
            return enter
        join = "; ".join(f"echo $$ > {shlex.quote(str(p))}" for p in cgroups.procs_files(self.cgroup + "/node"))
        return ["sh", "-c", join + '; exec "$@"', "node-exec", *enter]

    def run(self, *argv: str, check: bool = True, timeout: float = 60, input: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """`argv` in the node's mount and network namespaces (and its cgroup)."""
        p = subprocess.run(self._argv(list(argv), True), capture_output=True, text=True, timeout=timeout,
                           input=input, stdin=None if input is not None else subprocess.DEVNULL,
                           env=env or _env(self.build))
        if check and p.returncode != 0:
            raise ThawError(f"on node {self.name}: {' '.join(argv[:4])} failed (exit {p.returncode}): "
                            f"{p.stderr.strip()[-800:]}", returncode=p.returncode)
        return p

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        """A daemon of the node in its own session, output to <node>/<name>.log, pid in <name>.pid."""
        with open(self.dir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(self._argv(argv, True), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, env=_env(self.build))
        (self.dir / f"{name}.pid").write_text(str(proc.pid))
        self.procs.append(proc)
        return proc

    def ctr(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        """`ctr` against the node's containerd, in CRI's namespace."""
        argv = [str(self.build / "ctr"), "--address", str(self.socket), "--namespace", CRI_NAMESPACE, *args]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if check and p.returncode != 0:
            raise ThawError(f"ctr on node {self.name}: {' '.join(args[:3])} failed: {p.stderr.strip()[-500:]}")
        return p

    def crictl(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        argv = [str(self.build / "crictl"), "--runtime-endpoint", f"unix://{self.socket}",
                "--image-endpoint", f"unix://{self.socket}", "--timeout", "30s", *args]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if check and p.returncode != 0:
            raise ThawError(f"crictl on node {self.name}: {' '.join(args[:3])} failed: {p.stderr.strip()[-500:]}")
        return p

    def import_image(self, archive: Path, pin: bool = True) -> list[str]:
        """An OCI archive into the node's CRI image store; returns the names it holds.
        `pin`: the kubelet's image garbage collection never removes it (there is no
        registry to pull it back from); containerd's CRI reports an image labelled
        io.cri-containerd.pinned=pinned as pinned (internal/cri/labels)."""
        self.ctr("images", "import", "--all-platforms", *(["--label", "io.cri-containerd.pinned=pinned"] if pin else []),
                 str(archive))
        return archive_refs(archive)

    # -- start -------------------------------------------------------------------
    def start(self, containerd_config: str, kubelet_config: dict, kubelet_flags: list[str],
              images: list[Path], timeout_s: float = 60) -> None:
        for d in OWN_DIRS:
            (self.fs / d.lstrip("/")).mkdir(parents=True, exist_ok=True)
        cgroups.create(self.cgroup + "/node")
        self._start_holder()
        self._mounts()
        self._network()
        self.host_path("/etc/containerd/config.toml").write_text(containerd_config)
        self._start_containerd(timeout_s)
        for archive in images:
            self.import_image(archive)
        (self.dir / "kubelet.json").write_text(json.dumps(kubelet_config, indent=1))
        self.spawn("kubelet", [str(self.build / "k8s" / "kubelet"), f"--config={self.dir / 'kubelet.json'}",
                               *kubelet_flags])

    def _start_holder(self) -> None:
        join = "; ".join(f"echo $$ > {shlex.quote(str(p))}" for p in cgroups.procs_files(self.cgroup + "/node"))
        argv = ["sh", "-c", join + '; exec "$@"', "node-holder",
                "unshare", "--mount", "--net", "--propagation", "slave", "--", "sleep", "infinity"]
        with open(self.dir / "holder.log", "ab") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                    start_new_session=True)
        (self.dir / "holder.pid").write_text(str(proc.pid))
        self.procs.append(proc)
        # The namespaces exist once the exec'd unshare has made them (its netns differs from ours).
        end = time.monotonic() + 10
        while _ns(proc.pid, "net") == _ns(os.getpid(), "net") or _ns(proc.pid, "mnt") == _ns(os.getpid(), "mnt"):
            if proc.poll() is not None or time.monotonic() > end:
                raise PreconditionError(f"node {self.name}: the namespace holder did not start: "
                                        f"{(self.dir / 'holder.log').read_text()[-500:]}")
            time.sleep(0.02)

    def _mounts(self) -> None:
        lines = [
            "set -e",
            # A copy of another namespace's nsfs mount (another node's, a test's netns)
            # would keep that namespace alive as long as this node lives.
            "awk '$3 == \"nsfs\" {print $2}' /proc/self/mounts | sort -r | while read -r m; do umount -l \"$m\"; done",
        ]
        for d in OVERLAID:
            o = self.dir / "overlay" / d.strip("/").replace("/", "-")
            (o / "upper").mkdir(parents=True, exist_ok=True)
            (o / "work").mkdir(parents=True, exist_ok=True)
            lines.append(f"mount -t overlay thaw-node -o lowerdir={d},upperdir={o}/upper,workdir={o}/work {d}")
        for d in OWN_DIRS:
            lines.append(f"mkdir -p {d} && mount --bind {self.fs}{d} {d}")
        sysctl = self.dir / "sysctl"
        for key, value in KERNEL_TUNABLES.items():
            f = sysctl / key.replace("/", ".")
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(value + "\n")
            lines.append(f"mount --bind {f} /proc/sys/{key}")
        lines.append("mount --make-rshared /")
        self.run("sh", "-c", "\n".join(lines))

    def _network(self) -> None:
        n = self.net
        holder = self.holder_pid()
        ip("link", "add", n.veth, "type", "veth", "peer", "name", "eth0", "netns", f"/proc/{holder}/ns/net")
        ip("link", "set", n.veth, "master", n.bridge, "up")
        script = [f"ip link set lo up", f"ip addr add {n.ip}/{n.prefix} dev eth0", "ip link set eth0 up",
                  f"ip route add default via {n.gateway}",
                  *(f"ip route add {cidr} via {via}" for cidr, via in n.routes),
                  # Pods' traffic crosses the node's namespace (ptp veths), as on a node.
                  "echo 1 > /proc/sys/net/ipv4/ip_forward"]
        self.run("sh", "-c", "set -e; " + "; ".join(script))
        ip("route", "replace", n.pod_cidr, "via", n.ip, "dev", n.bridge)

    def _start_containerd(self, timeout_s: float) -> None:
        run = self.host_path("/run/thaw-cluster")
        run.mkdir(parents=True, exist_ok=True)
        (run / "restart-containerd").write_text(_RESTART)
        (run / "supervise-containerd").write_text(_SUPERVISE)
        self.spawn("containerd", ["sh", SUPERVISE_SCRIPT,
                                  str(self.build / "containerd"), str(self.build / "ctr")])
        ready = self.host_path("/run/containerd/containerd.ready")
        end = time.monotonic() + timeout_s
        while not ready.exists():
            if time.monotonic() > end:
                raise Timeout(f"node {self.name}'s containerd to answer (log {self.dir / 'containerd.log'})", timeout_s)
            time.sleep(0.1)

    # -- stop ---------------------------------------------------------------------
    def stop(self) -> list[str]:
        """Everything the node made, gone; returns what had to be killed (empty when
        every daemon stopped on its own)."""
        _term(self.dir / "kubelet.pid", self.cgroup, 20)
        if self.socket.exists():
            # Pods first, through CRI, so runtimes clean up their sandboxes.
            ids = self.crictl("pods", "-q", check=False, timeout=30).stdout.split()
            for pod in ids:
                self.crictl("stopp", pod, check=False, timeout=60)
                self.crictl("rmp", "-f", pod, check=False, timeout=60)
        stopfile = self.host_path("/run/thaw-cluster/stop")
        if stopfile.parent.exists():
            stopfile.write_text("")
        _term(self.host_path("/run/containerd/containerd.pid"), self.cgroup, 20)
        _term(self.dir / "containerd.pid", self.cgroup, 5)
        for root in (self.host_path("/run/containerd/runsc"), self.host_path(RUNSC_ROOT)):
            _runsc_force_delete(self.build / "runsc", root / CRI_NAMESPACE)
        killed = cgroups.kill_all(self.cgroup)
        for proc in self.procs:
            proc.wait(10)
        self.procs.clear()
        cgroups.remove(self.cgroup)
        return killed


def archive_refs(archive: Path) -> list[str]:
    """The image names an OCI archive's index.json gives its manifests."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        index = json.load(member) if member is not None else {}
    return [m["annotations"]["io.containerd.image.name"] for m in index.get("manifests", [])
            if "io.containerd.image.name" in m.get("annotations", {})]


def _term(pidfile: Path, cgroup: str, grace_s: float) -> None:
    """SIGTERM to the pid in `pidfile` if it is a process of the node (in its cgroup), and wait."""
    try:
        pid = int(pidfile.read_text())
    except (OSError, ValueError):
        return
    if not cgroups.member(pid, cgroup):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    end = time.monotonic() + grace_s
    while cgroups.member(pid, cgroup) and time.monotonic() < end:
        time.sleep(0.1)


def _runsc_force_delete(runsc: Path, root: Path) -> None:
    if not root.is_dir():
        return
    ids = subprocess.run([str(runsc), "--root", str(root), "list", "-q"], capture_output=True, text=True,
                         timeout=30).stdout.split()
    for cid in ids:
        subprocess.run([str(runsc), "--root", str(root), "delete", "-force", cid], capture_output=True, timeout=30)


def _ns(pid: int, kind: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return ""


def ip(*args: str) -> None:
    """`ip ARGS` (iproute2) on the host; ThawError with its stderr when it fails."""
    p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise ThawError(f"ip {' '.join(args)} failed: {p.stderr.strip()}", returncode=p.returncode)


def _env(build: Path) -> dict[str, str]:
    """A node daemon's environment: the build's binaries first (containerd finds
    its shims on PATH), nothing of the caller's THAW_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("THAW_", "KUBECONFIG"))}
    env["PATH"] = f"{build}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
    return env


# The node's containerd under a supervisor, as systemd keeps a node's: started again
# whenever it exits (provision's restart, a crash) until the stop file exists. `ready`
# holds the pid of the containerd that answers.
_SUPERVISE = """# Written by control/dev/clusternode.py: keeps this node's containerd running.
containerd=$1 ctr=$2
rm -f /run/thaw-cluster/stop
mkdir -p /run/containerd
while [ ! -e /run/thaw-cluster/stop ]; do
  rm -f /run/containerd/containerd.ready
  "$containerd" --config /etc/containerd/config.toml &
  pid=$!
  echo $pid > /run/containerd/containerd.pid
  i=0
  while [ $i -lt 600 ] && kill -0 $pid 2>/dev/null; do
    "$ctr" --address /run/containerd/containerd.sock version >/dev/null 2>&1 && { echo $pid > /run/containerd/containerd.ready; break; }
    i=$((i+1)); sleep 0.1
  done
  wait $pid
  echo "containerd $pid exited ($?)"
  sleep 0.2
done
"""

_RESTART = """#!/bin/sh
# Written by control/dev/clusternode.py: restart this node's containerd and wait
# until the next one answers (what `systemctl restart containerd` does on a node).
old=$(cat /run/containerd/containerd.pid) || exit 1
kill -TERM "$old" || exit 1
i=0
while [ "$(cat /run/containerd/containerd.ready 2>/dev/null)" = "" ] || \\
      [ "$(cat /run/containerd/containerd.ready 2>/dev/null)" = "$old" ]; do
  i=$((i+1))
  [ $i -gt 600 ] && { echo "containerd did not answer within 60 s of its restart" >&2; exit 1; }
  sleep 0.1
done
"""
