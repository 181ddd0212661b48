import os

import pytest

from control.errors import SpecError
from runsc_hooks import spec as specmod


def good_spec(**over):
    s = specmod.command_spec(["/bin/true"], rootfs="/tmp/rootfs")
    s.update(over)
    return s


def test_command_spec_is_valid_and_has_private_tmp():
    s = good_spec()
    assert specmod.validate(s) is s
    dests = [m["destination"] for m in s["mounts"]]
    assert "/tmp" in dests and "/proc" in dests
    assert s["root"] == {"path": "/tmp/rootfs", "readonly": True}


@pytest.mark.parametrize("mutate, field", [
    (lambda s: s.pop("ociVersion"), "ociVersion"),
    (lambda s: s["process"].update(args=[]), "process.args"),
    (lambda s: s["process"].update(args=["", "x"]), "process.args[0]"),
    (lambda s: s["process"].update(cwd="relative"), "process.cwd"),
    (lambda s: s["process"].update(env=["NOEQUALS"]), "process.env"),
    (lambda s: s["process"]["user"].update(uid=-1), "process.user.uid"),
    (lambda s: s.update(root={"path": ""}), "root.path"),
    (lambda s: s["mounts"].append({"destination": "rel"}), "mounts[7].destination"),
    (lambda s: s["mounts"].append({"destination": "/a/../b"}), "mounts[7].destination"),
    (lambda s: s["linux"]["namespaces"].append({"type": "bogus"}), "linux.namespaces[4].type"),
    (lambda s: s["linux"].update(devices=[{"path": "/etc/x", "type": "c"}]), "linux.devices[0].path"),
    (lambda s: s.update(annotations={"a": 1}), "annotations"),
])
def test_validate_names_the_bad_field(mutate, field):
    s = good_spec()
    mutate(s)
    with pytest.raises(SpecError) as e:
        specmod.validate(s, "cfg.json")
    assert e.value.field == field
    assert field in str(e.value) and "cfg.json" in str(e.value)


def test_bundle_roundtrip_and_errors(tmp_path):
    b = specmod.Bundle(tmp_path / "b")
    with pytest.raises(SpecError, match="does not exist"):
        b.load()
    b.write(good_spec())
    assert b.load()["process"]["args"] == ["/bin/true"]
    assert not [p for p in b.path.iterdir() if "partial" in p.name]
    b.config_path.write_text("{not json")
    with pytest.raises(SpecError, match="not valid JSON"):
        b.load()
    with pytest.raises(SpecError):
        b.write({"ociVersion": "1"})
    assert b.config_path.read_text() == "{not json"  # a rejected write leaves the old file


def test_with_netns_replaces_network_namespace():
    s = good_spec()
    s2 = specmod.with_netns(s, "/var/run/netns/x")
    s3 = specmod.with_netns(s2, "/var/run/netns/y")
    nets = [ns for ns in s3["linux"]["namespaces"] if ns["type"] == "network"]
    assert nets == [{"type": "network", "path": "/var/run/netns/y"}]
    assert not [ns for ns in s["linux"]["namespaces"] if ns["type"] == "network"]  # input untouched
    assert not [ns for ns in specmod.with_netns(s3, None)["linux"]["namespaces"] if ns["type"] == "network"]


def test_host_layout_binds_readonly_and_skips_covered_paths():
    mounts = specmod.host_layout(["/usr/lib", "/srv/thaw-nonexistent-x"])
    dests = [m["destination"] for m in mounts]
    assert "/usr" in dests and "/usr/lib" not in dests
    assert "/srv/thaw-nonexistent-x" in dests
    assert all("ro" in m["options"] for m in mounts)
    assert not any(os.path.islink(d) for d in dests)


def test_prepare_host_rootfs_mirrors_usr_merge_links(tmp_path):
    root = specmod.prepare_host_rootfs(tmp_path / "r")
    for d in specmod.HOST_SYSTEM_DIRS:
        if os.path.islink(d):
            assert os.readlink(root / d.lstrip("/")) == os.readlink(d)
    specmod.prepare_host_rootfs(tmp_path / "r")  # idempotent


def test_host_layout_binds_every_symlink_hop(tmp_path):
    (tmp_path / "real" / "bin").mkdir(parents=True)
    (tmp_path / "real" / "bin" / "py3.11").write_text("")
    (tmp_path / "real" / "bin" / "py3").symlink_to("py3.11")
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").symlink_to(tmp_path / "real" / "bin" / "py3")
    dests = [m["destination"] for m in specmod.host_layout([str(tmp_path / "venv" / "bin" / "python")])]
    assert str(tmp_path / "venv" / "bin") in dests
    assert str(tmp_path / "real" / "bin") in dests


def test_load_refuses_fifos_devices_and_oversized_files_without_blocking(tmp_path):
    """issue 14: a FIFO as config.json wedged thawd; nothing but a bounded regular file is read."""
    b = specmod.Bundle(tmp_path / "fifo")
    b.path.mkdir()
    os.mkfifo(b.config_path)             # nobody writes it: a blocking open or read never returns
    with pytest.raises(SpecError, match="is a FIFO, not a regular file"):
        b.load()
    big = specmod.Bundle(tmp_path / "big")
    big.path.mkdir()
    with open(big.config_path, "wb") as f:
        f.truncate(specmod.MAX_CONFIG_BYTES + 1)
    with pytest.raises(SpecError, match="more than the"):
        big.load()
    with pytest.raises(SpecError, match="is a directory"):
        specmod.read_regular(tmp_path, 10)
    with pytest.raises(SpecError, match="does not exist"):
        specmod.Bundle(tmp_path / "none").load()
    ok = specmod.Bundle(tmp_path / "ok")
    ok.write(good_spec())
    assert ok.load()["process"]["args"] == ["/bin/true"]
