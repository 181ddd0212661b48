"""A node installs thaw from two releases, upgrades, and uninstalls: no checkout,
no compiler, no network.

Run by tests/integration/test_release_install.py as
    unshare --mount --propagation private /usr/bin/python3 release_node.py PLAN.json
with the standard library only (the checkout and its virtualenv are hidden a
few lines in). In this private mount namespace /etc, /opt, /var, /run and
/usr/local are overlays whose upper layers live under the work directory, so
the node's real paths are written without touching this machine; /work (the
checkouts), pyenv, Go and its module cache are empty tmpfs mounts, gcc and cc
are /dev/null, and PATH is the system's. Then, as an operator would:

  1. the user's containerd config is in place (no imports: provision adds one);
  2. `install.sh --with-containerd` of the first release; `thaw --version`;
  3. through the CLI: a sandbox cold, its checkpoint, its restore (the restored
     one's log goes on from the checkpointed one's, in a writable HOME);
  4. thawd from the unit's ExecStart (this machine runs no systemd), containerd
     from the config provision left: a container cold, published to the store,
     the next start restored;
  5. `install.sh` of the second release: an upgrade (thawd restarted from the
     rewritten unit, the first release kept), the CLI image and the store's
     image restore again;
  6. `install.sh --uninstall`: containerd's configuration is byte for byte
     what it was before step 2.

One JSON object on stdout reports every step; the exit status is non-zero when
one failed.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SOCKET = "/run/containerd/containerd.sock"
NAMESPACE = "thaw-release"
SHIM = "/opt/thaw/bin/containerd-shim-runsc-v1"
RUNSC_TOML = "/etc/thaw/runsc.toml"
STANDIN_LOG = Path("/var/log/thaw/standin.log")
UNIT = Path("/etc/systemd/system/thawd.service")
THAW = "/usr/local/bin/thaw"
# The user's own containerd config, before thaw: provision adds an imports line.
USER_CONFIG = '# the node\'s own containerd config\nversion = 3\n\n[debug]\n  level = "info"\n'
# A command sandbox: HOME must be writable, and its log goes on across the restore.
WORKLOAD = ('echo "home=$HOME"; echo x > "$HOME/probe" && echo home-writable; i=0; '
            'while :; do i=$((i+1)); echo "tick $i"; sleep 0.2; done')


def sh(*argv: str, env: dict | None = None, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    if check and p.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} exited {p.returncode}: {(p.stderr or p.stdout).strip()[-3000:]}")
    return p


def node_env(**extra: str) -> dict[str, str]:
    """A root shell on a node: the system PATH, none of the test run's THAW_*/AWS_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("THAW_", "AWS_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(PATH=NODE_PATH, HOME="/root", **extra)
    return env


def tree(root: Path) -> dict[str, str]:
    """Every file of `root` (content) and directory, for a before/after comparison."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = "<dir>" if p.is_dir() and not p.is_symlink() else \
            (f"-> {os.readlink(p)}" if p.is_symlink() else p.read_text(errors="replace"))
    return out


def ticks(log: str) -> list[int]:
    return [int(line.split()[1]) for line in log.splitlines() if line.startswith("tick ")]


class Node:
    def __init__(self, plan: dict) -> None:
        self.plan = plan
        self.work = Path(plan["work"])
        self.procs: dict[str, subprocess.Popen] = {}
        self.report: dict = {"steps": []}

    def step(self, name: str, **facts) -> None:
        self.report["steps"].append({"step": name, **facts})
        print(f"release-node: {name} {json.dumps(facts)[:400]}", file=sys.stderr, flush=True)

    # -- the namespace ---------------------------------------------------------------

    def overlay_node_paths(self) -> None:
        for path in ("/etc", "/opt", "/var", "/run", "/usr/local"):
            name = path.strip("/").replace("/", "-")
            up, wk = self.work / "overlay" / name / "upper", self.work / "overlay" / name / "work"
            up.mkdir(parents=True, exist_ok=True)
            wk.mkdir(parents=True, exist_ok=True)
            sh("mount", "-t", "overlay", "overlay", "-o", f"lowerdir={path},upperdir={up},workdir={wk}", path)
        # containerd's snapshotter and thaw's O_DIRECT cache want a plain file system.
        for path in ("/var/lib/containerd", "/var/lib/thaw", "/run/containerd"):
            src = self.work / "data" / path.strip("/").replace("/", "-")
            src.mkdir(parents=True, exist_ok=True)
            os.makedirs(path, exist_ok=True)
            sh("mount", "--bind", str(src), path)

    def hide_build_tools(self) -> None:
        for d in self.plan["hide_dirs"]:
            if os.path.isdir(d):
                sh("mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", d)
        for f in self.plan["hide_files"]:
            if os.path.exists(f):
                sh("mount", "--bind", "/dev/null", f)
        found = {}
        for tool in ("go", "gcc", "cc"):
            p = shutil.which(tool, path=NODE_PATH)
            runs = False
            if p:
                try:
                    runs = subprocess.run([p, "--version"], capture_output=True, timeout=10).returncode == 0
                except OSError:
                    runs = False
            found[tool] = runs
        self.step("hidden", tools_that_run=[t for t, ok in found.items() if ok],
                  checkout_visible=Path(self.plan["checkout"]).exists() and any(Path(self.plan["checkout"]).iterdir()),
                  python=sh("python3", "-c", "import sys; print(sys.executable, sys.version.split()[0])",
                            env=node_env()).stdout.strip())

    # -- helpers ------------------------------------------------------------------------

    def thaw(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        return sh(THAW, *args, env=node_env(), check=check, timeout=timeout)

    def thaw_json(self, *args: str) -> dict:
        return json.loads(self.thaw(*args, "--json").stdout)

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        p = subprocess.Popen(argv, env=node_env(), stdout=open(self.work / f"{name}.log", "ab"),
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs[name] = p
        with (self.work / "pids").open("a") as f:
            f.write(f"{p.pid}\n")
        return p

    def stop(self, name: str) -> None:
        p = self.procs.pop(name, None)
        if p is None or p.poll() is not None:
            return
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)

    def install(self, dist: str, *args: str, store: bool = True) -> subprocess.CompletedProcess:
        env = node_env()
        if store:
            env |= {"THAW_STORE_ENDPOINT": self.plan["endpoint"], "THAW_STORE_BUCKET": self.plan["bucket"],
                    "THAW_STORE_CREDENTIALS_FILE": self.plan["credentials"]}
        t = time.monotonic()
        p = sh(str(Path(dist) / "install.sh"), *args, env=env, check=False, timeout=600)
        p.seconds = round(time.monotonic() - t, 1)  # type: ignore[attr-defined]
        return p

    def log_of(self, sid: str) -> str:
        return self.thaw("logs", sid).stdout

    def wait_ticks(self, sid: str, at_least: int, timeout_s: float = 60) -> list[int]:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            got = ticks(self.log_of(sid))
            if got and got[-1] >= at_least:
                return got
            time.sleep(0.2)
        raise RuntimeError(f"{sid} logged no tick {at_least}: {self.log_of(sid)[-1000:]}")

    def ctr(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        return sh("ctr", "--address", SOCKET, "--namespace", NAMESPACE, *args, env=node_env(), check=check,
                  timeout=timeout)

    def run_container(self, cid: str) -> tuple[str, int]:
        argv = ["run", "-d", "--null-io", "--runtime", SHIM, "--runtime-config-path", RUNSC_TOML]
        for k, v in {"io.kubernetes.cri.container-type": "sandbox", "io.kubernetes.cri.sandbox-id": cid,
                     **self.plan["annotations"]}.items():
            argv += ["--annotation", f"{k}={v}"]
        self.ctr(*argv, self.plan["image_ref"], cid)
        end = time.monotonic() + 60
        while time.monotonic() < end:
            p = self.ctr("task", "exec", "--exec-id", f"x{time.monotonic_ns()}", cid, "cat", "/tmp/state",
                         check=False)
            if p.returncode == 0 and len(p.stdout.split()) == 2:
                boot, i = p.stdout.split()
                return boot, int(i)
            time.sleep(0.2)
        raise RuntimeError(f"container {cid} never reported its state")

    def remove_container(self, cid: str) -> None:
        self.ctr("task", "kill", "--signal", "SIGKILL", cid, check=False)
        end = time.monotonic() + 30
        while time.monotonic() < end and self.ctr("task", "delete", cid, check=False).returncode != 0:
            if cid not in self.ctr("task", "ls", "-q", check=False).stdout.split():
                break
            time.sleep(0.2)
        self.ctr("containers", "delete", cid, check=False)

    def decisions(self) -> list[dict]:
        return [json.loads(line) for line in STANDIN_LOG.read_text().splitlines()] if STANDIN_LOG.exists() else []

    def start_thawd(self, version: str) -> list[str]:
        argv = next(shlex.split(line.split("=", 1)[1]) for line in UNIT.read_text().splitlines()
                    if line.startswith("ExecStart="))
        os.makedirs("/run/thaw", mode=0o755, exist_ok=True)   # RuntimeDirectory=thaw, as systemd would
        log = self.work / "thawd.log"
        start = log.stat().st_size if log.exists() else 0
        p = self.spawn("thawd", argv)
        end = time.monotonic() + 60
        while f"thawd {version} serving" not in log.read_text(errors="replace")[start:]:
            if p.poll() is not None or time.monotonic() > end:
                raise RuntimeError("thawd did not start: " + log.read_text(errors="replace")[start:][-3000:])
            time.sleep(0.1)
        return argv

    def wait_published(self, timeout_s: float = 180) -> dict:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            ready = [e for e in self.thaw_json("stats")["entries"] if e["state"] == "ready"]
            if ready:
                return ready[0]
            time.sleep(0.5)
        raise RuntimeError("thawd published no image: " + (self.work / "thawd.log").read_text()[-3000:])

    # -- the node's life ---------------------------------------------------------------

    def main(self) -> None:
        a, b = self.plan["version_a"], self.plan["version_b"]
        self.overlay_node_paths()
        Path("/etc/containerd").mkdir(parents=True, exist_ok=True)
        Path("/etc/containerd/config.toml").write_text(USER_CONFIG)
        before = tree(Path("/etc/containerd"))
        self.hide_build_tools()

        p = self.install(self.plan["dist_a"], "--with-containerd")
        self.step("install a", rc=p.returncode, seconds=p.seconds, out=(p.stdout + p.stderr)[-3000:])
        if p.returncode != 0:
            raise RuntimeError("install of the first release failed")
        self.step("version a", lines=self.thaw("--version").stdout.splitlines(),
                  current=os.readlink("/opt/thaw/current"), config=Path("/etc/thaw/config.toml").read_text(),
                  unit=UNIT.read_text(), containerd_config=Path("/etc/containerd/config.toml").read_text())

        # 3. The CLI: cold, checkpoint, restore; the restored log goes on.
        t = time.monotonic()
        self.thaw("run", "--id", "rel-cli", "--no-network", "--", "/bin/sh", "-c", WORKLOAD)
        cold = self.wait_ticks("rel-cli", 5)
        Path("/var/lib/thaw/images").mkdir(parents=True, exist_ok=True)
        ck = self.thaw_json("checkpoint", "rel-cli", "--out", "/var/lib/thaw/images/rel-cli")
        res = self.thaw_json("restore", "/var/lib/thaw/images/rel-cli", "--id", "rel-cli2")
        restored = self.wait_ticks("rel-cli2", max(cold) + 5)
        self.step("cli", seconds=round(time.monotonic() - t, 1), checkpoint=ck, restore=res,
                  cold_log=self.log_of("rel-cli2").splitlines()[:3], restored_ticks=restored)

        # 4. containerd, with thawd from the unit.
        argv = self.start_thawd(a)
        ctrd = self.spawn("containerd", ["containerd", "--config", "/etc/containerd/config.toml"])
        end = time.monotonic() + 60
        while self.ctr("version", check=False).returncode != 0:
            if ctrd.poll() is not None or time.monotonic() > end:
                raise RuntimeError("containerd did not start: " + (self.work / "containerd.log").read_text()[-3000:])
            time.sleep(0.2)
        self.ctr("images", "import", "--all-platforms", self.plan["image_archive"])
        t = time.monotonic()
        boot1, _ = self.run_container("first")
        published = self.wait_published()
        self.remove_container("first")
        boot2, _ = self.run_container("second")
        self.remove_container("second")
        self.step("containerd a", seconds=round(time.monotonic() - t, 1), thawd=argv, boots=[boot1, boot2],
                  key=published["key"], decisions=[{k: d.get(k) for k in ("id", "decision", "reason", "thaw")}
                                                   for d in self.decisions() if d.get("cmd") == "create"])
        doctor = self.thaw("doctor", "--json", check=False)
        self.step("doctor a", rc=doctor.returncode,
                  checks={c["name"]: c["status"] for c in json.loads(doctor.stdout)["checks"]})

        # 5. The upgrade: the second release over the first.
        self.stop("thawd")
        p = self.install(self.plan["dist_b"], "--with-containerd")
        self.step("install b", rc=p.returncode, seconds=p.seconds, out=(p.stdout + p.stderr)[-3000:])
        if p.returncode != 0:
            raise RuntimeError("install of the second release failed")
        argv_b = self.start_thawd(b)
        still = {r["id"]: r["state"] for r in self.thaw_json("ps")}
        res3 = self.thaw_json("restore", "/var/lib/thaw/images/rel-cli", "--id", "rel-cli3")
        restored3 = self.wait_ticks("rel-cli3", max(cold) + 2)
        boot3, _ = self.run_container("third")
        self.remove_container("third")
        self.step("upgraded", lines=self.thaw("--version").stdout.splitlines(), current=os.readlink("/opt/thaw/current"),
                  releases=sorted(os.listdir("/opt/thaw/releases")), thawd=argv_b, ps=still, restore=res3,
                  restored_ticks=restored3, boot=boot3,
                  decision=[{k: d.get(k) for k in ("id", "decision", "thaw")} for d in self.decisions()
                            if d.get("cmd") == "create" and d.get("id") == "third"])

        # 6. Uninstall, once nothing runs on the node.
        for sid in ("rel-cli2", "rel-cli3"):
            self.thaw("delete", "--force", sid)
        self.thaw("delete", "rel-cli", check=False)   # stopped by its checkpoint: gone already
        self.stop("thawd")
        self.stop("containerd")
        sh("pkill", "-9", "-f", f"containerd-shim-runsc-v1.*{SOCKET}", check=False)
        t = time.monotonic()
        dry = self.thaw("uninstall", "--dry-run")
        self.step("uninstall plan", seconds=round(time.monotonic() - t, 1), plan=dry.stdout.splitlines())
        t = time.monotonic()
        p = self.install(self.plan["dist_b"], "--uninstall", store=False)
        self.step("uninstall", rc=p.returncode, seconds=round(time.monotonic() - t, 1), out=(p.stdout + p.stderr)[-3000:],
                  containerd_before=before, containerd_after=tree(Path("/etc/containerd")),
                  left=[x for x in ("/opt/thaw", THAW, str(UNIT), RUNSC_TOML, "/etc/containerd/conf.d/thaw.toml")
                        if os.path.lexists(x)],
                  kept_config=Path("/etc/thaw/config.toml").is_file())

    def cleanup(self) -> None:
        for sid in ("rel-cli", "rel-cli2", "rel-cli3"):
            if os.path.exists(THAW):
                self.thaw("delete", "--force", sid, check=False, timeout=60)
        if "containerd" in self.procs:
            for cid in self.ctr("task", "ls", "-q", check=False).stdout.split():
                self.remove_container(cid)
            for cid in self.ctr("containers", "ls", "-q", check=False).stdout.split():
                self.ctr("containers", "delete", cid, check=False)
        for name in list(self.procs):
            self.stop(name)
        sh("pkill", "-9", "-f", f"containerd-shim-runsc-v1.*{SOCKET}", check=False)


def main() -> int:
    node = Node(json.loads(Path(sys.argv[1]).read_text()))
    rc = 0
    try:
        node.main()
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
