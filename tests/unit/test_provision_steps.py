"""control.node.provision's step engine on a temp tree with dummy binaries (no root,
no runsc: the node checks are exercised by tests/integration)."""
from __future__ import annotations

import functools
import json
import os
import stat
import tomllib
from pathlib import Path

import pytest

from control import config
from control.node import provision as prov
from control.errors import PreconditionError, ProvisionError, ThawError
from nvproxy import cdi
from nvproxy.gpu import Gpu, NodeGpus


def _settings(tmp_path: Path, **env: str) -> config.Settings:
    return config.load(environ=env, default_file=tmp_path / "absent")


def _source(tmp_path: Path, names=("runsc", "containerd-shim-runsc-v1", "thaw-cuda-checkpoint", "thaw-chunk",
                                   "thaw-fetch", "thaw-gofer", "thaw-ctrinfo")) -> Path:
    src = tmp_path / "build"
    src.mkdir()
    for n in names:
        (src / n).write_bytes(f"#!/bin/sh\n# {n}\n".encode())
        (src / n).chmod(0o700)
    return src


def _run(settings, opts, gpu=False) -> prov.Report:
    todo = prov.steps(settings, opts, gpu)
    plans: list[prov.Plan] = []
    for s in todo:
        plans.append(s.plan(plans))
    report = prov.Report([], plans, {})
    return prov.apply(report, todo)


def _tree(root: Path) -> dict[str, tuple]:
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(root))] = (stat.filemode(st.st_mode), st.st_mtime_ns,
                                         os.readlink(p) if p.is_symlink() else None)
    return out


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    opts = prov.Options(source_dir=_source(tmp_path), root=root, thaw_command=("/usr/bin/thaw",))
    return root, opts


def test_install_then_nothing_changes(tmp_path, tree):
    root, opts = tree
    s = _settings(tmp_path)
    first = _run(s, opts)
    assert {p.result for p in first.plans} <= {"created", "skipped"}
    bindir = root / "opt/thaw/bin"
    assert (bindir / "runsc").read_bytes() == (opts.source_dir / "runsc").read_bytes()
    assert stat.S_IMODE((bindir / "runsc").stat().st_mode) == 0o755    # source was 0700
    before = _tree(root)
    second = _run(s, opts)
    assert not second.changes
    assert {p.result for p in second.plans} <= {"unchanged", "skipped"}
    assert _tree(root) == before


def test_missing_standin_falls_back_to_real_runsc(tmp_path, tree):
    root, opts = tree
    r = _run(_settings(tmp_path), opts)
    skipped = {p.step: p for p in r.plans if p.action == prov.SKIP}
    assert skipped["install thaw-runsc"].warning
    assert "stand-in is not built" in skipped["install thaw-runsc"].detail
    assert tomllib.loads((root / "etc/thaw/runsc.toml").read_text())["binary_name"] == "/opt/thaw/bin/runsc"


def test_standin_installed_when_built(tmp_path, tree):
    root, opts = tree
    (opts.source_dir / "thaw-runsc").write_bytes(b"stand-in")
    _run(_settings(tmp_path), opts)
    assert (root / "opt/thaw/bin/thaw-runsc").read_bytes() == b"stand-in"
    assert tomllib.loads((root / "etc/thaw/runsc.toml").read_text())["binary_name"] == "/opt/thaw/bin/thaw-runsc"


def test_changed_source_and_mode_are_repaired(tmp_path, tree):
    root, opts = tree
    s = _settings(tmp_path)
    _run(s, opts)
    (opts.source_dir / "runsc").write_bytes(b"new build")
    (root / "opt/thaw/bin/containerd-shim-runsc-v1").chmod(0o700)
    r = _run(s, opts)
    changed = {p.step: p.detail for p in r.changes}
    assert changed == {"install runsc": "content differs",
                       "install containerd-shim-runsc-v1": "mode 0700 -> 0755"}
    assert (root / "opt/thaw/bin/runsc").read_bytes() == b"new build"


def test_seed_config_is_written_once_and_loads(tmp_path, tree):
    root, opts = tree
    s = _settings(tmp_path, THAW_NODE_MACHINE_TYPE="a3-highgpu-8g", THAW_CACHE_BUDGET_BYTES="50g")
    _run(s, opts)
    seeded = config.load(environ={}, config_file=root / "etc/thaw/config.toml")
    assert seeded.runsc_path == Path("/opt/thaw/bin/runsc")
    assert seeded.machine_type == "a3-highgpu-8g" and seeded.cache_budget_bytes == 50 << 30
    (root / "etc/thaw/config.toml").write_text("# mine\n")
    r = _run(s, opts)
    assert not r.changes
    assert (root / "etc/thaw/config.toml").read_text() == "# mine\n"


def test_gpu_node_needs_the_cuda_helper(tmp_path):
    root = tmp_path / "root"
    src = _source(tmp_path, names=("runsc", "containerd-shim-runsc-v1"))
    opts = prov.Options(source_dir=src, root=root)
    todo = prov.steps(_settings(tmp_path, THAW_NODE_GPU="no"), opts, gpu=False)
    assert any(isinstance(t, prov.Skip) and t.name == "install thaw-cuda-checkpoint" for t in todo)
    todo = prov.steps(_settings(tmp_path), opts, gpu=True)
    helper = next(t for t in todo if t.name == "install thaw-cuda-checkpoint")
    assert isinstance(helper, prov.WriteFile)
    assert "no source" in helper.plan([]).detail


def test_failed_step_reports_what_was_done(tmp_path, tree):
    root, opts = tree
    (root / "etc/thaw/runsc.toml").mkdir(parents=True)      # a directory where a file goes
    with pytest.raises(ProvisionError) as e:
        _run(_settings(tmp_path), opts)
    assert e.value.step == "runsc.toml"
    assert any("install runsc" in d for d in e.value.done)
    assert "done before it:" in str(e.value)
    report = e.value.report
    assert [p.result for p in report.plans if p.step == "runsc.toml"] == ["failed"]
    assert all(p.result == "" for p in report.plans[report.plans.index(
        next(p for p in report.plans if p.step == "runsc.toml")) + 1:])


def test_no_systemd_and_no_restart_under_root(tmp_path, tree):
    root, opts = tree
    s = _settings(tmp_path, THAW_CONTAINERD_RESTART_COMMAND="false")
    opts = prov.Options(source_dir=opts.source_dir, root=root, systemd=False, restart_containerd=True)
    r = _run(s, opts)
    steps = {p.step: p for p in r.plans}
    assert steps["thawd unit"].action == prov.SKIP and not (root / "etc/systemd").exists()
    # A tree is not the live node: its containerd is not restarted (`false` would fail the run).
    assert steps["restart containerd"].action == prov.SKIP
    assert "not the live node" in steps["restart containerd"].detail


def test_restart_runs_only_after_containerd_config_changed():
    plans = [prov.Plan("containerd drop-in", "/x", prov.CREATE), prov.Plan("runsc.toml", "/y", prov.UPDATE)]
    assert prov._changed(plans, "containerd drop-in", "containerd-imports") == (True, "changed: containerd drop-in")
    plans[0].action = prov.NONE
    assert prov._changed(plans, "containerd drop-in", "containerd-imports")[0] is False
    cmd = prov.Command("restart containerd", ["true"], lambda e: prov._changed(e, "runsc.toml"))
    plan = cmd.plan(plans)
    assert plan.action == prov.RUN
    cmd.apply(plan)
    with pytest.raises(Exception, match="exited 1"):
        prov.Command("x", ["false"], lambda e: (True, "")).apply(plan)


def test_unit_and_enable_link(tmp_path, tree):
    root, opts = tree
    _run(_settings(tmp_path), opts)
    unit = (root / "etc/systemd/system/thawd.service").read_text()
    assert "ExecStart=/usr/bin/thaw serve\n" in unit and "WantedBy=multi-user.target" in unit
    link = root / "etc/systemd/system/multi-user.target.wants/thawd.service"
    assert os.readlink(link) == "/etc/systemd/system/thawd.service"


DRIVER = "580.159.04"
NODE = NodeGpus(DRIVER, "13.0", tuple(Gpu(i, "NVIDIA H200", f"GPU-{i}", m, 150 << 30, f"0000:0{i}:00.0")
                                       for i, m in enumerate((3, 1))), "nvml")


@pytest.fixture
def driver(tmp_path):
    """Driver files as a node has them: real libraries plus their symlinks, nvidia-smi;
    `generate` is nvproxy.cdi.generate pointed at them."""
    lib, bin_ = tmp_path / "driver/lib", tmp_path / "driver/bin"
    lib.mkdir(parents=True)
    bin_.mkdir()
    for name in ("libcuda", "libnvidia-ml"):
        (lib / f"{name}.so.{DRIVER}").write_bytes(b"\x7fELF")
        (lib / f"{name}.so.1").symlink_to(f"{name}.so.{DRIVER}")
    (bin_ / "nvidia-smi").write_bytes(b"\x7fELF")
    return functools.partial(cdi.generate, lib_dirs=[lib], bin_dirs=[bin_], exists=lambda p: True)


def test_cdi_spec_is_nvproxy_cdis_and_kept_in_step(tmp_path, driver):
    root = tmp_path / "root"
    step = prov.CdiSpec(prov.Layout(root), NODE, generate=driver)
    plan = step.plan([])
    assert (plan.action, plan.target, plan.error) == (prov.CREATE, str(root / "etc/cdi/thaw-nvidia.json"), "")
    step.apply(plan)
    path = root / "etc/cdi/thaw-nvidia.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert json.loads(path.read_text()) == driver(NODE)
    reg = cdi.load_dirs([root / "etc/cdi"])
    assert reg.names() == ["nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=GPU-0", "nvidia.com/gpu=GPU-1",
                           "nvidia.com/gpu=all"]
    assert [n.path for n in reg.resolve("nvidia.com/gpu=0")[1].edits.device_nodes] == ["/dev/nvidia3"]
    # A second run changes nothing; a GPU gone from the node rewrites it.
    assert prov.CdiSpec(prov.Layout(root), NODE, generate=driver).plan([]).action == prov.NONE
    one = NodeGpus(DRIVER, "13.0", NODE.gpus[:1], "nvml")
    again = prov.CdiSpec(prov.Layout(root), one, generate=driver)
    plan = again.plan([])
    assert plan.action == prov.UPDATE
    again.apply(plan)
    assert "nvidia.com/gpu=1" not in cdi.load_dirs([root / "etc/cdi"]).names()
    path.chmod(0o600)
    assert prov.CdiSpec(prov.Layout(root), one, generate=driver).plan([]).detail == "mode 0600 -> 0644"


def test_an_existing_nvidia_spec_is_respected_and_ours_is_not_read(tmp_path, driver):
    root = tmp_path / "root"
    (root / "etc/cdi").mkdir(parents=True)
    (root / "etc/cdi/thaw-nvidia.json").write_text("{ not json")     # ours, left half-written: rewritten
    assert prov.CdiSpec(prov.Layout(root), NODE, generate=driver).plan([]).action == prov.UPDATE
    (root / "var/run/cdi").mkdir(parents=True)
    (root / "var/run/cdi/nvidia.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: all\n  containerEdits:\n"
        "    deviceNodes:\n    - path: /dev/nvidia0\n")
    plan = prov.CdiSpec(prov.Layout(root), NODE, generate=driver).plan([])
    assert (plan.action, plan.target) == (prov.SKIP, str(root / "var/run/cdi/nvidia.yaml"))
    assert not plan.warning and not plan.error
    # Another vendor's spec is no reason to skip ours.
    (root / "var/run/cdi/nvidia.yaml").unlink()
    (root / "etc/cdi/acme.json").write_text(json.dumps({"cdiVersion": "0.6.0", "kind": "acme.com/fpga", "devices": [
        {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/fpga0"}]}}]}))
    assert prov.CdiSpec(prov.Layout(root), NODE, generate=driver).plan([]).action == prov.UPDATE


def test_cpu_node_gets_no_cdi_spec(tmp_path, tree):
    root, opts = tree
    steps = {s.name: s for s in prov.steps(_settings(tmp_path), opts, gpu=False)}
    assert isinstance(steps["cdi spec"], prov.Skip)
    steps = {s.name: s for s in prov.steps(_settings(tmp_path), opts, gpu=True, gpus=NODE)}
    assert isinstance(steps["cdi spec"], prov.CdiSpec) and steps["cdi spec"].gpus == NODE


def test_a_cdi_spec_that_cannot_be_made_stops_provision_before_any_change(tmp_path, tree, monkeypatch):
    root, opts = tree
    # No driver libraries where nvproxy.cdi looks: its PreconditionError becomes the plan's error.
    nolibs = functools.partial(cdi.generate, lib_dirs=[tmp_path / "nolibs"], bin_dirs=[], exists=lambda p: True)
    plan = prov.CdiSpec(prov.Layout(root), NODE, generate=nolibs).plan([])
    assert plan.action == prov.SKIP and plan.warning and "libcuda.so.580.159.04" in plan.error
    assert prov._installed(plan).status == "fail"          # doctor fails the line
    # A broken spec someone else wrote: named, and we cannot tell whether it defines the GPUs.
    (root / "etc/cdi").mkdir(parents=True)
    (root / "etc/cdi/broken.json").write_text('{"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu"}')
    plan = prov.CdiSpec(prov.Layout(root), NODE, generate=nolibs).plan([])
    assert "broken.json" in plan.error and "devices" in plan.error

    monkeypatch.setattr(prov, "make_plan", lambda s, o: (prov.Report([], [plan], {}), [None]))
    with pytest.raises(PreconditionError, match="cdi spec: cannot read the CDI specs") as e:
        prov.provision(_settings(tmp_path), opts)
    assert e.value.report.plans[0].result == ""


def test_layout_requires_absolute_paths(tmp_path):
    lay = prov.Layout(tmp_path)
    assert lay.host(Path("/etc/x")) == tmp_path / "etc/x"
    with pytest.raises(ThawError, match="absolute"):
        lay.host(Path("etc/x"))


def _thp(root: Path, shmem: str = "always within_size advise [never] deny force",
         defrag: str = "always defer defer+madvise [madvise] never") -> Path:
    """A stand-in for /sys/kernel/mm/transparent_hugepage with the H200 VM's values."""
    d = root / "sys/kernel/mm/transparent_hugepage"
    d.mkdir(parents=True)
    (d / "shmem_enabled").write_text(shmem + "\n")
    (d / "defrag").write_text(defrag + "\n")
    return d


def test_gpu_node_gets_host_huge_pages_now_and_at_boot(tmp_path, tree):
    root, opts = tree
    d = _thp(root)
    s = _settings(tmp_path)
    first = _run(s, opts, gpu=True)
    plan = next(p for p in first.plans if p.step == "host huge pages")
    assert (plan.action, plan.detail) == ("update", "shmem_enabled never -> advise, defrag madvise -> defer")
    assert plan.result == "updated"
    assert (d / "shmem_enabled").read_text() == "advise" and (d / "defrag").read_text() == "defer"
    boot = (root / "etc/tmpfiles.d/thaw-huge-pages.conf").read_text()
    assert "w /sys/kernel/mm/transparent_hugepage/shmem_enabled - - - - advise\n" in boot
    assert "w /sys/kernel/mm/transparent_hugepage/defrag - - - - defer\n" in boot
    second = _run(s, opts, gpu=True)
    assert not second.changes, [p for p in second.changes]


def test_huge_pages_keep_a_defrag_runsc_accepts(tmp_path, tree):
    root, opts = tree
    d = _thp(root, defrag="always defer defer+madvise madvise [never]")
    plan = next(p for p in _run(_settings(tmp_path), opts, gpu=True).plans if p.step == "host huge pages")
    assert plan.detail == "shmem_enabled never -> advise"    # defrag never: runsc takes it as it is
    assert (d / "defrag").read_text().startswith("always defer")
    assert "defrag - - - - never" in (root / "etc/tmpfiles.d/thaw-huge-pages.conf").read_text()


@pytest.mark.parametrize("env, gpu", [({}, False), ({"THAW_NODE_HUGE_PAGES": "no"}, True)])
def test_huge_pages_are_left_alone_on_cpu_nodes_and_when_off(tmp_path, tree, env, gpu):
    root, opts = tree
    d = _thp(root)
    before = (d / "shmem_enabled").read_text()
    plans = {p.step: p for p in _run(_settings(tmp_path, **env), opts, gpu=gpu).plans}
    assert plans["host huge pages"].action == "skip" and not plans["host huge pages"].warning
    assert (d / "shmem_enabled").read_text() == before
    assert not (root / "etc/tmpfiles.d/thaw-huge-pages.conf").exists()


def test_huge_pages_on_any_node_when_asked_and_a_missing_sysfs_is_said(tmp_path, tree):
    root, opts = tree
    plans = {p.step: p for p in _run(_settings(tmp_path, THAW_NODE_HUGE_PAGES="yes"), opts).plans}
    p = plans["host huge pages"]
    assert p.action == "skip" and p.warning and "cannot read the host's THP settings" in p.detail
    _thp(root)
    plans = {p.step: p for p in _run(_settings(tmp_path, THAW_NODE_HUGE_PAGES="yes"), opts).plans}
    assert plans["host huge pages"].result == "updated"


def test_thp_selected_reads_the_bracketed_word():
    assert prov.thp_selected("always defer defer+madvise [madvise] never\n") == "madvise"
    assert prov.thp_selected("advise\n") == "advise"
    assert prov.thp_selected("") == ""


def test_provision_makes_the_stand_ins_log_dir_and_seeds_its_log_bounds(tmp_path):
    """issue 33: the stand-in rotates its log and bounds the shim's; it reads the bounds from
    the node's config file, which provision seeds with every value it ran with."""
    from control import config
    from control.node import provision
    s = config.load(environ={"THAW_STANDIN_LOG": "/var/log/thaw-standin/standin.log",
                             "THAW_STANDIN_LOG_MAX_BYTES": "4m", "THAW_STANDIN_SHIM_LOGS_KEEP": "50"},
                    default_file=tmp_path / "absent.toml")
    seeded = provision.seed_config(s)
    assert "log_max_bytes = 4194304" in seeded and "shim_logs_keep = 50" in seeded
    names = [st.name for st in provision.steps(s, provision.Options(source_dir=tmp_path, root=tmp_path,
                                                                    systemd=False), gpu=False)]
    assert "stand-in log dir" in names and "shim log dir" in names


# -- the reads thaw-gofer offers a verified restore (control/node/hugepages.py) --------------

@pytest.mark.parametrize("shmem, defrag, huge", [
    ("always", "madvise", True), ("within_size", "never", True), ("force", "", True),
    ("advise", "defer", True), ("advise", "always", True), ("advise", "never", True),
    ("advise", "madvise", False), ("advise", "defer+madvise", False), ("advise", "", False),
    ("never", "defer", False), ("deny", "defer", False), ("", "", False),
])
def test_runsc_huge_pages_follows_runsc_create_memory_file(shmem, defrag, huge):
    from control.node.hugepages import runsc_huge_pages
    assert runsc_huge_pages({"shmem_enabled": shmem, "defrag": defrag}) is huge


def test_gofer_read_shape_is_the_loader_patchs_on_huge_pages_with_enough_cpus():
    from control.node.hugepages import gofer_read_shape
    assert gofer_read_shape(True, 16) == (12, 4 << 20)
    assert gofer_read_shape(True, 12) == (12, 4 << 20)
    assert gofer_read_shape(True, 11) == (32, 256 << 10)
    assert gofer_read_shape(False, 64) == (32, 256 << 10)


def test_gofer_huge_readers_name_the_build_scripts_values():
    """Twins: ci/build-go.sh passes the same shape to ci/patch-runsc-loader.py."""
    from control.node import hugepages
    text = (config.REPO_ROOT / "ci" / "build-go.sh").read_text()
    assert f"RESTORE_HUGE_READERS={hugepages.GOFER_HUGE_READERS} " in text
    assert f"RESTORE_HUGE_READ_KIB={hugepages.GOFER_HUGE_READ_BYTES >> 10}\n" in text


def test_host_huge_pages_reads_a_thp_tree(tmp_path):
    from control.node.hugepages import host_huge_pages
    (tmp_path / "shmem_enabled").write_text("always within_size [advise] never deny force\n")
    (tmp_path / "defrag").write_text("always [defer] defer+madvise madvise never\n")
    assert host_huge_pages(tmp_path) is True
    (tmp_path / "defrag").write_text("always defer defer+madvise [madvise] never\n")
    assert host_huge_pages(tmp_path) is False
    assert host_huge_pages(tmp_path / "missing") is False
