"""nvproxy/cdi.py: CDI parsing, generation, injection and re-injection on restore."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from control.errors import NotFound, PreconditionError, SpecError
from nvproxy import cdi, restore_spec
from nvproxy.gpu import Gpu, NodeGpus
from runsc_hooks import spec as specmod

DRIVER = "580.159.04"

# What `nvidia-ctk cdi generate` writes (trimmed): YAML, spec-level edits with a
# hook, per-GPU device nodes.
CTK_YAML = f"""\
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: "1"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia1
- name: GPU-bbbb
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia1
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    - path: /dev/nvidia1
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  - LD_LIBRARY_PATH=/usr/local/nvidia/lib64
  deviceNodes:
  - path: /dev/nvidiactl
  - path: /dev/nvidia-uvm
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
    args: [nvidia-cdi-hook, update-ldcache, --folder, /usr/local/nvidia/lib64]
  mounts:
  - hostPath: /usr/local/nvidia/lib64/libcuda.so.{DRIVER}
    containerPath: /usr/local/nvidia/lib64/libcuda.so.{DRIVER}
    options: [ro, nosuid, nodev, bind]
"""

# Host device nodes by path: (char device, major, minor).
NODES = {"/dev/nvidiactl": (195, 255), "/dev/nvidia-uvm": (510, 0), **{f"/dev/nvidia{i}": (195, i) for i in range(8)}}


def fake_stat(path: str) -> os.stat_result:
    if path not in NODES:
        raise FileNotFoundError(2, "No such file or directory", path)
    major, minor = NODES[path]
    fields = list(os.stat("/"))
    fields[0] = stat.S_IFCHR | 0o666
    return os.stat_result(fields, {"st_rdev": os.makedev(major, minor)})


def test_fake_stat_is_a_char_device():
    st = fake_stat("/dev/nvidia3")
    assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (195, 3)


@pytest.fixture
def base(tmp_path) -> dict:
    sp = specmod.command_spec(["/usr/bin/python3", "/srv/server.py"], rootfs=str(tmp_path / "root"),
                              env={"LD_LIBRARY_PATH": "/opt/lib"})
    sp["annotations"]["cdi.k8s.io/gpu"] = "nvidia.com/gpu=0"
    return sp


@pytest.fixture
def cdi_dirs(tmp_path) -> tuple[Path, Path]:
    etc, run = tmp_path / "etc-cdi", tmp_path / "run-cdi"
    etc.mkdir()
    run.mkdir()
    (etc / "nvidia.yaml").write_text(CTK_YAML)
    return etc, run


# -- reading ----------------------------------------------------------------------

def test_load_dirs_reads_yaml_and_later_dirs_override(cdi_dirs):
    etc, run = cdi_dirs
    (run / "override.json").write_text(json.dumps({
        "cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
        "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia7"}]}}]}))
    (run / "notes.txt").write_text("not a spec")
    reg = cdi.load_dirs([etc, run, etc.parent / "missing"])
    assert reg.names("nvidia.com/gpu") == ["nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=GPU-bbbb",
                                           "nvidia.com/gpu=all"]
    spec0, dev0 = reg.resolve("nvidia.com/gpu=0")
    assert spec0.path.endswith("override.json")
    assert [n.path for n in dev0.edits.device_nodes] == ["/dev/nvidia7"]
    spec1, _ = reg.resolve("nvidia.com/gpu=1")
    assert spec1.edits.hooks[0].args[1] == "update-ldcache"


@pytest.mark.parametrize("doc, field", [
    ([], "(root)"),
    ({"kind": "nvidia.com/gpu", "devices": []}, "cdiVersion"),
    ({"cdiVersion": "0.6.0", "kind": "gpu", "devices": [{"name": "0", "containerEdits": {}}]}, "kind"),
    ({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": []}, "devices"),
    ({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": [{"name": "a b", "containerEdits": {}}]},
     "devices[0].name"),
    ({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
      "devices": [{"name": "0", "containerEdits": {}}, {"name": "0", "containerEdits": {}}]}, "devices[1].name"),
    ({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": [{"name": "0"}]}, "devices[0].containerEdits"),
    ({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
      "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/tmp/x"}]}}]},
     "devices[0].containerEdits.deviceNodes[0].path"),
    ({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
      "devices": [{"name": "0", "containerEdits": {"mounts": [{"hostPath": "/a", "containerPath": "b"}]}}]},
     "devices[0].containerEdits.mounts[0].containerPath"),
    ({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": [{"name": "0", "containerEdits": {}}],
      "containerEdits": {"hooks": [{"hookName": "later", "path": "/bin/true"}]}}, "containerEdits.hooks[0].hookName"),
    ({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": [{"name": "0", "containerEdits": {}}],
      "containerEdits": {"env": ["NOEQUALS"]}}, "containerEdits.env"),
])
def test_bad_specs_name_the_field(doc, field):
    with pytest.raises(SpecError) as ei:
        cdi.parse(doc, "/etc/cdi/x.json")
    assert ei.value.field == field
    assert "/etc/cdi/x.json" in str(ei.value)


def test_unreadable_files_are_spec_errors(tmp_path):
    (tmp_path / "a.yaml").write_text("kind: [unclosed\n")
    (tmp_path / "b.json").write_text("{nope")
    with pytest.raises(SpecError, match="not valid YAML"):
        cdi.load_file(tmp_path / "a.yaml")
    with pytest.raises(SpecError, match="not valid JSON"):
        cdi.load_file(tmp_path / "b.json")


def test_requested_devices_from_annotations(base):
    base["annotations"]["cdi.k8s.io/extra"] = "nvidia.com/gpu=1, nvidia.com/gpu=0"
    base["annotations"]["other"] = "nvidia.com/gpu=5"
    assert cdi.requested_devices(base) == ["nvidia.com/gpu=1", "nvidia.com/gpu=0"]
    base["annotations"]["cdi.k8s.io/bad"] = "gpu0"
    with pytest.raises(SpecError, match="not a CDI device name"):
        cdi.requested_devices(base)


# -- injecting --------------------------------------------------------------------

def test_inject_applies_spec_and_device_edits(cdi_dirs, base):
    reg = cdi.load_dirs(cdi_dirs)
    out = cdi.inject(base, reg, cdi.requested_devices(base), stat=fake_stat)
    specmod.validate(out)
    devs = {d["path"]: d for d in out["linux"]["devices"]}
    assert set(devs) == {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0"}
    assert devs["/dev/nvidia0"] == {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0,
                                    "fileMode": 0o666, "uid": 0, "gid": 0}
    assert {"allow": True, "type": "c", "major": 510, "minor": 0, "access": "rwm"} in \
        out["linux"]["resources"]["devices"]
    env = dict(e.split("=", 1) for e in out["process"]["env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64:/opt/lib"   # path lists are prepended to
    lib = f"/usr/local/nvidia/lib64/libcuda.so.{DRIVER}"
    assert {"destination": lib, "source": lib, "type": "bind", "options": ["ro", "nosuid", "nodev", "bind"]} \
        in out["mounts"]
    assert out["hooks"]["createContainer"][0]["path"] == "/usr/bin/nvidia-cdi-hook"
    assert base.get("hooks") is None and "/dev/nvidia0" not in json.dumps(base["linux"])   # input untouched


def test_spec_level_edits_apply_once_for_several_devices(cdi_dirs, base):
    reg = cdi.load_dirs(cdi_dirs)
    out = cdi.inject(base, reg, ["nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=GPU-bbbb"], stat=fake_stat)
    assert cdi.gpu_nodes(out) == ["/dev/nvidia0", "/dev/nvidia1"]
    assert len(out["hooks"]["createContainer"]) == 1
    assert [d["path"] for d in out["linux"]["devices"]].count("/dev/nvidia1") == 1


def test_missing_device_is_a_clear_error(cdi_dirs, base):
    reg = cdi.load_dirs(cdi_dirs)
    with pytest.raises(NotFound) as ei:
        cdi.inject(base, reg, ["nvidia.com/gpu=3"], stat=fake_stat)
    msg = str(ei.value)
    assert "CDI device 'nvidia.com/gpu=3' not found" in msg
    assert "nvidia.com/gpu=0, nvidia.com/gpu=1" in msg and "nvidia.yaml" in msg


def test_device_node_missing_on_host(cdi_dirs, base):
    reg = cdi.load_dirs(cdi_dirs)
    with pytest.raises(PreconditionError, match="/dev/nvidiactl is not on this node"):
        cdi.inject(base, reg, ["nvidia.com/gpu=0"], stat=lambda p: (_ for _ in ()).throw(FileNotFoundError(2, "gone")))


def test_strip_undoes_inject(cdi_dirs, base):
    reg = cdi.load_dirs(cdi_dirs)
    out = cdi.strip(cdi.inject(base, reg, ["nvidia.com/gpu=all"], stat=fake_stat))
    assert out["mounts"] == base["mounts"]
    assert out["linux"].get("devices") == [] and out["linux"]["resources"]["devices"] == []
    assert out["hooks"] == {"createContainer": []}
    assert cdi.INJECTED_ANNOTATION not in out["annotations"]
    # Injected env keys go (their old value is not kept: env may differ at restore).
    assert not [e for e in out["process"]["env"] if e.startswith(("LD_LIBRARY_PATH=", "NVIDIA_VISIBLE_DEVICES="))]


# -- generating -------------------------------------------------------------------

def driver_tree(root: Path, libdir: str = "usr/local/nvidia/lib64") -> tuple[Path, Path]:
    lib, bindir = root / libdir, root / "bin"
    lib.mkdir(parents=True)
    bindir.mkdir()
    for name in ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler"):
        (lib / f"{name}.so.{DRIVER}").write_bytes(b"\x7fELF")
        (lib / f"{name}.so.1").symlink_to(f"{name}.so.{DRIVER}")
    (lib / "libcuda.so").symlink_to("libcuda.so.1")
    (lib / "libcuda.so.535.1").write_bytes(b"old driver")     # another version: not mounted
    (bindir / "nvidia-smi").write_bytes(b"#!")
    return lib, bindir


NODE = NodeGpus(DRIVER, "13.0", (
    Gpu(0, "NVIDIA H200", "GPU-aaaa", 0, 150 << 30, "0000:01:00.0"),
    Gpu(1, "NVIDIA H200", "GPU-bbbb", 1, 150 << 30, "0000:02:00.0"),
))


def test_generate_for_a_node(tmp_path):
    lib, bindir = driver_tree(tmp_path)
    doc = cdi.generate(NODE, lib_dirs=[tmp_path / "nothing", lib], bin_dirs=[bindir], exists=lambda p: True)
    spec = cdi.parse(doc)
    assert spec.kind == "nvidia.com/gpu"
    assert [d.name for d in spec.devices] == ["0", "GPU-aaaa", "1", "GPU-bbbb", "all"]
    assert [n.path for n in spec.device("GPU-bbbb").edits.device_nodes] == ["/dev/nvidia1"]
    assert [n.path for n in spec.device("all").edits.device_nodes] == ["/dev/nvidia0", "/dev/nvidia1"]
    assert [n.path for n in spec.edits.device_nodes] == ["/dev/nvidiactl", "/dev/nvidia-uvm"]
    mounts = {m.container_path: m.host_path for m in spec.edits.mounts}
    real = str(lib / f"libcuda.so.{DRIVER}")
    assert mounts[real] == real
    assert mounts[str(lib / "libcuda.so.1")] == real      # links are mounted from the real file
    assert mounts[str(lib / "libcuda.so")] == real
    assert str(lib / "libcuda.so.535.1") not in mounts
    assert mounts[str(bindir / "nvidia-smi")] == str(bindir / "nvidia-smi")
    assert spec.edits.env == (f"LD_LIBRARY_PATH={lib}",)


def test_generated_spec_round_trips_through_the_cdi_dir(tmp_path, base):
    lib, bindir = driver_tree(tmp_path)
    doc = cdi.generate(NODE, lib_dirs=[lib], bin_dirs=[bindir], exists=lambda p: True)
    path = cdi.write_spec(doc, tmp_path / "run-cdi")
    assert path.name == "thaw-nvidia.json" and not list(path.parent.glob(".*partial*"))
    reg = cdi.load_dirs([tmp_path / "run-cdi"])
    out = cdi.inject(base, reg, ["nvidia.com/gpu=GPU-bbbb"], stat=fake_stat)
    assert cdi.gpu_nodes(out) == ["/dev/nvidia1"]


def test_node_registry_prefers_spec_files(cdi_dirs, tmp_path):
    lib, bindir = driver_tree(tmp_path)
    kw = dict(lib_dirs=[lib], bin_dirs=[bindir], exists=lambda p: True)
    from_files = cdi.node_registry(NODE, cdi_dirs, **kw)
    assert [s.path.endswith("nvidia.yaml") for s in from_files.specs] == [True]
    generated = cdi.node_registry(NODE, [tmp_path / "empty"], **kw)
    assert [s.path for s in generated.specs] == [""]
    assert "nvidia.com/gpu=GPU-aaaa" in generated.names()
    assert cdi.node_registry(NodeGpus(), [tmp_path / "empty"]).names() == []


def test_generate_without_gpu_or_driver_files(tmp_path):
    with pytest.raises(PreconditionError, match="no NVIDIA GPU"):
        cdi.generate(NodeGpus(), lib_dirs=[tmp_path])
    with pytest.raises(PreconditionError, match=f"libcuda.so.{DRIVER}, libnvidia-ml.so.{DRIVER} not found"):
        cdi.generate(NODE, lib_dirs=[tmp_path], bin_dirs=[])
    lib, bindir = driver_tree(tmp_path)
    with pytest.raises(PreconditionError, match="/dev/nvidia-uvm"):
        cdi.generate(NODE, lib_dirs=[lib], bin_dirs=[bindir], exists=lambda p: p != "/dev/nvidia-uvm")


def test_libraries_in_loader_dirs_need_no_env(tmp_path, monkeypatch):
    lib, bindir = driver_tree(tmp_path)
    monkeypatch.setattr(cdi, "_LOADER_DIRS", {str(lib)})
    doc = cdi.generate(NODE, lib_dirs=[lib], bin_dirs=[bindir], exists=lambda p: True)
    assert "env" not in doc["containerEdits"]


# -- restore ----------------------------------------------------------------------

def registry_for(tmp_path: Path, libdir: str) -> cdi.Registry:
    lib, bindir = driver_tree(tmp_path / libdir.replace("/", "-"), libdir)
    return cdi.Registry([cdi.parse(cdi.generate(NODE_8, lib_dirs=[lib], bin_dirs=[bindir], exists=lambda p: True))])


NODE_8 = NodeGpus(DRIVER, "13.0", tuple(Gpu(i, "NVIDIA H200", f"GPU-{i}", i, 150 << 30, f"0000:0{i}:00.0")
                                        for i in range(8)))


def test_restore_on_other_minors_keeps_mounts(tmp_path, base):
    reg = registry_for(tmp_path, "drv")
    saved = cdi.inject(base, reg, ["nvidia.com/gpu=0"], stat=fake_stat)
    new = restore_spec.for_restore(saved, saved, reg, ["nvidia.com/gpu=5"], stat=fake_stat)
    assert cdi.gpu_nodes(saved) == ["/dev/nvidia0"]
    assert cdi.gpu_nodes(new) == ["/dev/nvidia5"]
    assert [m["destination"] for m in new["mounts"]] == [m["destination"] for m in saved["mounts"]]
    assert json.loads(new["annotations"][cdi.INJECTED_ANNOTATION])["devices"] == ["nvidia.com/gpu=5"]
    specmod.validate(new)


def test_restore_several_gpus(tmp_path, base):
    reg = registry_for(tmp_path, "drv")
    saved = cdi.inject(base, reg, ["nvidia.com/gpu=0", "nvidia.com/gpu=1"], stat=fake_stat)
    new = restore_spec.for_restore(base, saved, reg, ["nvidia.com/gpu=6", "nvidia.com/gpu=3"], stat=fake_stat)
    assert cdi.gpu_nodes(new) == ["/dev/nvidia3", "/dev/nvidia6"]     # sorted by minor, as runsc pairs them
    with pytest.raises(SpecError, match=r"checkpoint has 2 GPU\(s\) .*assigns 1 \(/dev/nvidia3\)"):
        restore_spec.for_restore(base, saved, reg, ["nvidia.com/gpu=3"], stat=fake_stat)


def test_restore_maps_moved_driver_files_back_to_saved_destinations(tmp_path, base):
    saved = cdi.inject(base, registry_for(tmp_path, "usr/local/nvidia/lib64"), ["nvidia.com/gpu=0"], stat=fake_stat)
    other = registry_for(tmp_path, "usr/lib64/nvidia")      # the driver lives elsewhere on this node
    new = restore_spec.for_restore(base, saved, other, ["nvidia.com/gpu=2"], stat=fake_stat)
    by_dest = {m["destination"]: m["source"] for m in new["mounts"]}
    dest = str(tmp_path / "usr-local-nvidia-lib64/usr/local/nvidia/lib64" / f"libcuda.so.{DRIVER}")
    assert by_dest[dest] == str(tmp_path / "usr-lib64-nvidia/usr/lib64/nvidia" / f"libcuda.so.{DRIVER}")
    assert sorted(by_dest) == sorted(m["destination"] for m in saved["mounts"])


def test_restore_refuses_mount_differences(tmp_path, base):
    reg = registry_for(tmp_path, "drv")
    saved = cdi.inject(base, reg, ["nvidia.com/gpu=0"], stat=fake_stat)
    fewer = json.loads(json.dumps(saved))
    fewer["mounts"] = [m for m in fewer["mounts"] if "ptxjit" not in m["destination"]]
    with pytest.raises(SpecError, match="ptxjitcompiler.* mounted on this node but not in the checkpoint"):
        restore_spec.for_restore(base, fewer, reg, ["nvidia.com/gpu=1"], stat=fake_stat)
    more = json.loads(json.dumps(saved))
    more["mounts"].append(specmod.bind_mount("/srv/models", "/models"))
    with pytest.raises(SpecError, match="/models mounted in the checkpoint but not on this node"):
        restore_spec.for_restore(base, more, reg, ["nvidia.com/gpu=1"], stat=fake_stat)
    rw = json.loads(json.dumps(saved))
    rw["mounts"][-1]["options"] = ["rw", "bind"]
    with pytest.raises(SpecError, match="type/options"):
        restore_spec.for_restore(base, rw, reg, ["nvidia.com/gpu=1"], stat=fake_stat)


def test_restore_refuses_other_non_gpu_devices(tmp_path, base):
    reg = registry_for(tmp_path, "drv")
    saved = cdi.inject(base, reg, ["nvidia.com/gpu=0"], stat=fake_stat)
    saved["linux"]["devices"].append({"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229})
    with pytest.raises(SpecError, match="device set differs.*fuse"):
        restore_spec.for_restore(base, saved, reg, ["nvidia.com/gpu=0"], stat=fake_stat)


def test_restore_with_a_device_this_node_lacks(tmp_path, base):
    reg = registry_for(tmp_path, "drv")
    saved = cdi.inject(base, reg, ["nvidia.com/gpu=0"], stat=fake_stat)
    with pytest.raises(NotFound, match="nvidia.com/gpu=9"):
        restore_spec.for_restore(base, saved, reg, ["nvidia.com/gpu=9"], stat=fake_stat)
