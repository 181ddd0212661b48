"""A private containerd (own root, state and socket) and a `ctr` client for it.

The integration tests, the containerd benchmark and the worked example use
it: the real containerd and gVisor's real shim from the build directory, the
shim's runsc.toml from control/node/containerd_config.py, no registry (images are
imported from local OCI archives).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from control import config as configmod
from control.node import containerd_config
from control.config import Settings
from control.dev.process import stop_group
from control.errors import PreconditionError, ThawError, Timeout
from runsc_hooks.runsc import remove_root

RUNTIME = "io.containerd.runsc.v1"
NAMESPACE = "thaw"


class CtrError(ThawError):
    def __init__(self, argv: list[str], rc: int, stderr: str) -> None:
        super().__init__(f"ctr {' '.join(argv[3:6])} failed (exit {rc}): {stderr.strip()[-500:]}",
                         argv=argv, returncode=rc)
        self.stderr = stderr


@dataclass
class PrivateContainerd:
    base: Path                # everything lives under here
    build: Path               # containerd, ctr, containerd-shim-runsc-v1, runsc, thaw-runsc
    settings: Settings
    use_standin: bool = True

    def __post_init__(self) -> None:
        self.socket = self.base / "containerd.sock"
        self.runsc_root = self.base / "runsc-root"
        self.runsc_toml = self.base / "runsc.toml"
        self.config_file = self.base / "thaw-config.toml"
        self.settings = configmod.replace(self.settings, standin_state_dir=self.base / "standin",
                                          standin_log=self.base / "standin.log")
        self.proc: subprocess.Popen | None = None

    def env(self) -> dict[str, str]:
        """Environment for containerd (and so the shim and the stand-in): the
        stand-in reads its keys from config_file, as on a node it reads
        /etc/thaw/config.toml; runsc is the build's (a node's is beside the stand-in)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("THAW_")}
        env["PATH"] = f"{self.build}:{env.get('PATH', '/usr/bin:/bin')}"
        env["THAW_REAL_RUNSC"] = str(self.build / "runsc")
        env["THAW_CONFIG"] = str(self.config_file)
        return env

    def start(self, timeout_s: float = 30.0) -> "PrivateContainerd":
        for b in ("containerd", "ctr", "containerd-shim-runsc-v1", "runsc") + (("thaw-runsc",) if self.use_standin else ()):
            if not (self.build / b).is_file():
                raise PreconditionError(f"{b} is not built in {self.build}: run `make setup`")
        self.base.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(configmod.render_toml(
            [(k, v) for k, v in configmod.values(self.settings) if k.standin],
            header=("# The stand-in's keys, from the settings thawd runs with (control/dev/containerd.py).",)))
        binary = self.build / ("thaw-runsc" if self.use_standin else "runsc")
        # The shim's logs where a provisioned node has them (<node.log_dir>/shim/, the
        # runsc_toml default), which is where the stand-in bounds them at each delete
        # (standin.shim_logs_keep): in a directory of their own they grew by one file per
        # container for ever (tests/integration/test_soak.py found it).
        (self.settings.log_dir / "shim").mkdir(parents=True, exist_ok=True)
        self.runsc_toml.write_text(containerd_config.runsc_toml(self.settings, binary, root=self.runsc_root))
        cfg = self.base / "config.toml"
        cfg.write_text(containerd_config.private_containerd_config(
            self.base / "root", self.base / "state", self.socket,
            disabled_plugins=["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime",
                              "io.containerd.cri.v1.images", "io.containerd.snapshotter.v1.btrfs",
                              "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
                              "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs"]))
        self.log = open(self.base / "containerd.log", "ab")
        self.proc = subprocess.Popen([str(self.build / "containerd"), "--config", str(cfg)], env=self.env(),
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise PreconditionError(f"containerd exited ({self.proc.returncode}); see {self.base}/containerd.log")
            if self.socket.exists() and self.ctr("version", check=False).returncode == 0:
                return self
            time.sleep(0.1)
        raise Timeout("private containerd start", timeout_s)

    def ctr(self, *args: str, check: bool = True, timeout_s: float = 30.0,
            ns: str = NAMESPACE) -> subprocess.CompletedProcess:
        """`ctr` against this instance in containerd namespace `ns` (thaw's tenant
        under plain containerd is the namespace: docs/security.md)."""
        argv = [str(self.build / "ctr"), "--address", str(self.socket), "--namespace", ns, *args]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=self.env(),
                           stdin=subprocess.DEVNULL)
        if check and p.returncode != 0:
            raise CtrError(argv, p.returncode, p.stderr)
        return p

    def import_image(self, archive: Path, ns: str = NAMESPACE) -> None:
        self.ctr("images", "import", "--all-platforms", str(archive), ns=ns)

    def image_digest(self, ref: str, ns: str = NAMESPACE) -> str:
        """The target digest containerd's image store holds for `ref`."""
        for line in self.ctr("images", "ls", ns=ns).stdout.splitlines()[1:]:
            f = line.split()
            if f and f[0] == ref:
                return f[2]
        raise ThawError(f"image {ref} not in namespace {ns}")

    def run(self, image: str, cid: str, annotations: dict[str, str] | None = None,
            args: list[str] | None = None, env: dict[str, str] | None = None, netns: str | None = None,
            ns: str = NAMESPACE, create_only: bool = False, mounts: list[dict] | None = None) -> None:
        """`ctr run -d` with gVisor's shim and this instance's runsc.toml; `netns`:
        a network namespace the container joins (ctr has no CNI: e.g. one thaw
        plumbed, runsc_hooks/network.py `plumb`), so the node reaches it; `ns`:
        the containerd namespace (thaw's tenant under plain containerd); with
        `create_only`, `ctr containers create` (start_task then makes the task);
        `mounts`: OCI mounts added to the image's (`ctr run --mount`), e.g.
        runsc_hooks/spec.py `host_layout` binds of the host's Python."""
        argv = ["run", "-d", "--null-io"] if not create_only else ["containers", "create"]
        argv += ["--runtime", RUNTIME, "--runtime-config-path", str(self.runsc_toml)]
        if netns:
            argv += ["--with-ns", f"network:{netns}"]
        for m in mounts or []:
            argv += ["--mount", f"type={m['type']},src={m['source']},dst={m['destination']},"
                                f"options={':'.join(m.get('options') or [])}"]
        # gVisor's shim hands the container's stdio to `runsc create` only for
        # a sandbox (pod root) container; for an unannotated one it captures
        # runsc's output through a pipe that the sandbox inherits, and create
        # never returns (pkg/shim/v1/proc/init.go Create, runsccmd cmdOutput;
        # docs/gvisor-notes.md). A lone container is its own pod's root.
        annotations = {"io.kubernetes.cri.container-type": "sandbox", "io.kubernetes.cri.sandbox-id": cid,
                       **(annotations or {})}
        for k, v in annotations.items():
            argv += ["--annotation", f"{k}={v}"]
        for k, v in (env or {}).items():
            argv += ["--env", f"{k}={v}"]
        self.ctr(*argv, image, cid, *(args or []), ns=ns)

    def start_task(self, cid: str, ns: str = NAMESPACE) -> None:
        """Start the task of a container made with run(create_only=True)."""
        self.ctr("task", "start", "-d", "--null-io", cid, ns=ns)

    def exec(self, cid: str, *cmd: str, check: bool = True, ns: str = NAMESPACE) -> subprocess.CompletedProcess:
        return self.ctr("task", "exec", "--exec-id", f"x{time.monotonic_ns()}", cid, *cmd, check=check, ns=ns)

    def remove(self, cid: str, ns: str = NAMESPACE) -> None:
        self.ctr("task", "kill", "--signal", "SIGKILL", cid, check=False, ns=ns)
        end = time.monotonic() + 20
        while time.monotonic() < end:
            if self.ctr("task", "delete", cid, check=False, ns=ns).returncode == 0:
                break
            if "not found" in self.ctr("task", "ls", check=False, ns=ns).stdout and cid not in self.ctr(
                    "task", "ls", check=False, ns=ns).stdout:
                break
            time.sleep(0.2)
        self.ctr("containers", "delete", cid, check=False, ns=ns)

    def namespaces(self) -> list[str]:
        return self.ctr("namespaces", "ls", "-q", check=False).stdout.split() or [NAMESPACE]

    def stop(self) -> None:
        namespaces = [NAMESPACE]
        if self.proc is not None:
            namespaces = self.namespaces()
            for ns in namespaces:
                for line in self.ctr("task", "ls", "-q", check=False, ns=ns).stdout.split():
                    self.remove(line, ns=ns)
                for line in self.ctr("containers", "ls", "-q", check=False, ns=ns).stdout.split():
                    self.ctr("containers", "delete", line, check=False, ns=ns)
            stop_group(self.proc, 15)
            self.proc = None
            self.log.close()
        # Shims run in their own sessions; kill any left for this instance.
        subprocess.run(["pkill", "-9", "-f", f"containerd-shim-runsc-v1.*{self.socket}"], capture_output=True)
        for mnt in reversed(_mounts_under(self.base)):
            subprocess.run(["umount", "-l", mnt], capture_output=True)
        for ns in set(namespaces) | {NAMESPACE}:
            remove_root(self.runsc_root / ns)
        remove_root(self.runsc_root)
        shutil.rmtree(self.base, ignore_errors=True)


def _mounts_under(base: Path) -> list[str]:
    out = []
    with open("/proc/self/mounts") as f:
        for line in f:
            mp = line.split()[1]
            if mp.startswith(str(base) + "/"):
                out.append(mp)
    return out
