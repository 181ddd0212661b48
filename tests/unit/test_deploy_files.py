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
    assert Path(cfg["store"]["gofer"]) == bindir / "thaw-gofer"
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


def test_image_build_script_installs_every_binary_provision_installs():
    """ci/build-image.sh builds the DaemonSet image in CI (no daemon there);
    its list is the Containerfile's loop, in provision's order."""
    text = (REPO / "ci/build-image.sh").read_text()
    m = re.search(r"^binaries=\(([^)]*)\)", text, re.M)
    assert m, "ci/build-image.sh's binaries=(...) list"
    assert m.group(1).split() == [name for name, _ in provision.BINARIES]


def test_daemonset_runs_the_image_version_the_build_names():
    """ci/build-image.sh names the image ghcr.io/thaw-dev/thaw:<control/version.py VERSION>."""
    from control.version import image_ref
    text = (REPO / "deploy/kubernetes/40-daemonset.yaml").read_text()
    images = set(re.findall(r"^\s+image:\s*(\S+)", text, re.M))
    assert images == {image_ref()}
    assert "from control.version import image_ref" in (REPO / "ci/build-image.sh").read_text()


def test_every_opted_in_example_declares_a_real_readiness_probe():
    """thaw checkpoints a workload automatically only once its thaw.dev/ready
    probe passes (issue 12): every example that opts in declares one in the one
    probe grammar, and none is a bare delay (a model server would be saved
    before its model loaded)."""
    import yaml

    from control.lifecycle import workload
    from runsc_hooks import probe
    examples = sorted((REPO / "deploy" / "kubernetes" / "examples").glob("*.yaml"))
    assert examples
    for path in examples:
        for doc in yaml.safe_load_all(path.read_text()):
            ann = ((doc or {}).get("metadata") or {}).get("annotations") or {}
            if workload.ANNOTATION_WORKLOAD not in ann:
                continue
            assert workload.ANNOTATION_READY in ann, f"{path.name}: opts in without {workload.ANNOTATION_READY}"
            p = probe.parse(ann[workload.ANNOTATION_READY])
            assert not isinstance(p, probe.DelayProbe), f"{path.name}: a delay is not a readiness probe"


def test_provision_init_container_mounts_every_host_path_provision_writes(tmp_path):
    """What provision writes on a GPU node lands on the host, not in the init container's
    own filesystem: each file's directory (or one above it) is a hostPath mount, and /sys
    (the THP settings) is the host's in a privileged container."""
    import yaml
    ds = yaml.safe_load((REPO / "deploy/kubernetes/40-daemonset.yaml").read_text())
    pod = ds["spec"]["template"]["spec"]
    init = next(c for c in pod["initContainers"] if c["name"] == "provision")
    assert init["securityContext"]["privileged"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    host = [Path(m["mountPath"]) for m in init["volumeMounts"] if "hostPath" in volumes[m["name"]]]
    settings = config.load(environ={}, default_file=tmp_path / "absent")
    opts = provision.Options(source_dir=tmp_path, root=Path("/"), systemd=False)
    targets = [Path(s.dest) if hasattr(s, "dest") else None for s in provision.steps(settings, opts, gpu=True)]
    written = [t for t in targets if t is not None]
    assert provision.THP_TMPFILES in written
    for t in written:
        assert any(t == h or h in t.parents for h in host), f"{t} is not under a hostPath mount of the init container"
