"""A fresh node becomes a thaw node with the README's commands, for real paths.

Run by tests/integration/test_fresh_node.py as
    unshare --mount --propagation private python fresh_node.py WORK ENDPOINT BUCKET CREDENTIALS
so that `thaw provision` (no --root) installs into the node's real paths
(/opt/thaw, /etc/thaw, /etc/containerd, /etc/systemd/system, /var/lib/thaw,
/var/log/thaw, /run/thaw) without touching this machine: /etc, /opt, /var
and /run are overlay mounts whose upper layers live under WORK, and only this
process and its children see them. containerd's and thaw's data directories
are bind mounts of plain directories under WORK (the overlay snapshotter
cannot put its layers on overlayfs).

Then, as on a node: containerd starts with the config provision left
(/etc/containerd/config.toml importing the drop-in); thawd starts with the
command line of the systemd unit provision wrote (this machine runs no
systemd: its ExecStart is run as systemd would, with RuntimeDirectory
/run/thaw created first); a container started through gVisor's shim with
the node's runsc.toml (/etc/thaw/runsc.toml, the handler's ConfigPath) comes
up cold, thawd checkpoints and publishes it, and the next start of the same
workload is restored. One JSON object on stdout reports every step; the
exit status is non-zero when a step failed.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from control.dev import ocibuild  # noqa: E402
from control.dev.process import stop_group  # noqa: E402
from control.dev.testbed import ANNOTATIONS, COUNTER, IMAGE  # noqa: E402

BUILD = REPO / "build"
THAW = Path(sys.executable).parent / "thaw"
SOCKET = "/run/containerd/containerd.sock"
NAMESPACE = "thaw-fresh-node"
SHIM = "/opt/thaw/bin/containerd-shim-runsc-v1"     # the drop-in's runtime_path
RUNSC_TOML = "/etc/thaw/runsc.toml"                 # the drop-in's options.ConfigPath
# Not the defaults: provision seeds them into /etc/thaw/config.toml, and thawd
# and the stand-in (under containerd, with none of this run's environment)
# must both find them there, or the second start is not restored.
THAWD_SOCKET = "/run/thaw/fresh-node/thawd.sock"
STANDIN_LOG = "/var/log/thaw/fresh-node-standin.log"


def sh(*argv: str, env: dict | None = None, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env,
                       stdin=subprocess.DEVNULL)
    if check and p.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} exited {p.returncode}: {p.stderr.strip()[-2000:]}")
    return p


def node_env() -> dict[str, str]:
    """What a root shell on a node has: no THAW_* or AWS_* from the test run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("THAW_", "AWS_"))}
    env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return env


def overlay_node_paths(work: Path) -> None:
    for path in ("/etc", "/opt", "/var", "/run"):
        name = path.strip("/")
        up, wk = work / "overlay" / name / "upper", work / "overlay" / name / "work"
        up.mkdir(parents=True, exist_ok=True)
        wk.mkdir(parents=True, exist_ok=True)
        sh("mount", "-t", "overlay", "overlay", "-o", f"lowerdir={path},upperdir={up},workdir={wk}", path)
    for path in ("/var/lib/containerd", "/var/lib/thaw", "/run/containerd"):
        src = work / "data" / path.strip("/").replace("/", "-")
        src.mkdir(parents=True, exist_ok=True)
        os.makedirs(path, exist_ok=True)
        sh("mount", "--bind", str(src), path)


def unit_exec_start(unit: Path) -> list[str]:
    for line in unit.read_text().splitlines():
        if line.startswith("ExecStart="):
            return shlex.split(line[len("ExecStart="):])
    raise RuntimeError(f"{unit} has no ExecStart")


class Node:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.procs: list[subprocess.Popen] = []
        self.report: dict = {"steps": []}

    def step(self, name: str, **facts) -> None:
        self.report["steps"].append({"step": name, **facts})
        print(f"fresh-node: {name} {facts}", file=sys.stderr, flush=True)

    def spawn(self, argv: list[str], log: str, env: dict) -> subprocess.Popen:
        p = subprocess.Popen(argv, env=env, stdout=open(self.work / log, "ab"), stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(p)
        with (self.work / "pids").open("a") as f:
            f.write(f"{p.pid}\n")
        return p

    def ctr(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        return sh(str(BUILD / "ctr"), "--address", SOCKET, "--namespace", NAMESPACE, *args,
                  env=node_env(), check=check, timeout=timeout)

    def run_container(self, cid: str) -> None:
        argv = ["run", "-d", "--null-io", "--runtime", SHIM, "--runtime-config-path", RUNSC_TOML]
        for k, v in {"io.kubernetes.cri.container-type": "sandbox", "io.kubernetes.cri.sandbox-id": cid,
                     **ANNOTATIONS}.items():
            argv += ["--annotation", f"{k}={v}"]
        self.ctr(*argv, IMAGE, cid)

    def state(self, cid: str, timeout_s: float = 60) -> tuple[str, int]:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            p = self.ctr("task", "exec", "--exec-id", f"x{time.monotonic_ns()}", cid, "cat", "/tmp/state",
                         check=False)
            if p.returncode == 0 and len(p.stdout.split()) == 2:
                boot, i = p.stdout.split()
                return boot, int(i)
            time.sleep(0.2)
        raise RuntimeError(f"container {cid} never reported its state")

    def remove(self, cid: str) -> None:
        self.ctr("task", "kill", "--signal", "SIGKILL", cid, check=False)
        end = time.monotonic() + 30
        while time.monotonic() < end and self.ctr("task", "delete", cid, check=False).returncode != 0:
            if cid not in self.ctr("task", "ls", "-q", check=False).stdout.split():
                break
            time.sleep(0.2)
        self.ctr("containers", "delete", cid, check=False)

    def thaw(self, *args: str) -> dict:
        p = sh(str(THAW), *args, "--json", env=node_env(), check=False, timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"thaw {' '.join(args)} exited {p.returncode}: {p.stderr.strip()[-3000:]}")
        return json.loads(p.stdout)

    def wait_published(self, timeout_s: float = 180) -> dict:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            ready = [e for e in self.thaw("stats")["entries"] if e["state"] == "ready"]
            if ready:
                return ready[0]
            time.sleep(0.5)
        raise RuntimeError("thawd published no image: " + (self.work / "thawd.log").read_text()[-3000:])

    def main(self, endpoint: str, bucket: str, credentials: str) -> None:
        overlay_node_paths(self.work)
        self.step("overlays", paths=["/etc", "/opt", "/var", "/run"])

        # README, "A node": the store settings, then one command.
        env = node_env() | {"THAW_STORE_ENDPOINT": endpoint, "THAW_STORE_BUCKET": bucket,
                            "THAW_STORE_CREDENTIALS_FILE": credentials, "THAW_THAWD_SOCKET": THAWD_SOCKET,
                            "THAW_STANDIN_LOG": STANDIN_LOG}
        p = sh(str(THAW), "provision", "--from", str(BUILD), "--json", env=env, check=False, timeout=300)
        prov = json.loads(p.stdout) if p.stdout.strip().startswith("{") else {}
        self.step("provision", rc=p.returncode, stderr=p.stderr[-2000:],
                  actions={s["step"]: s["action"] for s in prov.get("steps", [])})
        if p.returncode != 0:
            raise RuntimeError(f"provision failed: {p.stderr[-2000:]}")
        again = sh(str(THAW), "provision", "--from", str(BUILD), "--json", env=env, check=False, timeout=300)
        self.step("provision again", rc=again.returncode,
                  changed=[s["step"] for s in json.loads(again.stdout)["steps"]
                           if s["action"] in ("create", "update")])

        unit = Path("/etc/systemd/system/thawd.service")
        enabled = Path("/etc/systemd/system/multi-user.target.wants/thawd.service")
        self.step("unit", exists=unit.is_file(), enabled=enabled.is_symlink(),
                  config=Path("/etc/thaw/config.toml").read_text())

        # systemd would: RuntimeDirectory=thaw, then ExecStart (no THAW_* in its environment).
        os.makedirs("/run/thaw", mode=0o755, exist_ok=True)
        argv = unit_exec_start(unit)
        thawd = self.spawn(argv, "thawd.log", node_env())
        end = time.monotonic() + 60
        while not Path(THAWD_SOCKET).exists():
            if thawd.poll() is not None or time.monotonic() > end:
                raise RuntimeError("thawd did not start: " + (self.work / "thawd.log").read_text()[-3000:])
            time.sleep(0.1)
        self.step("thawd", argv=argv, pid=thawd.pid)

        # The node's containerd (here: the pinned build stands in for the distribution's).
        ctrd = self.spawn([str(BUILD / "containerd"), "--config", "/etc/containerd/config.toml"],
                          "containerd.log", node_env())
        end = time.monotonic() + 60
        while self.ctr("version", check=False).returncode != 0:
            if ctrd.poll() is not None or time.monotonic() > end:
                raise RuntimeError("containerd did not start: " + (self.work / "containerd.log").read_text()[-3000:])
            time.sleep(0.2)
        dump = sh(str(BUILD / "containerd"), "--config", "/etc/containerd/config.toml", "config", "dump",
                  env=node_env())
        self.step("containerd", handler="runsc-thaw" in dump.stdout)

        archive = self.work / "image.tar"
        ocibuild.build(archive, IMAGE, ocibuild.busybox_files(
            BUILD / "busybox", {"/app/run.sh": ocibuild.File(COUNTER, 0o755)}), ["/app/run.sh"])
        self.ctr("images", "import", "--all-platforms", str(archive))

        t = time.monotonic()
        self.run_container("first")
        boot1, n1 = self.state("first")
        self.step("first start", boot=boot1, counter=n1, seconds=round(time.monotonic() - t, 2))
        published = self.wait_published()
        self.step("published", key=published["key"])
        self.remove("first")

        t = time.monotonic()
        self.run_container("second")
        boot2, n2 = self.state("second")
        self.step("second start", boot=boot2, counter=n2, seconds=round(time.monotonic() - t, 2))
        self.remove("second")
        decisions = [json.loads(line) for line in Path(STANDIN_LOG).read_text().splitlines()]
        self.step("stand-in decisions", decisions=[{k: d.get(k) for k in ("id", "decision", "reason")}
                                                   for d in decisions])
        doctor = sh(str(THAW), "doctor", "--json", env=node_env(), check=False, timeout=120)
        self.step("doctor", rc=doctor.returncode,
                  checks={c["name"]: c["status"] for c in json.loads(doctor.stdout)["checks"]}
                  if doctor.stdout.strip().startswith("{") else doctor.stdout[-1000:])

    def cleanup(self) -> None:
        for cid in self.ctr("task", "ls", "-q", check=False).stdout.split():
            self.remove(cid)
        for cid in self.ctr("containers", "ls", "-q", check=False).stdout.split():
            self.ctr("containers", "delete", cid, check=False)
        for p in reversed(self.procs):
            if p.poll() is None:
                stop_group(p, 20, kill_wait_s=10)
        sh("pkill", "-9", "-f", f"containerd-shim-runsc-v1.*{SOCKET}", check=False)


def main() -> int:
    work, endpoint, bucket, credentials = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    node = Node(work)
    rc = 0
    try:
        node.main(endpoint, bucket, credentials)
    except Exception as e:  # noqa: BLE001 - reported, with the steps done before it
        node.report["error"] = f"{e}\n{traceback.format_exc()}"
        rc = 1
    finally:
        try:
            node.cleanup()
        except Exception as e:  # noqa: BLE001
            node.report["cleanup_error"] = repr(e)
            rc = 1
    print(json.dumps(node.report))
    return rc


if __name__ == "__main__":
    sys.exit(main())
