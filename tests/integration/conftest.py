"""Integration fixtures: the real `thaw` CLI in a subprocess, real runsc, real
netns (pyroute2), the real build (runsc, shim, containerd) in ./build, and
per-test state named after the test."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from control.node import compat

from control import config

from control.dev import seaweed
from control import config as configmod
from control.images.store import Store
from runsc_hooks import network as netmod
from runsc_hooks.runsc import remove_root

from tests.conftest import BUILD, REPO, require

THAW = REPO / ".venv" / "bin" / "thaw"
# Integration tests take addresses from their own range so they never collide
# with a demo or a thawd running on the same machine.
TEST_SUBNET = "10.214.0.0/20"


def thaw_env(base: Path) -> dict[str, str]:
    """Environment for a `thaw` subprocess confined to `base`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("THAW_")}
    env.update({
        "THAW_NODE_STATE_DIR": str(base / "state"),
        "THAW_NODE_LOG_DIR": str(base / "log"),
        "THAW_RUNSC_ROOT": str(base / "runsc-root"),
        "THAW_RUNSC_PATH": str(BUILD / "runsc"),
        "THAW_NETWORK_SUBNET": TEST_SUBNET,
        "THAW_CACHE_DIR": str(base / "cache"),
    })
    return env


def settings_for(base: Path) -> configmod.Settings:
    return configmod.load(environ=thaw_env(base), config_file=_empty_config(base))


def _empty_config(base: Path) -> Path:
    base.mkdir(parents=True, exist_ok=True)
    p = base / "empty-config.toml"
    p.write_text("")
    return p


def leftovers(settings: configmod.Settings, ids: list[str]) -> dict:
    """Whatever thaw or runsc left behind for sandboxes `ids`: must be {} after delete/failure."""
    from runsc_hooks.runsc import GlobalOptions, Runsc
    r = Runsc(settings.runsc_path, GlobalOptions(root=settings.runsc_root))
    from control.lifecycle.sandbox import runsc_id
    live = {c.id for c in r.list()} if settings.runsc_root.exists() else set()
    out: dict[str, list[str]] = {}
    for sid in ids:
        found = []
        if runsc_id(sid) in live or sid in live:
            found.append("runsc container")
        found += netmod.sandbox_leftovers(sid)  # netns, host veth, routes, nftables rules (gate, NAT)
        if (settings.state_dir / "bundles" / sid).exists():
            found.append("bundle")
        if (settings.state_dir / "sandboxes" / f"{sid}.json").exists():
            found.append("record")
        logs = settings.log_dir / "sandboxes" / sid
        if logs.exists():
            found.append("log directory")
        if _monitors_of(logs):
            found.append("thaw-monitor process")
        if found:
            out[sid] = found
    return out


def proc_argvs():
    """(pid, argv as bytes) of every process whose command line could be read (one that
    exited meanwhile is left out)."""
    for p in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = p.read_bytes().split(b"\0")
        except OSError:
            continue
        yield int(p.parent.name), argv


def _monitors_of(logs: Path) -> list[int]:
    """pids of thaw-monitor processes writing into sandbox log directory `logs`."""
    flag = f"-log={logs}/".encode()
    return [pid for pid, argv in proc_argvs()
            if argv and argv[0].endswith(b"thaw-monitor") and any(a.startswith(flag) for a in argv)]


def purge(settings: configmod.Settings, prefix: str) -> None:
    from runsc_hooks.runsc import GlobalOptions, Runsc
    if settings.runsc_root.exists():
        r = Runsc(settings.runsc_path, GlobalOptions(root=settings.runsc_root))
        for c in r.list():
            if c.id.startswith(prefix):
                subprocess.run([str(settings.runsc_path), f"--root={settings.runsc_root}", "delete", "--force", c.id],
                               capture_output=True)
    _kill_sandbox_processes(settings.runsc_root)
    netmod.cleanup_leftovers(set(), prefix=prefix)  # netns, veth and nftables rules named after the test


def _kill_sandbox_processes(root: Path) -> None:
    """Last resort when the code under test left a sandbox runsc no longer lists: SIGKILL, by pid,
    the runsc processes of this test's own runsc root (and no other)."""
    import signal
    flag = f"--root={root}".encode()
    for p in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = p.read_bytes().split(b"\0")
        except OSError:
            continue
        if flag in argv and argv[0].split(b"/")[-1].startswith(b"runsc"):
            try:
                os.kill(int(p.parent.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="session")
def stack(runsc_bin) -> Path:
    """Preconditions shared by all integration tests."""
    require(THAW.is_file(), f"thaw installed in {THAW}")
    require(Path("/var/run/netns").exists() or os.access("/var/run", os.W_OK), "/var/run writable for netns")
    return runsc_bin


@pytest.fixture
def base(tmp_path_factory, name, stack):
    """A per-test state tree; runsc containers and netns named after the test are purged before and after."""
    b = Path(f"/tmp/thaw-it/{name}")
    s = settings_for(b)
    purge(s, name)
    remove_root(s.runsc_root)
    shutil.rmtree(b, ignore_errors=True)
    b.mkdir(parents=True)
    yield b
    purge(s, name)
    remove_root(s.runsc_root)
    netmod.remove_subnet_route(TEST_SUBNET)  # the node-level guard plumbing installs for the subnet
    shutil.rmtree(b, ignore_errors=True)
    assert not b.exists(), f"{b} could not be removed"


def thaw(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the thaw CLI with no THAW_* variables from the caller (hermetic) plus `env`."""
    require(THAW.is_file(), f"thaw console script at {THAW} (make setup)")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("THAW_")}
    clean.update(env or {})
    return subprocess.run([str(THAW), *args], capture_output=True, text=True, env=clean,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def thaw_json(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    p = thaw(*args, "--json", env=env)
    try:
        return p.returncode, json.loads(p.stdout)
    except ValueError:
        pytest.fail(f"thaw {' '.join(args)} printed no JSON (exit {p.returncode}):\n"
                    f"{p.stdout}\n{p.stderr}", pytrace=False)


@pytest.fixture
def build() -> Path:
    for b in ("runsc", "containerd-shim-runsc-v1", "containerd"):
        require(os.access(BUILD / b, os.X_OK), f"{b} built at {BUILD / b}")
    require(os.geteuid() == 0, "root")
    return BUILD


@pytest.fixture
def node_root(name: str) -> Path:
    """An empty directory tree to provision into, named from the test; removed before and after."""
    root = Path("/tmp") / f"thaw-{name}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    yield root
    shutil.rmtree(root, ignore_errors=True)


# -- the store: a real SeaweedFS (session), real runsc checkpoint images (session) --

sys.path.insert(0, str(REPO / "bench"))
import workloads  # noqa: E402


SCRATCH = Path("/var/tmp/thaw-it")


@pytest.fixture(scope="session")
def weed() -> seaweed.Seaweed:
    try:
        seaweed.weed_binary()
    except Exception as e:  # noqa: BLE001
        require(False, f"SeaweedFS weed binary ({e})")
    work = SCRATCH / f"seaweed-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    sw = seaweed.Seaweed(work).start()
    yield sw
    sw.stop()
    shutil.rmtree(work, ignore_errors=True)


def make_settings(sw: seaweed.Seaweed, bucket: str, cache_dir: Path, **over) -> config.Settings:
    creds = sw.credentials.write_aws_file(sw.workdir / "aws-credentials")
    o = {"store.endpoint": sw.endpoint, "store.credentials_file": str(creds), "store.bucket": bucket,
         "cache.dir": str(cache_dir), "store.timeout_s": "10", "store.workers": "4",
         "cache.lock_timeout_s": "120", "runsc.path": str(BUILD / "runsc")}
    o.update({k: str(v) for k, v in over.items()})
    return config.load(overrides=o, environ={})


def cli_env(settings: config.Settings) -> dict:
    """Environment for a `thaw` subprocess using the same settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("THAW_", "AWS_"))}
    env.update({"THAW_STORE_ENDPOINT": settings.store_endpoint, "THAW_STORE_BUCKET": settings.store_bucket,
                "THAW_STORE_CREDENTIALS_FILE": str(settings.store_credentials_file),
                "THAW_CACHE_DIR": str(settings.cache_dir), "THAW_RUNSC_PATH": str(settings.runsc_path),
                "THAW_STORE_TIMEOUT_S": "10", "THAW_STORE_WORKERS": "4", "THAW_CONFIG": "/dev/null"})
    return env


def store_thaw(settings: config.Settings, *args: str, check: bool = True, **extra_env) -> subprocess.CompletedProcess:
    env = cli_env(settings) | {k: str(v) for k, v in extra_env.items()}
    r = subprocess.run([str(REPO / ".venv/bin/thaw"), *args], env=env, capture_output=True, text=True, timeout=300)
    if check and r.returncode != 0:
        raise AssertionError(f"thaw {' '.join(args)} failed ({r.returncode}): {r.stderr}\n{r.stdout}")
    return r


def store_thaw_json(settings, *args, **kw) -> dict:
    r = store_thaw(settings, *args, "--json", **kw)
    return json.loads(r.stdout)


@pytest.fixture
def scratch(name) -> Path:
    d = SCRATCH / name
    workloads.remove_tree(d)
    d.mkdir(parents=True)
    yield d
    workloads.remove_tree(d)


@pytest.fixture
def settings(weed, name, scratch) -> config.Settings:
    s = make_settings(weed, name, scratch / "cache")
    store = Store(s)
    store.delete_bucket()
    store.ensure_bucket()
    yield s
    store.delete_bucket()


def run_all(cmds: list[list[str]], envs: list[dict], timeout: float = 240) -> list[tuple[int, str, str]]:
    """Start every command at once; (returncode, stdout, stderr) of each, none left running."""
    procs = [subprocess.Popen(c, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c, e in zip(cmds, envs)]
    out = []
    try:
        for p in procs:
            o, e = p.communicate(timeout=timeout)
            out.append((p.returncode, o, e))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return out


@pytest.fixture(scope="session")
def node(runsc_bin) -> compat.CompatTuple:
    return compat.node_tuple(config.load(overrides={"runsc.path": str(runsc_bin)}, environ={}))


@pytest.fixture(scope="session")
def checkpoints(runsc_bin) -> dict[str, Path]:
    """Real runsc checkpoint images of two workloads sharing a runtime (~50 and ~80 MB)."""
    work = SCRATCH / f"checkpoints-{os.getpid()}"
    workloads.remove_tree(work)
    out = {"runtime": workloads.make_checkpoint(runsc_bin, work, "runtime", ["none"]),
           "kv": workloads.make_checkpoint(runsc_bin, work, "kv", ["kv", "4", "100000"])}
    yield out
    workloads.remove_tree(work)


def copy_image(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst
