"""`thaw doctor` on this machine and on a provisioned tree."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from control import config
from control.config import RUNSC_VERSION_LABEL
from control.images.store import Store
from control.node.compat import CompatTuple
from control.thawd.client import Client
from tests.integration.conftest import THAW, thaw, thaw_json


def by_name(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


def has_gpu() -> bool:
    return Path("/dev/nvidiactl").exists() or Path("/proc/driver/nvidia/version").exists()


def test_doctor_on_this_machine(build, node_root):
    # Settings pinned: an empty config file, the built runsc.
    cfg = node_root / "empty.toml"
    cfg.write_text("")
    rc, report = thaw_json("doctor", env={"THAW_CONFIG": str(cfg), "THAW_RUNSC_PATH": str(build / "runsc")})
    checks = by_name(report)
    for name in ("arch", "kernel", "root", "cgroups", "runsc"):
        assert checks[name]["status"] == "pass", checks[name]
    assert RUNSC_VERSION_LABEL in checks["runsc"]["detail"]
    # A CPU node is a warning (CPU workloads still restore), never a failure, with node.gpu = auto.
    assert checks["gpu"]["status"] == ("pass" if has_gpu() else "warn"), checks["gpu"]
    assert checks["nvidia-driver"]["status"] != "fail" or has_gpu()
    # The exit code is the readiness verdict: non-zero exactly when a line fails.
    statuses = {c["status"] for c in report["checks"]}
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert report["status"] == ("fail" if failed else "warn" if "warn" in statuses else "pass")
    assert (rc != 0) == bool(failed) and rc in (0, 69)
    assert report["compatibility_tuple"]["runsc_version"] == RUNSC_VERSION_LABEL


def test_doctor_gpu_required_fails_on_cpu_node(build, node_root):
    if has_gpu():
        return   # the assertion below is about CPU nodes
    cfg = node_root / "empty.toml"
    cfg.write_text("")
    rc, report = thaw_json("doctor", env={"THAW_CONFIG": str(cfg), "THAW_RUNSC_PATH": str(build / "runsc"),
                                          "THAW_NODE_GPU": "yes"})
    assert rc == 69
    assert by_name(report)["gpu"]["status"] == "fail"
    assert by_name(report)["nvidia-driver"]["status"] == "fail"


def test_doctor_after_provision(build, node_root):
    rc, _ = thaw_json("provision", "--root", str(node_root), "--from", str(build))
    assert rc == 0
    rc, report = thaw_json("doctor", "--root", str(node_root))
    checks = by_name(report)
    # It read the tree's seeded config: runsc is the installed one.
    assert checks["runsc"]["detail"].startswith(str(node_root / "opt/thaw/bin/runsc"))
    for name in ("install runsc", "install containerd-shim-runsc-v1", "runsc.toml", "containerd drop-in",
                 "containerd-imports", "cache dir", "thawd unit", "enable thawd"):
        assert checks[name]["status"] == "pass", checks[name]
    assert checks["install thaw-runsc"]["status"] == ("pass" if (build / "thaw-runsc").is_file() else "warn")
    # thawd is not running in this tree: the readiness verdict is "not ready".
    assert checks["thawd"]["status"] == "fail"
    assert rc == 69 and report["status"] == "fail"

    # A drifted file is reported, a missing one fails.
    (node_root / "etc/thaw/runsc.toml").write_text("# edited\n")
    (node_root / "etc/containerd/conf.d/thaw.toml").unlink()
    rc, report = thaw_json("doctor", "--root", str(node_root))
    checks = by_name(report)
    assert checks["runsc.toml"]["status"] == "warn"
    assert checks["containerd drop-in"]["status"] == "fail"

    p = thaw("doctor", "--root", str(node_root))
    assert p.returncode == 69
    assert "fail  containerd drop-in" in p.stdout and p.stdout.rstrip().endswith("doctor: fail")


def test_doctor_prints_the_tuple_thawd_serves(build, node_root, weed, name):
    """One node, one tuple: the hash `thaw doctor` prints is the one a real thawd
    (`thaw serve`) logs at start and returns from its Health RPC, the hash its
    images are published and matched under. Both read one config (machine type
    named after the test) and one runsc; neither has a second builder."""
    cfg = node_root / "empty.toml"
    cfg.write_text("")
    env = {"THAW_CONFIG": str(cfg), "THAW_RUNSC_PATH": str(build / "runsc"),
           "THAW_RUNSC_ROOT": str(node_root / "runsc-root"), "THAW_NODE_STATE_DIR": str(node_root / "state"),
           "THAW_NODE_LOG_DIR": str(node_root / "log"), "THAW_CACHE_DIR": str(node_root / "cache"),
           "THAW_THAWD_SOCKET": str(node_root / "run" / "thawd.sock"), "THAW_THAWD_METRICS_ADDR": "",
           "THAW_NODE_MACHINE_TYPE": name, "THAW_STORE_ENDPOINT": weed.endpoint,
           "THAW_STORE_BUCKET": name.replace("_", "-")[:60],
           "THAW_STORE_CREDENTIALS_FILE": str(weed.credentials.write_aws_file(node_root / "aws-credentials"))}
    store = Store(config.load(environ=env, config_file=cfg))
    store.delete_bucket()
    log = node_root / "thawd.log"
    with open(log, "wb") as out:
        thawd = subprocess.Popen([str(THAW), "serve"], env=_clean(env), stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        sock = node_root / "run" / "thawd.sock"
        end = time.monotonic() + 60
        while not sock.exists():
            assert thawd.poll() is None and time.monotonic() < end, f"thawd did not start: {log.read_text()[-2000:]}"
            time.sleep(0.1)
        settings = config.load(environ=env, config_file=cfg)
        with Client(settings) as c:
            served = c.health()["tuple_hash"]

        rc, report = thaw_json("doctor", env=env)
        assert by_name(report)["thawd"]["status"] == "pass", report   # it found this thawd
        printed = report["compatibility_tuple"]
        assert printed["machine_type"] == name and printed["runsc_version"] == RUNSC_VERSION_LABEL
        assert printed["hash"] == served
        assert CompatTuple.from_dict({k: v for k, v in printed.items() if k != "hash"}).hash() == served
        started = [json.loads(line)["msg"] for line in log.read_text().splitlines() if "serving on" in line]
        assert started and started[0].endswith(f"tuple {served})"), started
        p = thaw("doctor", env=env)
        assert f"  {'hash':<22} {served}" in p.stdout, p.stdout
    finally:
        thawd.send_signal(signal.SIGTERM)
        try:
            thawd.wait(30)
        except subprocess.TimeoutExpired:
            thawd.kill()
            thawd.wait(10)
        store.delete_bucket()


def _clean(env: dict[str, str]) -> dict[str, str]:
    """The caller's environment without THAW_*/AWS_*, plus `env` (as conftest.thaw does)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("THAW_", "AWS_"))} | env
