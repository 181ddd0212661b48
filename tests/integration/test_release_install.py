"""A node from nothing, from `make release`'s directory: install, a sandbox cold
then restored (CLI and containerd), an upgrade to a newer build, an uninstall
that gives containerd its configuration back (issue 31; release_node.py runs
the node's side in a private mount namespace without the checkout, Go or gcc)."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from control.dev import ocibuild
from control.dev.testbed import ANNOTATIONS, COUNTER, IMAGE
from control.version import VERSION
from tests.conftest import BUILD, REPO, require

SCRIPT = Path(__file__).with_name("release_node.py")
SYSTEM_PYTHON = "/usr/bin/python3"


def _kill_leftovers(work: Path) -> None:
    pids = work / "pids"
    if pids.exists():
        for line in pids.read_text().split():
            try:
                os.killpg(int(line), signal.SIGKILL)
            except ProcessLookupError:
                pass


def newer(version: str) -> str:
    """A later build of `version` (PEP 440: X.Y.Z < X.Y.Z.post1 < X.Y.Z.post2)."""
    m = re.fullmatch(r"(.*?)(?:\.post(\d+))?", version)
    return f"{m.group(1)}.post{int(m.group(2) or 0) + 1}"


def release(tree: Path, out: Path, build: Path = BUILD) -> Path:
    env = {**os.environ, "THAW_BUILD_DIR": str(build), "THAW_PYTHON": str(REPO / ".venv/bin/python")}
    p = subprocess.run(["bash", str(tree / "ci/release.sh"), "--no-image", "--out", str(out)], cwd=tree, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    version = re.search(r'^VERSION = "(.*)"$', (tree / "control/version.py").read_text(), re.M).group(1)
    return out / f"thaw-{version}"


def newer_build(work: Path, version: str) -> tuple[Path, Path]:
    """A newer build: a copy of the sources with control/version.py at `version`
    (and the manifests naming its image, as a version bump does), and its own
    build directory: the pinned upstream binaries linked from this one (the same
    inputs: ci/build-go.sh finds them up to date), thaw's Go commands built again,
    stamped with `version`."""
    tree = newer_tree(work, version)
    build = work / "build-b"
    build.mkdir()
    own = {p.parent.name for p in (REPO / "go/cmd").glob("*/main.go")}
    for p in BUILD.iterdir():
        if p.name in own or p.name in ("image", "thaw-daemonset.oci.tar"):
            continue
        if p.is_dir():
            shutil.copytree(p, build / p.name, copy_function=os.link)
        else:
            os.link(p, build / p.name)
    r = subprocess.run(["bash", str(tree / "ci/build-go.sh")], env={**os.environ, "THAW_BUILD_DIR": str(build)},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "up to date" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    return tree, build


def newer_tree(work: Path, version: str) -> Path:
    """A copy of what ci/release.sh and ci/build-go.sh build from, with control/version.py at `version`."""
    tree = work / "src-b"
    for d in ("control", "runsc_hooks", "nvproxy", "deploy", "ci", "go"):
        shutil.copytree(REPO / d, tree / d, ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / f, tree / f)
    (tree / "docs").mkdir()
    shutil.copy2(REPO / "docs/install.md", tree / "docs/install.md")
    v = tree / "control/version.py"
    v.write_text(re.sub(r'^VERSION = ".*"$', f'VERSION = "{version}"', v.read_text(), flags=re.M))
    for f in (tree / "deploy/kubernetes").rglob("*.yaml"):   # as a version bump does (tests/unit/test_version.py)
        f.write_text(f.read_text().replace(f"ghcr.io/thaw-dev/thaw:{VERSION}", f"ghcr.io/thaw-dev/thaw:{version}"))
    chart = tree / "deploy/helm/thaw/Chart.yaml"   # its version and appVersion too (ci/release.sh checks them)
    chart.write_text(re.sub(r'^(version|appVersion): "?' + re.escape(VERSION) + r'"?$', rf'\1: "{version}"',
                            chart.read_text(), flags=re.M))
    return tree


def hidden_paths() -> tuple[list[str], list[str]]:
    """What the node must do without: the checkout, the virtualenv's Python, Go, gcc."""
    dirs = {str(REPO), os.path.realpath(sys.base_prefix)}
    if REPO.parts[1] == "work":
        dirs.add("/work")
    go = shutil.which("go")
    if go:
        out = subprocess.run([go, "env", "GOROOT", "GOMODCACHE", "GOCACHE"], capture_output=True, text=True).stdout
        dirs |= {d for d in out.split() if d}
    if os.path.isdir("/root/.pyenv"):
        dirs.add("/root/.pyenv")
    files = {os.path.realpath(p) for p in (shutil.which(t) for t in ("gcc", "cc", "go")) if p}
    # A directory below another hidden one is hidden with it.
    top = sorted(d for d in dirs if not any(d != o and d.startswith(o.rstrip("/") + "/") for o in dirs))
    return top, sorted(f for f in files if not any(f.startswith(d + "/") for d in top))


def test_release_installs_restores_upgrades_and_uninstalls(weed, name):
    require(shutil.which("unshare") is not None, "unshare (util-linux)")
    require(Path(SYSTEM_PYTHON).is_file(), f"{SYSTEM_PYTHON} (the node's Python: Debian's python3, python3-venv)")
    require(subprocess.run([SYSTEM_PYTHON, "-c", "import venv, ensurepip"]).returncode == 0,
            f"{SYSTEM_PYTHON} with venv and ensurepip (python3-venv)")
    for b in ("containerd", "ctr", "containerd-shim-runsc-v1", "runsc", "thaw-runsc", "thaw-runsc-hooks",
              "thaw-chunk", "thaw-fetch", "thaw-gofer", "thaw-ctrinfo", "thaw-monitor", "busybox"):
        require((BUILD / b).is_file(), f"{b} built in {BUILD} (make setup)")
    work = Path(f"/tmp/thaw-it/{name}")
    _kill_leftovers(work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    bucket = name.replace("_", "-")[:60]
    t0 = time.monotonic()
    try:
        version_b = newer(VERSION)
        dist_a = release(REPO, work / "dist")
        tree_b, build_b = newer_build(work, version_b)
        dist_b = release(tree_b, work / "dist", build_b)
        built_s = time.monotonic() - t0
        archive = work / "image.tar"
        ocibuild.build(archive, IMAGE, ocibuild.busybox_files(
            BUILD / "busybox", {"/app/run.sh": ocibuild.File(COUNTER, 0o755)}), ["/app/run.sh"])
        hide_dirs, hide_files = hidden_paths()
        plan = {"work": str(work), "dist_a": str(dist_a), "dist_b": str(dist_b), "version_a": VERSION,
                "version_b": version_b, "endpoint": weed.endpoint, "bucket": bucket,
                "credentials": str(weed.credentials.write_aws_file(work / "aws-credentials")),
                "image_archive": str(archive), "image_ref": IMAGE, "annotations": ANNOTATIONS,
                "checkout": str(REPO), "hide_dirs": hide_dirs, "hide_files": hide_files}
        (work / "plan.json").write_text(json.dumps(plan))
        shutil.copy2(SCRIPT, work / SCRIPT.name)
        p = subprocess.run(["unshare", "--mount", "--propagation", "private", SYSTEM_PYTHON, "-I",
                            str(work / SCRIPT.name), str(work / "plan.json")],
                           capture_output=True, text=True, timeout=900, cwd="/")
        assert p.stdout.strip(), p.stderr[-4000:]
        report = json.loads(p.stdout.strip().splitlines()[-1])
        steps = {s["step"]: s for s in report["steps"]}
        print(f"release install test: releases built in {built_s:.0f} s, "
              f"whole test {time.monotonic() - t0:.0f} s; {json.dumps({k: v.get('seconds') for k, v in steps.items()})}")
        assert p.returncode == 0, (report.get("error"), report.get("cleanup_error"), p.stderr[-4000:])

        hidden = steps["hidden"]
        assert hidden["tools_that_run"] == [] and not hidden["checkout_visible"], hidden
        assert hidden["python"].startswith(SYSTEM_PYTHON)

        assert steps["install a"]["rc"] == 0
        va = steps["version a"]
        assert va["lines"][0] == f"thaw {VERSION} (runsc-thaw)"
        assert va["lines"][2].startswith("compatibility tuple: ") and "not computed" not in va["lines"][2]
        assert va["current"] == f"releases/{VERSION}"
        assert f"ExecStart=/opt/thaw/releases/{VERSION}/venv/bin/thaw serve" in va["unit"]
        assert 'path = "/opt/thaw/bin/runsc"' in va["config"] and weed.endpoint in va["config"]
        assert "added by thaw provision" in va["containerd_config"]

        cli = steps["cli"]
        assert cli["restore"]["mode"] == "restored"
        assert cli["cold_log"][:2] == ["home=/root", "home-writable"]   # the checkpointed log, first
        got = cli["restored_ticks"]
        # One count from 1, going on across the restore (a cold start would count from 1
        # again); the lines around the checkpoint may come twice (keep_log).
        restart = next(i for i in range(1, len(got)) if got[i] != got[i - 1] + 1) if \
            any(got[i] != got[i - 1] + 1 for i in range(1, len(got))) else len(got)
        assert got[:restart] == list(range(1, restart + 1))
        assert all(got[i] == got[i - 1] + 1 for i in range(restart + 1, len(got)))
        assert restart == len(got) or abs(got[restart] - 1 - got[restart - 1]) <= 5

        ctrd = steps["containerd a"]
        assert ctrd["boots"][0] == ctrd["boots"][1], "the second start is restored: same boot id"
        by_id = {d["id"]: d for d in ctrd["decisions"]}
        assert by_id["first"]["decision"] == "cold" and by_id["second"]["decision"] == "restore"
        assert by_id["second"]["thaw"] == VERSION   # the stand-in's version stamp
        assert steps["doctor a"]["rc"] == 0, steps["doctor a"]

        assert steps["install b"]["rc"] == 0
        up = steps["upgraded"]
        assert up["lines"][0] == f"thaw {version_b} (runsc-thaw)"
        assert up["current"] == f"releases/{version_b}" and up["releases"] == sorted([VERSION, version_b])
        assert up["thawd"][0] == f"/opt/thaw/releases/{version_b}/venv/bin/thaw"
        assert up["ps"].get("rel-cli2") == "running"      # a sandbox of the first release runs on
        assert up["restore"]["mode"] == "restored"
        assert up["boot"] == ctrd["boots"][0]                # the store's image restores under the new thaw
        assert up["decision"] == [{"id": "third", "decision": "restore", "thaw": version_b}]

        un = steps["uninstall"]
        assert un["rc"] == 0, un["out"]
        assert un["containerd_after"] == un["containerd_before"], "containerd's config as it was"
        assert un["left"] == [] and un["kept_config"]
    finally:
        _kill_leftovers(work)
        shutil.rmtree(work, ignore_errors=True)
