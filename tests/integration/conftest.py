"""Integration fixtures for the store: a real SeaweedFS (session), real runsc
checkpoint images (session), per-test buckets and caches named after the test."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from control import compat, config, seaweed
from control.store import Store
from tests.conftest import BUILD, REPO, require

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


def thaw(settings: config.Settings, *args: str, check: bool = True, **extra_env) -> subprocess.CompletedProcess:
    env = cli_env(settings) | {k: str(v) for k, v in extra_env.items()}
    r = subprocess.run([str(REPO / ".venv/bin/thaw"), *args], env=env, capture_output=True, text=True, timeout=300)
    if check and r.returncode != 0:
        raise AssertionError(f"thaw {' '.join(args)} failed ({r.returncode}): {r.stderr}\n{r.stdout}")
    return r


def thaw_json(settings, *args, **kw) -> dict:
    r = thaw(settings, *args, "--json", **kw)
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
