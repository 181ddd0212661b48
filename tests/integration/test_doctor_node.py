"""`thaw doctor` on this machine and on a provisioned tree."""
from __future__ import annotations

from pathlib import Path

from control.config import RUNSC_VERSION_LABEL
from tests.integration.conftest import thaw, thaw_json


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
