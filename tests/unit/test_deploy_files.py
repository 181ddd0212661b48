"""The DaemonSet's image and configuration carry what provision installs."""
import re
import tomllib
from pathlib import Path

from control import config

from control.node import provision

REPO = Path(__file__).resolve().parents[2]


def test_containerfile_copies_every_binary_provision_installs():
    text = (REPO / "deploy/Containerfile").read_text()
    m = re.search(r"for b in ([^;]+); do", text)
    assert m, "the Containerfile's binary loop"
    assert m.group(1).split() == [name for name, _ in provision.BINARIES]


def test_configmap_points_thaw_at_the_installed_binaries():
    text = (REPO / "deploy/kubernetes/30-configmap.yaml").read_text()
    block = text.split("config.toml: |\n", 1)[1]
    toml_text = "\n".join(line[4:] for line in block.splitlines())
    cfg = tomllib.loads(toml_text)
    bindir = config.load(environ={}, default_file=Path("/nonexistent")).install_dir / "bin"
    assert Path(cfg["runsc"]["path"]) == bindir / "runsc"
    assert Path(cfg["pack"]["chunker"]) == bindir / "thaw-chunk"
    assert Path(cfg["store"]["fetcher"]) == bindir / "thaw-fetch"
    assert Path(cfg["containerd"]["info"]) == bindir / "thaw-ctrinfo"


def test_keys_come_from_secret_files_mounted_private():
    """The manifest key and the tenant keys are Secret volumes of mode 0400 at the
    paths the ConfigMap names (docs/security.md), never environment variables."""
    import yaml
    text = (REPO / "deploy/kubernetes/30-configmap.yaml").read_text()
    block = text.split("config.toml: |\n", 1)[1]
    cfg = tomllib.loads("\n".join(line[4:] for line in block.splitlines()))
    ds = yaml.safe_load((REPO / "deploy/kubernetes/40-daemonset.yaml").read_text())
    pod = ds["spec"]["template"]["spec"]
    thawd = next(c for c in pod["containers"] if c["name"] == "thawd")
    mounts = {m["mountPath"]: m["name"] for m in thawd["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for path in (Path(cfg["store"]["manifest_key_file"]).parent, Path(cfg["store"]["tenant_keys_dir"])):
        v = volumes[mounts[str(path)]]
        assert "secret" in v and v["secret"]["defaultMode"] == 0o400, v
    assert not any("KEY" in e["name"] and "AWS" not in e["name"] for e in thawd.get("env", []))
    assert config.load(environ={}, default_file=Path("/nonexistent")) is not None
