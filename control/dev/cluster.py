"""A real Kubernetes cluster on this one machine, for tests, benchmarks and
users trying thaw (issue 29; docs/cluster.md): etcd, kube-apiserver,
kube-controller-manager and kube-scheduler in the host's namespaces, and two
nodes (control/dev/clusternode.py), each its own containerd and kubelet in
mount and network namespaces of its own, pods on a real CNI network (ptp).
The binaries are the pinned upstream builds of ci/build-cluster.sh.

    c = Cluster(Path("/var/tmp/thaw-cluster/dev"), "dev").start()
    c.kubectl("get", "nodes")        # KUBECONFIG=c.kubeconfig works for any client
    c.stop()                         # every process, mount, netns, veth, cgroup and file gone

`python -m control.dev.cluster up|down` is `make cluster` / `make cluster-down`.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

from control import config as configmod
from control.dev import cgroups, ocibuild
from control.dev.clusternode import CONTAINERD_SOCKET, OVERLAID, RUNSC_ROOT, Node, NodeNet, ip
from control.dev.pki import Pki, kubeconfig
from control.dev.seaweed import free_ports
from control.errors import PreconditionError, ThawError, Timeout, UserError
from control.node import containerd_config

BUILD = configmod.REPO_ROOT / "build"
NODE_LETTERS = ("a", "b")
MARK = ".thaw-cluster"        # what says a base directory is a Cluster's, its contents ours to remove
PAUSE_IMAGE = "thaw.dev/cluster/pause:1"       # CRI's sandbox image (pinned in containerd's config)
BUSYBOX_IMAGE = "thaw.dev/cluster/busybox:1"   # a shell for test pods; imported on every node
RUNSC_CLASS = "runsc"         # the RuntimeClass of plain gVisor (the node's `runsc` handler)
API_PORT = 6443
# Addresses, by the cluster's index k (1-120; distinct from 10.213-10.216, which
# thaw's sandboxes and the CRI tests use): the bridge and node addresses
# 10.217.k.0/24, node n's pods 10.218.(2k+n).0/24, services 10.219.k.0/24.
NODE_NET, POD_NET, SERVICE_NET = "10.217", "10.218", "10.219"
NEEDED = ("k8s/kube", "k8s/etcd", "containerd", "ctr", "crictl", "runc", "containerd-shim-runc-v2",
          "containerd-shim-runsc-v1", "runsc", "cni-bin/ptp", "cni-bin/host-local", "cni-bin/loopback",
          "busybox")


def index_of(name: str) -> int:
    return 1 + zlib.crc32(name.encode()) % 120


class Cluster:
    def __init__(self, base: Path, name: str, index: int | None = None, build: Path = BUILD) -> None:
        if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?", name):
            raise UserError(f"cluster name {name!r} must be a DNS label of at most 32 characters")
        self.base, self.name, self.build = Path(base).resolve(), name, build
        for d in (*OVERLAID, "/run", "/proc", "/sys"):
            if str(self.base) == d or str(self.base).startswith(d + "/"):
                raise UserError(f"cluster base {self.base} is under {d}, which a node sees as its own: "
                                f"choose another (e.g. /var/tmp/thaw-cluster/{name})")
        saved = self._saved()
        self.index = index or saved.get("index") or index_of(name)
        if not 1 <= self.index <= 120:
            raise UserError(f"cluster index {self.index} must be 1-120")
        k = self.index
        self.host_address = f"{NODE_NET}.{k}.1"
        self.api_url = f"https://{self.host_address}:{API_PORT}"
        self.bridge = f"thk{k}"
        self.service_cidr = f"{SERVICE_NET}.{k}.0/24"
        self.cgroup = f"/thaw-cluster-{name}"
        self.pki = Pki(self.base / "pki")
        self.procs: list[subprocess.Popen] = []   # the control plane this object started (stop reaps them)
        self.kubeconfig = self.base / "kubeconfig"
        ips = [f"{NODE_NET}.{k}.{2 + i}" for i in range(len(NODE_LETTERS))]
        cidrs = [f"{POD_NET}.{2 * k + i}.0/24" for i in range(len(NODE_LETTERS))]
        self.nodes = [
            Node(name, letter, self.base / "nodes" / letter, build,
                 NodeNet(ip=ips[i], gateway=self.host_address, prefix=24, pod_cidr=cidrs[i], bridge=self.bridge,
                         veth=f"thk{k}{letter}",
                         routes=tuple((cidrs[j], ips[j]) for j in range(len(ips)) if j != i)),
                 f"{self.cgroup}/{letter}")
            for i, letter in enumerate(NODE_LETTERS)]

    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if name in (n.name, n.letter):
                return n
        raise UserError(f"cluster {self.name} has no node {name!r} (nodes: {', '.join(self.node_names)})")

    def _saved(self) -> dict:
        try:
            return json.loads((self.base / "cluster.json").read_text())
        except (OSError, ValueError):
            return {}

    # -- clients ---------------------------------------------------------------
    def kubectl(self, *args: str, check: bool = True, timeout: float = 60,
                input: str | None = None) -> subprocess.CompletedProcess:
        argv = [str(self.build / "k8s" / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input,
                           stdin=None if input is not None else subprocess.DEVNULL)
        if check and p.returncode != 0:
            raise ThawError(f"kubectl {' '.join(args[:4])} failed (exit {p.returncode}): {p.stderr.strip()[-1500:]}",
                            returncode=p.returncode)
        return p

    def apply(self, manifest: dict | str) -> None:
        self.kubectl("apply", "-f", "-", input=manifest if isinstance(manifest, str) else json.dumps(manifest))

    def import_image(self, archive: Path) -> list[str]:
        """An OCI archive into every node's CRI image store (there is no registry)."""
        refs: list[str] = []
        for n in self.nodes:
            refs = n.import_image(archive)
        return refs

    def wait_nodes_ready(self, timeout_s: float = 120) -> None:
        end = time.monotonic() + timeout_s
        while True:
            p = self.kubectl("get", "nodes", "-o", "json", check=False)
            ready = set()
            if p.returncode == 0:
                for item in json.loads(p.stdout)["items"]:
                    if any(c["type"] == "Ready" and c["status"] == "True" for c in item["status"].get("conditions", [])):
                        ready.add(item["metadata"]["name"])
            if ready >= set(self.node_names):
                return
            if time.monotonic() > end:
                raise Timeout(f"nodes {sorted(set(self.node_names) - ready)} of cluster {self.name} to be Ready "
                              f"(kubelet logs under {self.base}/nodes)", timeout_s)
            time.sleep(0.5)

    # -- start -----------------------------------------------------------------
    def start(self, timeout_s: float = 180) -> "Cluster":
        missing = [b for b in NEEDED if not os.access(self.build / b, os.X_OK)]
        if missing:
            raise PreconditionError(f"cluster binaries not built in {self.build}: {', '.join(missing)} "
                                    f"(run `make setup`: ci/build-cluster.sh)")
        self.stop()
        if subprocess.run(["ip", "link", "show", self.bridge], capture_output=True).returncode == 0:
            raise PreconditionError(f"bridge {self.bridge} (cluster index {self.index}) is another cluster's: "
                                    f"stop that one or give this one another index")
        self.base.mkdir(parents=True, exist_ok=True)
        if any(p.name != MARK for p in self.base.iterdir()):
            raise PreconditionError(f"{self.base} holds files that are not a cluster's: choose an empty directory")
        (self.base / MARK).write_text("")
        (self.base / "cluster.json").write_text(json.dumps({"name": self.name, "index": self.index}))
        for d in ("logs", "pids", "images"):
            (self.base / d).mkdir()
        try:
            self._start(time.monotonic() + timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, deadline: float) -> None:
        self._pki()
        self._images()
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.host_address}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        cgroups.create(self.cgroup)
        etcd_client, etcd_peer, cm_port, sched_port = free_ports(4)
        self._spawn("etcd", [
            str(self.build / "k8s" / "etcd"), "--name=default", f"--data-dir={self.base / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_client}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_client}",
            f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-cluster=default=http://127.0.0.1:{etcd_peer}",
            # A throwaway cluster: losing it to a power cut is fine, waiting on fsync is not.
            "--unsafe-no-fsync", "--log-level=warn"])
        pki = self.pki.dir
        self._spawn("kube-apiserver", [
            str(self.build / "k8s" / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{etcd_client}",
            f"--bind-address={self.host_address}", f"--advertise-address={self.host_address}",
            f"--secure-port={API_PORT}", f"--cert-dir={pki / 'apiserver-generated'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet.key'}",
            f"--kubelet-certificate-authority={pki / 'ca.crt'}",
            "--kubelet-preferred-address-types=InternalIP",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={self.service_cidr}",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            # thaw's DaemonSet is privileged (hostPID, host paths): the API server refuses
            # privileged pods unless told.
            "--allow-privileged=true", "--profiling=false", "--v=1"])
        self._wait_api(deadline)
        common = [f"--bind-address=127.0.0.1", "--leader-elect=false", "--profiling=false", "--v=1"]
        self._spawn("kube-controller-manager", [
            str(self.build / "k8s" / "kube-controller-manager"), *common, f"--secure-port={cm_port}",
            *self._component_kubeconfig("controller-manager"), f"--cert-dir={pki / 'cm-generated'}",
            "--use-service-account-credentials=true", f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}", f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}"])
        self._spawn("kube-scheduler", [
            str(self.build / "k8s" / "kube-scheduler"), *common, f"--secure-port={sched_port}",
            *self._component_kubeconfig("scheduler"), f"--cert-dir={pki / 'scheduler-generated'}"])
        for n in self.nodes:
            self._start_node(n, deadline)
        self.apply({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": RUNSC_CLASS},
                    "handler": RUNSC_CLASS})
        self.wait_nodes_ready(max(1.0, deadline - time.monotonic()))
        # A pod is refused until the controller-manager has made its namespace's
        # default ServiceAccount; the cluster is usable once `default` has one.
        while self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise Timeout("the default ServiceAccount (kube-controller-manager: logs/kube-controller-manager.log)", 0)
            time.sleep(0.3)

    def _pki(self) -> None:
        ca = self.pki.create_ca(f"thaw-cluster-{self.name}")
        self.pki.service_account_keys()
        svc_ip = f"{SERVICE_NET}.{self.index}.1"   # the `kubernetes` Service: the range's first address
        self.pki.issue("apiserver", "kube-apiserver", server=True, ips=(self.host_address, svc_ip),
                       dns=("kubernetes", "kubernetes.default", "kubernetes.default.svc",
                            "kubernetes.default.svc.cluster.local", "localhost"))
        self.pki.issue("apiserver-kubelet", "kube-apiserver-kubelet-client", ("system:masters",), client=True)
        admin = self.pki.issue("admin", "thaw-admin", ("system:masters",), client=True)
        kubeconfig(self.kubeconfig, self.api_url, ca.crt, admin, "thaw-admin")
        for comp, user in (("controller-manager", "system:kube-controller-manager"),
                           ("scheduler", "system:kube-scheduler")):
            kubeconfig(self.base / f"{comp}.kubeconfig", self.api_url, ca.crt,
                       self.pki.issue(comp, user, client=True), user)
        for n in self.nodes:
            n.dir.mkdir(parents=True, exist_ok=True)
            # The Node authorizer and NodeRestriction know a kubelet by this identity.
            kubeconfig(n.dir / "kubelet.kubeconfig", self.api_url, ca.crt,
                       self.pki.issue(f"kubelet-{n.letter}", f"system:node:{n.name}", ("system:nodes",),
                                      client=True), f"system:node:{n.name}")
            self.pki.issue(f"kubelet-{n.letter}-serving", n.name, server=True, ips=(n.net.ip,), dns=(n.name,))

    def _component_kubeconfig(self, comp: str) -> list[str]:
        k = self.base / f"{comp}.kubeconfig"
        return [f"--kubeconfig={k}", f"--authentication-kubeconfig={k}", f"--authorization-kubeconfig={k}"]

    def _images(self) -> None:
        files = ocibuild.busybox_files(self.build / "busybox", {
            f"/bin/{a}": ocibuild.File(link="busybox") for a in ("hostname", "uname", "wget", "ps", "grep")})
        ocibuild.build(self.base / "images" / "pause.tar", PAUSE_IMAGE, files,
                       ["sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"])
        ocibuild.build(self.base / "images" / "busybox.tar", BUSYBOX_IMAGE, files, ["sh"])

    def _start_node(self, n: Node, deadline: float) -> None:
        cni = n.dir / "cni"
        cni.mkdir(parents=True, exist_ok=True)
        # ptp: a veth pair per pod in the node's namespace; host-local keeps its leases
        # with the node (its default, /var/lib/cni, would be the node's overlay).
        (cni / "10-thaw-cluster.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "thaw-cluster", "plugins": [{
                "type": "ptp", "ipam": {"type": "host-local", "ranges": [[{"subnet": n.net.pod_cidr}]],
                                        "dataDir": str(n.dir / "cni-ipam"), "routes": [{"dst": "0.0.0.0/0"}]}}]}))
        (n.dir / "empty.toml").write_text("")
        settings = configmod.load(environ={}, config_file=n.dir / "empty.toml")
        (n.dir / "runsc.toml").write_text(containerd_config.runsc_toml(
            settings, self.build / "runsc", root=Path(RUNSC_ROOT), log_path=f"{n.dir}/shim-logs/"))
        pki = self.pki.dir
        kubelet = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            # This machine mounts cgroup v1 only; kubelet 1.35+ refuses it unless told
            # (pkg/kubelet/apis/config/validation/validation_linux.go).
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": n.cgroup,
            "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
            "address": n.net.ip, "port": 10250, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
            "tlsCertFile": str(pki / f"kubelet-{n.letter}-serving.crt"),
            "tlsPrivateKeyFile": str(pki / f"kubelet-{n.letter}-serving.key"),
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(pki / "ca.crt")}},
            "authorization": {"mode": "Webhook"},
            # Fail rather than write the machine's sysctls (the node shows it the values it wants).
            "protectKernelDefaults": True,
            "clusterDomain": "cluster.local",
            # Its default is under /usr, which is the host's, not the node's.
            "volumePluginDir": "/var/lib/kubelet/volume-plugins",
            # The machine's disk is shared with other work: evict only when it is nearly full.
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "2%", "imagefs.available": "2%",
                             "nodefs.inodesFree": "2%"},
        }
        containerd = _containerd_config(self.build, n, PAUSE_IMAGE)
        n.start(containerd, kubelet, [f"--kubeconfig={n.dir / 'kubelet.kubeconfig'}", f"--hostname-override={n.name}",
                                      f"--node-ip={n.net.ip}", "--v=1"],
                [self.base / "images" / "pause.tar", self.base / "images" / "busybox.tar"],
                timeout_s=max(1.0, deadline - time.monotonic()))

    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.base / "logs" / f"{name}.log", "ab") as log:
            p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True, cwd=self.base)
        (self.base / "pids" / f"{name}.pid").write_text(str(p.pid))
        self.procs.append(p)

    def _wait_api(self, deadline: float) -> None:
        while True:
            p = self.kubectl("get", "--raw", "/readyz", check=False, timeout=10)
            if p.returncode == 0 and p.stdout.strip() == "ok":
                return
            for comp in ("etcd", "kube-apiserver"):
                if _pid_of(self.base, comp) is None:
                    raise PreconditionError(f"{comp} exited: {_tail(self.base / 'logs' / f'{comp}.log')}")
            if time.monotonic() > deadline:
                raise Timeout(f"the API server to be ready ({p.stderr.strip()[-300:]})", 0)
            time.sleep(0.3)

    # -- stop ------------------------------------------------------------------
    def stop(self) -> None:
        """Everything start made, gone: node processes and cgroups, the control plane,
        the bridge (and with it the host routes), the base directory. Also cleans up
        what a killed run left (it finds it by the base, the name and the index)."""
        if self.base.exists() and not (self.base / MARK).exists() and any(self.base.iterdir()):
            raise PreconditionError(f"{self.base} is not a cluster's directory (no {MARK}): not touching it")
        errors: list[str] = []
        for n in self.nodes:
            try:
                n.stop()
            except (ThawError, OSError, subprocess.SubprocessError) as e:
                errors.append(f"node {n.name}: {e}")
        for comp in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            _stop_pid(self.base, comp)
        for p in self.procs:
            p.wait(10)
        self.procs.clear()
        try:
            cgroups.kill_all(self.cgroup)
            cgroups.remove(self.cgroup)
        except ThawError as e:
            errors.append(str(e))
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        for n in self.nodes:   # normally gone with the node's network namespace
            subprocess.run(["ip", "link", "del", n.net.veth], capture_output=True)
        if self.base.exists():
            shutil.rmtree(self.base, ignore_errors=True)
            if self.base.exists():
                errors.append(f"{self.base} could not be removed")
        if errors:
            raise ThawError(f"cluster {self.name} did not stop cleanly: " + "; ".join(errors))

    def leftovers(self) -> list[str]:
        """What of this cluster is still on the machine (empty after stop)."""
        out = []
        if self.base.exists():
            out.append(str(self.base))
        if subprocess.run(["ip", "link", "show", self.bridge], capture_output=True).returncode == 0:
            out.append(f"bridge {self.bridge}")
        out += [f"veth {n.net.veth}" for n in self.nodes
                if subprocess.run(["ip", "link", "show", n.net.veth], capture_output=True).returncode == 0]
        out += [f"cgroup {h / self.cgroup.lstrip('/')}" for h in cgroups.hierarchies()
                if (h / self.cgroup.lstrip("/")).exists()]
        marker = str(self.base).encode()
        for p in Path("/proc").glob("[0-9]*/cmdline"):
            if int(p.parent.name) == os.getpid():
                continue
            try:
                if marker in p.read_bytes():
                    out.append(f"process {p.parent.name}")
            except OSError:
                continue
        return out


def _containerd_config(build: Path, n: Node, pause: str) -> str:
    """The node's /etc/containerd/config.toml: a node's defaults (root, state, socket),
    the drop-in directory `thaw provision` writes to, runc as the default runtime and
    plain gVisor as `runsc`. containerd v2.4 config keys (internal/cri/config)."""
    s = json.dumps
    rt = 'plugins."io.containerd.cri.v1.runtime"'
    return "\n".join([
        "# Written by control/dev/cluster.py for node " + n.name,
        "version = 3", 'root = "/var/lib/containerd"', 'state = "/run/containerd"',
        'imports = ["/etc/containerd/conf.d/*.toml"]',
        'disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", '
        '"io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile", '
        '"io.containerd.snapshotter.v1.erofs"]',
        "", "[grpc]", f"  address = {s(CONTAINERD_SOCKET)}", "[ttrpc]", f"  address = {s(CONTAINERD_SOCKET + '.ttrpc')}",
        "", '[plugins."io.containerd.cri.v1.images".pinned_images]', f"  sandbox = {s(pause)}",
        "", f"[{rt}]",
        # CRI asks oom_score_adj -998 for the sandbox; this VM's root lacks
        # CAP_SYS_RESOURCE to set it (ci/cri.sh says more). A real node does not need this.
        "  restrict_oom_score_adj = true",
        f"[{rt}.cni]", f"  bin_dirs = [{s(str(build / 'cni-bin'))}]", f"  conf_dir = {s(str(n.dir / 'cni'))}",
        f"[{rt}.containerd]", '  default_runtime_name = "runc"',
        f"[{rt}.containerd.runtimes.runc]", '  runtime_type = "io.containerd.runc.v2"',
        f"  runtime_path = {s(str(build / 'containerd-shim-runc-v2'))}",
        f"  [{rt}.containerd.runtimes.runc.options]", f"    BinaryName = {s(str(build / 'runc'))}",
        "    SystemdCgroup = false", "",
        containerd_config.runtime_table(RUNSC_CLASS, build / "containerd-shim-runsc-v1", n.dir / "runsc.toml")])


def _pid_of(base: Path, name: str) -> int | None:
    """The pid of control-plane process `name` if it is alive and still ours (its argv names base)."""
    try:
        pid = int((base / "pids" / f"{name}.pid").read_text())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if str(base).encode() in argv else None


def _stop_pid(base: Path, name: str, grace_s: float = 15) -> None:
    pid = _pid_of(base, name)
    if pid is None:
        return
    os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while _pid_of(base, name) == pid:
        if time.monotonic() > end:
            os.kill(pid, signal.SIGKILL)
            end += 5
        time.sleep(0.1)


def _tail(p: Path) -> str:
    try:
        return p.read_text(errors="replace")[-1500:]
    except OSError:
        return "(no log)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m control.dev.cluster", description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=("up", "down"))
    ap.add_argument("--base", type=Path, default=Path("/var/tmp/thaw-cluster/dev"))
    ap.add_argument("--name", default="dev")
    a = ap.parse_args(argv)
    try:
        c = Cluster(a.base, a.name)
        if a.action == "down":
            c.stop()
            print(f"cluster {a.name} is down")
            return 0
        c.start()
    except ThawError as e:
        print(f"cluster: error: {e}", file=sys.stderr)
        return 1
    print(f"cluster {a.name} is up: nodes {', '.join(c.node_names)}; "
          f"`make cluster-down` stops it. To reach it:")
    print(f"export KUBECONFIG={c.kubeconfig} PATH={c.build / 'k8s'}:$PATH; kubectl get nodes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
