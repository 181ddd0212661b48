"""The DaemonSet's image (ci/build-image.sh, built by `make setup`) carries
what `thaw provision` installs, and the DaemonSet's commands run from it.

The archive is read as containerd would apply it (layers in order); then it
is imported into a real private containerd, containerd's unpacked snapshot
of it is mounted, and the DaemonSet's own commands (the init container's
`thaw provision`, the main container's `thaw serve`, the readiness probe's
`thaw doctor`) run from that root filesystem on this host's kernel, with
the host paths the DaemonSet mounts bound into it: what a privileged runc
container does. (gVisor is the only runtime built here, and a pod under
runsc sees a 4.x kernel and no host cgroups, so provision's node checks
would fail there for reasons that are not the image's.)
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import signal
import subprocess
import tarfile
import time
import tomllib
from pathlib import Path

import pytest
import yaml

from control.node import provision
from control.dev.containerd import PrivateContainerd

from tests.conftest import BUILD, REPO, require
from tests.integration.conftest import settings_for

ARCHIVE = BUILD / "thaw-daemonset.oci.tar"
SITE = "usr/local/lib/python3.11/dist-packages"
PACKAGES = ("control", "runsc_hooks", "nvproxy")


def _daemonset() -> dict:
    docs = yaml.safe_load_all((REPO / "deploy/kubernetes/40-daemonset.yaml").read_text())
    return next(d for d in docs if d and d.get("kind") == "DaemonSet")


def _configmap_toml() -> str:
    text = (REPO / "deploy/kubernetes/30-configmap.yaml").read_text()
    return yaml.safe_load(text)["data"]["config.toml"]


class Image:
    """The archive's index, manifest and config, and the file view its layers make."""

    def __init__(self, path: Path) -> None:
        self.files: dict[str, dict] = {}
        with tarfile.open(path) as tar:
            def blob(digest: str) -> bytes:
                data = tar.extractfile("blobs/sha256/" + digest.split(":", 1)[1]).read()
                assert "sha256:" + hashlib.sha256(data).hexdigest() == digest, f"blob {digest} is corrupt"
                return data
            self.index = json.loads(tar.extractfile("index.json").read())
            desc = self.index["manifests"][0]
            self.manifest = json.loads(blob(desc["digest"]))
            self.config = json.loads(blob(self.manifest["config"]["digest"]))
            for layer, diff_id in zip(self.manifest["layers"], self.config["rootfs"]["diff_ids"], strict=True):
                data = blob(layer["digest"])
                raw = gzip.decompress(data) if layer["mediaType"].endswith("gzip") else data
                assert "sha256:" + hashlib.sha256(raw).hexdigest() == diff_id, "diff_id mismatch"
                self._apply(raw)

    def _apply(self, raw: bytes) -> None:
        with tarfile.open(fileobj=io.BytesIO(raw)) as layer:
            for m in layer:
                name = "/" + m.name.strip("/")
                assert not os.path.basename(name).startswith(".wh."), f"unexpected whiteout {name}"
                f = {"type": m.type, "mode": m.mode, "uid": m.uid, "link": m.linkname}
                if m.isfile():
                    data = layer.extractfile(m).read()
                    f["sha256"] = hashlib.sha256(data).hexdigest()
                    f["head"] = data[:200]
                self.files[name] = f

    @property
    def ref(self) -> str:
        return self.index["manifests"][0]["annotations"]["io.containerd.image.name"]

    def resolve(self, path: str) -> str:
        """Follow symlinks the way the kernel would inside the image."""
        for _ in range(20):
            f = self.files.get(path)
            if f is None or f["type"] != tarfile.SYMTYPE:
                return path
            target = f["link"]
            path = os.path.normpath(target if target.startswith("/") else os.path.join(os.path.dirname(path), target))
        raise AssertionError(f"symlink loop at {path}")


@pytest.fixture(scope="module")
def image() -> Image:
    require(ARCHIVE.is_file(), f"the DaemonSet image at {ARCHIVE} (ci/build-image.sh, run by make setup)")
    return Image(ARCHIVE)


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_image_is_the_one_the_daemonset_runs(image):
    pod = _daemonset()["spec"]["template"]["spec"]
    assert {c["image"] for c in pod["containers"] + pod["initContainers"]} == {image.ref}
    from control.version import VERSION, image_ref
    assert image.ref == image_ref() == f"ghcr.io/thaw-dev/thaw:{VERSION}"
    cfg = image.config["config"]
    thawd = next(c for c in pod["containers"] if c["name"] == "thawd")
    assert cfg["Cmd"] == thawd["command"]  # the Containerfile's CMD
    assert not cfg.get("Entrypoint")
    assert image.config["architecture"] == "amd64" and image.config["os"] == "linux"


def test_image_carries_every_binary_provision_installs(image):
    dist = "/opt/thaw-dist/bin"
    assert sorted(p for p in image.files if p.startswith(dist + "/")) == \
        sorted(f"{dist}/{name}" for name, _ in provision.BINARIES)
    for name, _ in provision.BINARIES:
        f = image.files[f"{dist}/{name}"]
        assert f["type"] == tarfile.REGTYPE and f["mode"] == 0o755 and f["uid"] == 0, (name, f)
        assert f["sha256"] == _sha(BUILD / name), f"{name} in the image is not build/{name}"


def test_image_carries_this_thaw_and_what_it_runs_with(image):
    # Every module and package-data file of thaw's packages (pyproject.toml:
    # *.py plus package-data *.json, *.proto), as this checkout has them
    # (generated gRPC stubs included), where the image's python3 imports them.
    n = 0
    for pkg in PACKAGES:
        for src in (REPO / pkg).rglob("*"):
            if src.is_file() and "__pycache__" not in src.parts and src.suffix in (".py", ".json", ".proto"):
                rel = src.relative_to(REPO)
                if rel.parts[:2] == ("control", "dev"):   # the dev harness stays out (pyproject.toml)
                    assert f"/{SITE}/{rel}" not in image.files, f"{rel} is in the image"
                    continue
                f = image.files.get(f"/{SITE}/{rel}")
                assert f is not None, f"{rel} is missing from the image"
                assert f["sha256"] == _sha(src), f"{rel} in the image differs from the checkout"
                n += 1
    assert n > 50
    # `thaw` on the image's PATH runs control.cli with the image's python3.
    path = next(e.split("=", 1)[1] for e in image.config["config"]["Env"] if e.startswith("PATH="))
    thaw = next(image.resolve(f"{d}/thaw") for d in path.split(":") if f"{d}/thaw" in image.files)
    head = image.files[thaw]["head"].decode()
    assert head.startswith("#!/usr/bin/python3\n") and "from control.cli.main import main" in head   # pyproject.toml [project.scripts]
    assert image.files[thaw]["mode"] & 0o111
    assert image.files[image.resolve("/usr/bin/python3")]["type"] == tarfile.REGTYPE
    # Each dependency of pyproject.toml is installed for that interpreter.
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    installed = {re.sub(r"[-_.]+", "_", p.rsplit("/", 1)[1].split("-")[0].lower())
                 for p in image.files if p.startswith(f"/{SITE}/") and p.endswith(".dist-info")}
    for d in deps:
        name = re.sub(r"[-_.]+", "_", re.split(r"[<>=!~ ;\[]", d, maxsplit=1)[0].lower())
        assert name in installed, f"dependency {d} is not installed in the image"
    # Nor the demo's store (the `demo` extra).
    assert not any("seaweedfs" in p.lower() or p.endswith("/weed") for p in image.files), "seaweedfs is in the image"
    # Nor the dev harness (the `dev` extra): no file or directory of control/dev, wherever it lies.
    dev = [p for p in image.files if "/control/dev/" in p + "/"]
    assert not dev, f"control/dev is in the image: {dev[:5]}"
    # The configmap restarts containerd through nsenter: it must be on PATH.
    restart = tomllib.loads(_configmap_toml())["containerd"]["restart_command"][0]
    assert any(image.files.get(image.resolve(f"{d}/{restart}"), {}).get("type") == tarfile.REGTYPE
               for d in path.split(":")), f"{restart} is not in the image"


# -- the commands, from containerd's unpacked image --------------------------------

def _mounts_under(base: Path) -> list[str]:
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f if line.split()[1].startswith(f"{base}/")]


def _unmount_all(base: Path) -> None:
    for m in sorted(_mounts_under(base), key=len, reverse=True):
        subprocess.run(["umount", "-l", m], capture_output=True)
    left = _mounts_under(base)
    assert not left, f"could not unmount {left}: not removing {base}"


@pytest.fixture
def rootfs(name, runsc_bin):
    """The image imported into a private containerd and mounted (rw) from its snapshot."""
    require(ARCHIVE.is_file(), f"the DaemonSet image at {ARCHIVE}")
    base = Path(f"/tmp/thaw-it/{name}")
    if base.exists():
        _unmount_all(base)
        subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=True)
    base.mkdir(parents=True)
    ctrd = PrivateContainerd(base / "ctrd", BUILD, settings_for(base), use_standin=False).start()
    mnt = base / "rootfs"
    try:
        image = Image(ARCHIVE)
        ctrd.import_image(ARCHIVE)
        assert image.ref in ctrd.ctr("images", "ls", "-q").stdout.split()
        mnt.mkdir()
        ctrd.ctr("images", "mount", "--rw", image.ref, str(mnt), timeout_s=120)
        yield base, mnt, image
    finally:
        for m in sorted(_mounts_under(mnt), key=len, reverse=True):
            if m != str(mnt):
                subprocess.run(["umount", "-l", m], capture_output=True)
        ctrd.ctr("images", "unmount", "--rm", str(mnt), check=False)
        _unmount_all(base)
        ctrd.stop()
        subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=True)


def _bind(src: Path, dst: Path) -> None:
    src.mkdir(parents=True, exist_ok=True)
    dst.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(src), str(dst)], check=True)


def _prepare(mnt: Path, node: Path) -> None:
    """What the runtime gives a privileged container: /proc, /sys, a /dev;
    then the DaemonSet's volumes: the ConfigMap and the host paths, bound at
    their own paths (the node tree stands in for the host)."""
    for d in ("proc", "sys", "dev"):
        (mnt / d).mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "proc", "proc", str(mnt / "proc")], check=True)
    subprocess.run(["mount", "--rbind", "/sys", str(mnt / "sys")], check=True)
    subprocess.run(["mount", "--make-rslave", str(mnt / "sys")], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", str(mnt / "dev")], check=True)
    for dev, (major, minor) in {"null": (1, 3), "zero": (1, 5), "urandom": (1, 9)}.items():
        subprocess.run(["mknod", "-m", "666", str(mnt / "dev" / dev), "c", str(major), str(minor)], check=True)
    cfg = mnt / "etc/thaw-config"
    cfg.mkdir(parents=True)
    (cfg / "config.toml").write_text(_configmap_toml())
    pod = _daemonset()["spec"]["template"]["spec"]
    for v in pod["volumes"]:
        if "hostPath" in v and v["hostPath"]["path"] != "/run":
            host = v["hostPath"]["path"]
            _bind(node / host.lstrip("/"), mnt / host.lstrip("/"))
    _bind(node / "run", mnt / "run")


def _env(pod_container: dict, **extra: str) -> list[str]:
    env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"]
    for e in pod_container.get("env", []):
        if "value" in e:
            env.append(f"{e['name']}={e['value']}")
    return env + [f"{k}={v}" for k, v in extra.items()]


def _in_image(mnt: Path, env: list[str], argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["chroot", str(mnt), "/usr/bin/env", "-i", *env, *argv], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_daemonset_commands_run_from_the_image(rootfs):
    base, mnt, image = rootfs
    node = base / "node"
    _prepare(mnt, node)
    pod = _daemonset()["spec"]["template"]["spec"]

    # The init container: its command, minus --restart-containerd (this
    # host's containerd is not the one being provisioned).
    init = pod["initContainers"][0]
    argv = [a for a in init["command"] if a != "--restart-containerd"]
    r = _in_image(mnt, _env(init), [*argv, "--json"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads(r.stdout)
    installed = {s["target"] for s in report["steps"] if s["step"].startswith("install ") and s["result"] == "created"}
    bindir = Path("/opt/thaw/bin")
    assert installed == {str(bindir / name) for name, _ in provision.BINARIES}
    for name, _ in provision.BINARIES:
        got = node / "opt/thaw/bin" / name
        assert got.stat().st_mode & 0o7777 == 0o755, name
        assert _sha(got) == image.files[f"/opt/thaw-dist/bin/{name}"]["sha256"], name
    runsc_toml = (node / "etc/thaw/runsc.toml").read_text()
    assert 'binary_name = "/opt/thaw/bin/thaw-runsc"' in runsc_toml

    # The main container: thawd, then the readiness probe against it.
    thawd = next(c for c in pod["containers"] if c["name"] == "thawd")
    # The Secrets the DaemonSet mounts for thawd (the manifest key, the tenant keys),
    # as the kubelet would place them: files of mode 0400 under the mount paths.
    for m in thawd.get("volumeMounts", []):
        if m["name"] == "manifest-key":
            d = mnt / m["mountPath"].lstrip("/")
            d.mkdir(parents=True, exist_ok=True)
            (d / "manifest.key").write_bytes(os.urandom(32))
            (d / "manifest.key").chmod(0o400)
        elif m["name"] == "tenant-keys":
            (mnt / m["mountPath"].lstrip("/")).mkdir(parents=True, exist_ok=True)
    env = _env(thawd, AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test",
               # no store and no metrics port: nothing here answers for S3, and
               # 9464 may be taken by a thawd of this machine's own.
               THAW_STORE_ENDPOINT="http://127.0.0.1:9", THAW_THAWD_METRICS_ADDR="")
    proc = subprocess.Popen(["chroot", str(mnt), "/usr/bin/env", "-i", *env, *thawd["command"]],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    try:
        sock = node / "run/thaw/thawd.sock"
        end = time.monotonic() + 60
        while not sock.exists() and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.2)
        assert sock.exists(), (f"thawd from the image did not listen (exit {proc.poll()}): "
                               f"{proc.stdout.read()[-2000:] if proc.poll() is not None else ''}")
        probe = thawd["readinessProbe"]["exec"]["command"]
        r = _in_image(mnt, env, probe)
        assert r.returncode == 0, f"readiness probe {probe} failed:\n{r.stdout[-3000:]}{r.stderr[-2000:]}"
        r = _in_image(mnt, env, ["thaw", "stats", "--json"])
        assert r.returncode == 0 and "counters" in json.loads(r.stdout), r.stdout + r.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert proc.returncode == 0, out[-3000:]
    assert "serving on /run/thaw/thawd.sock" in out
