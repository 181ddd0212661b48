"""`thaw provision --root DIR` end to end: the real CLI, the real runsc build,
real file system; the node checks run against this machine."""
from __future__ import annotations

import filecmp
import os
import stat
import subprocess
import tomllib
from pathlib import Path

from tests.integration.conftest import thaw, thaw_json

MODES = {
    "opt/thaw/bin": 0o755,
    "opt/thaw/bin/runsc": 0o755,
    "opt/thaw/bin/containerd-shim-runsc-v1": 0o755,
    "etc/thaw/config.toml": 0o644,
    "etc/thaw/runsc.toml": 0o644,
    "etc/containerd/conf.d": 0o755,
    "etc/containerd/conf.d/thaw.toml": 0o644,
    "etc/containerd/config.toml": 0o644,
    "var/lib/thaw": 0o711,
    "var/lib/thaw/cache": 0o700,
    "var/log/thaw": 0o750,
    "var/log/thaw/shim": 0o750,
    "etc/systemd/system/thawd.service": 0o644,
}


def provision(root: Path, build: Path, *extra: str, env: dict | None = None) -> tuple[int, dict]:
    return thaw_json("provision", "--root", str(root), "--from", str(build), *extra, env=env)


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under root with its mode, size, mtime and link target."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns,
                                         os.readlink(p) if p.is_symlink() else None)
    return out


def results(report: dict) -> dict[str, str]:
    return {s["step"]: s["result"] or s["action"] for s in report["steps"]}


def test_provision_fresh_tree(build, node_root):
    rc, report = provision(node_root, build)
    assert rc == 0, report
    assert report["changed"] and not report["dry_run"] and report["planned_changes"] > 0
    checks = {c["name"]: c["status"] for c in report["checks"]}
    assert checks["runsc"] == "pass" and checks["arch"] == "pass" and checks["root"] == "pass"
    assert "fail" not in checks.values()

    for rel, mode in MODES.items():
        p = node_root / rel
        assert p.exists(), rel
        assert stat.S_IMODE(p.stat().st_mode) == mode, f"{rel}: {stat.S_IMODE(p.stat().st_mode):o}"
    for b in ("runsc", "containerd-shim-runsc-v1"):
        assert filecmp.cmp(build / b, node_root / "opt/thaw/bin" / b, shallow=False)
    link = node_root / "etc/systemd/system/multi-user.target.wants/thawd.service"
    assert os.readlink(link) == "/etc/systemd/system/thawd.service"

    # The files name the node's paths, not the tree's.
    runsc_toml = tomllib.loads((node_root / "etc/thaw/runsc.toml").read_text())
    standin_built = (build / "thaw-runsc").is_file()
    assert runsc_toml["binary_name"] == ("/opt/thaw/bin/thaw-runsc" if standin_built else "/opt/thaw/bin/runsc")
    assert results(report)["install thaw-runsc"] == ("created" if standin_built else "skipped")
    dropin = tomllib.loads((node_root / "etc/containerd/conf.d/thaw.toml").read_text())
    handler = dropin["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["runsc-thaw"]
    assert handler["options"]["ConfigPath"] == "/etc/thaw/runsc.toml"
    assert handler["runtime_path"] == "/opt/thaw/bin/containerd-shim-runsc-v1"
    main = tomllib.loads((node_root / "etc/containerd/config.toml").read_text())
    assert main["imports"] == ["/etc/containerd/conf.d/*.toml"]
    assert "ExecStart=" in (node_root / "etc/systemd/system/thawd.service").read_text()

    t = report["compatibility_tuple"]
    assert t["runsc_version"].startswith("thaw-gvisor-") and t["arch"] == "x86_64"
    assert t["cpu_features"] and t["platform"] == "systrap"


def test_second_run_changes_nothing(build, node_root):
    rc, _ = provision(node_root, build)
    assert rc == 0
    before = snapshot(node_root)
    rc, report = provision(node_root, build)
    assert rc == 0, report
    assert not report["changed"] and report["planned_changes"] == 0
    assert set(results(report).values()) <= {"unchanged", "skipped"}
    assert snapshot(node_root) == before
    p = thaw("provision", "--root", str(node_root), "--from", str(build))
    assert p.returncode == 0 and p.stdout.rstrip().endswith("provisioned: nothing changed"), p.stdout


def test_dry_run_changes_nothing(build, node_root):
    rc, report = provision(node_root, build, "--dry-run")
    assert rc == 0, report
    assert report["dry_run"] and not report["changed"] and report["planned_changes"] > 0
    assert {s["action"] for s in report["steps"]} >= {"create"}
    assert list(node_root.iterdir()) == []

    # On a provisioned tree with a hand-edited file: reported, not repaired.
    provision(node_root, build)
    runsc_toml = node_root / "etc/thaw/runsc.toml"
    runsc_toml.write_text("# edited\n")
    (node_root / "opt/thaw/bin/runsc").chmod(0o700)
    before = snapshot(node_root)
    rc, report = provision(node_root, build, "--dry-run")
    assert rc == 0
    assert results(report)["runsc.toml"] == "update"
    assert results(report)["install runsc"] == "update"
    assert snapshot(node_root) == before
    p = thaw("provision", "--root", str(node_root), "--from", str(build), "--dry-run")
    assert "dry run: 2 steps would change something" in p.stdout, p.stdout


USER_CONFIG = """# production containerd config, hand-written
version = 3
root = "/var/lib/containerd"
oom_score = -999

[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "nvidia"

  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia.options]
      BinaryName = "/usr/bin/nvidia-container-runtime"
      SystemdCgroup = true
"""


def _write_user_config(root: Path, text: str) -> Path:
    cfg = root / "etc/containerd/config.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(text)
    cfg.chmod(0o600)
    return cfg


def test_existing_containerd_config_gains_one_line(build, node_root):
    cfg = _write_user_config(node_root, USER_CONFIG)
    rc, report = provision(node_root, build)
    assert rc == 0, report
    after = cfg.read_text()
    old_lines, new_lines = USER_CONFIG.splitlines(keepends=True), after.splitlines(keepends=True)
    added = [line for line in new_lines if line not in old_lines]
    assert added == ['imports = ["/etc/containerd/conf.d/*.toml"]  # added by thaw provision\n']
    assert [line for line in new_lines if line in old_lines] == old_lines     # every byte else kept
    assert stat.S_IMODE(cfg.stat().st_mode) == 0o600                         # its mode kept
    backups = sorted(cfg.parent.glob("config.toml.thaw-backup*"))
    assert len(backups) == 1 and backups[0].read_text() == USER_CONFIG
    assert results(report)["containerd-imports"] == "updated"
    # Idempotent: no second line, no second backup.
    rc, report = provision(node_root, build)
    assert results(report)["containerd-imports"] == "unchanged"
    assert cfg.read_text() == after
    assert len(list(cfg.parent.glob("config.toml.thaw-backup*"))) == 1


def test_existing_imports_are_extended_not_duplicated(build, node_root):
    text = USER_CONFIG.replace("oom_score = -999\n", 'oom_score = -999\nimports = ["/etc/containerd/site.toml"]\n')
    cfg = _write_user_config(node_root, text)
    rc, _ = provision(node_root, build)
    assert rc == 0
    assert len(text.splitlines()) == len(cfg.read_text().splitlines())
    changed = [(a, b) for a, b in zip(text.splitlines(), cfg.read_text().splitlines(), strict=True) if a != b]
    assert changed == [('imports = ["/etc/containerd/site.toml"]',
                        'imports = ["/etc/containerd/site.toml", "/etc/containerd/conf.d/*.toml"]'
                        '  # added by thaw provision')]
    assert len(text.splitlines()) == len(cfg.read_text().splitlines())


def test_config_that_already_imports_dropins_is_untouched(build, node_root):
    text = USER_CONFIG.replace("version = 3\n", 'version = 3\nimports = ["/etc/containerd/conf.d/*.toml"]\n')
    cfg = _write_user_config(node_root, text)
    before = cfg.stat()
    rc, report = provision(node_root, build)
    assert rc == 0
    assert cfg.read_text() == text and cfg.stat().st_mtime_ns == before.st_mtime_ns
    assert not list(cfg.parent.glob("config.toml.thaw-backup*"))
    assert results(report)["containerd-imports"] == "unchanged"


def test_containerd_loads_the_handler_and_keeps_user_settings(build, node_root):
    """The real containerd (v2.4.2 build) merges the drop-in into the user's config."""
    _write_user_config(node_root, USER_CONFIG)
    rc, _ = provision(node_root, build)
    assert rc == 0
    # containerd would read /etc/containerd/conf.d; point the import at the tree's copy.
    cfg = node_root / "etc/containerd/config.toml"
    cfg.write_text(cfg.read_text().replace("/etc/containerd/conf.d", str(node_root / "etc/containerd/conf.d")))
    p = subprocess.run([str(build / "containerd"), "--config", str(cfg), "config", "dump"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    dumped = tomllib.loads(p.stdout)
    cri = dumped["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]
    assert cri["default_runtime_name"] == "nvidia"
    assert cri["runtimes"]["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    thaw_rt = cri["runtimes"]["runsc-thaw"]
    assert thaw_rt["runtime_type"] == "io.containerd.runsc.v1"
    assert thaw_rt["options"] == {"TypeUrl": "io.containerd.runsc.v1.options", "ConfigPath": "/etc/thaw/runsc.toml"}
    assert thaw_rt["pod_annotations"] == ["thaw.dev/*", "dev.gvisor.*"]
    assert dumped["oom_score"] == -999


def test_failing_step_reports_what_was_done(build, node_root):
    (node_root / "etc/thaw/runsc.toml").mkdir(parents=True)     # a directory where the file goes
    p = thaw("provision", "--root", str(node_root), "--from", str(build))
    assert p.returncode == 1, p.stderr
    assert "provision step 'runsc.toml' failed" in p.stderr
    done = p.stderr.split("done before it:")[1]
    assert "install runsc" in done and "install containerd-shim-runsc-v1" in done
    assert "containerd drop-in" not in done
    assert not (node_root / "etc/containerd").exists()           # later steps did not run
    # Fix the cause and re-run: it finishes.
    (node_root / "etc/thaw/runsc.toml").rmdir()
    rc, report = provision(node_root, build)
    assert rc == 0 and results(report)["install runsc"] == "unchanged"


def test_failed_checks_change_nothing(build, node_root):
    p = thaw("provision", "--root", str(node_root), "--from", str(build),
             env={"THAW_CACHE_MIN_FREE_BYTES": "1000t"})
    assert p.returncode == 69, p.stderr
    assert "node checks failed, nothing was changed: cache-space" in p.stderr
    assert "fail  cache-space" in p.stdout
    assert list(node_root.iterdir()) == []
    rc, report = thaw_json("provision", "--root", str(node_root), "--from", str(build),
                           env={"THAW_CACHE_MIN_FREE_BYTES": "1000t"})
    assert rc == 69 and report["error"]["failed"] == ["cache-space"] and not report["changed"]


def test_bad_config_fails_naming_the_key(build, node_root):
    p = thaw("provision", "--root", str(node_root), "--from", str(build), env={"THAW_NODE_GPU": "maybe"})
    assert p.returncode == 78
    assert "config node.gpu: expected one of auto, yes, no, got 'maybe' (from env THAW_NODE_GPU)" in p.stderr
    (node_root / "etc/thaw").mkdir(parents=True)
    (node_root / "etc/thaw/config.toml").write_text("[cache]\nbudget = 5\n")
    p = thaw("provision", "--root", str(node_root), "--from", str(build))
    assert p.returncode == 78 and "config cache.budget: unknown key" in p.stderr


def test_missing_binaries_fail_before_any_change(build, node_root, tmp_path):
    src = tmp_path / "build"
    src.mkdir()
    os.link(build / "runsc", src / "runsc")       # runsc, but no shim
    p = thaw("provision", "--root", str(node_root), "--from", str(src))
    assert p.returncode == 69
    assert "binaries" in p.stderr and "containerd-shim-runsc-v1" in p.stderr
    assert list(node_root.iterdir()) == []
