"""Build a small OCI image archive locally (no registry, no Docker).

Used by the containerd tests, the containerd benchmark and the README's
worked example: one uncompressed layer from a dict of files, an image config,
and an OCI image layout tarball that `ctr image import` accepts.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

LAYER_MEDIA = "application/vnd.oci.image.layer.v1.tar"
CONFIG_MEDIA = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA = "application/vnd.oci.image.manifest.v1+json"


@dataclass(frozen=True)
class File:
    data: bytes = b""
    mode: int = 0o644
    link: str | None = None   # a symlink to this target
    directory: bool = False


def _layer(files: dict[str, File]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs: set[str] = set()
        for path in sorted(files):
            parts = path.strip("/").split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    ti = tarfile.TarInfo(d)
                    ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, 0
                    tar.addfile(ti)
            f = files[path]
            ti = tarfile.TarInfo(path.strip("/"))
            ti.mtime, ti.mode = 0, f.mode
            if f.link is not None:
                ti.type, ti.linkname = tarfile.SYMTYPE, f.link
                tar.addfile(ti)
            elif f.directory:
                ti.type = tarfile.DIRTYPE
                tar.addfile(ti)
            else:
                ti.size = len(f.data)
                tar.addfile(ti, io.BytesIO(f.data))
    return buf.getvalue()


def _blob(tar: tarfile.TarFile, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    ti = tarfile.TarInfo(f"blobs/sha256/{digest}")
    ti.size, ti.mtime = len(data), 0
    tar.addfile(ti, io.BytesIO(data))
    return f"sha256:{digest}"


def build(out: Path, ref: str, files: dict[str, File], cmd: list[str], env: dict[str, str] | None = None,
          workdir: str = "/") -> str:
    """Write an OCI image layout archive to `out`; return the manifest digest."""
    layer = _layer(files)
    layer_digest = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps({
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(0)),
        "architecture": "amd64", "os": "linux",
        "config": {"Cmd": cmd, "Env": [f"{k}={v}" for k, v in (env or {"PATH": "/bin"}).items()],
                   "WorkingDir": workdir},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }, sort_keys=True).encode()
    tmp = out.with_name(out.name + ".partial")
    with tarfile.open(tmp, "w") as tar:
        ld = _blob(tar, layer)
        cd = _blob(tar, config)
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": MANIFEST_MEDIA,
            "config": {"mediaType": CONFIG_MEDIA, "digest": cd, "size": len(config)},
            "layers": [{"mediaType": LAYER_MEDIA, "digest": ld, "size": len(layer)}],
        }, sort_keys=True).encode()
        md = _blob(tar, manifest)
        index = json.dumps({"schemaVersion": 2, "manifests": [{
            "mediaType": MANIFEST_MEDIA, "digest": md, "size": len(manifest),
            "annotations": {"org.opencontainers.image.ref.name": ref, "io.containerd.image.name": ref}}]}).encode()
        for name, data in (("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", index)):
            ti = tarfile.TarInfo(name)
            ti.size, ti.mtime = len(data), 0
            tar.addfile(ti, io.BytesIO(data))
    tmp.replace(out)
    return md


# Applets the busybox image links (enough for a shell workload and probes).
BUSYBOX_APPLETS = ("sh", "cat", "echo", "sleep", "test", "[", "touch", "ls", "mkdir", "rm", "date", "true",
                   "false", "env", "head", "tail", "wc", "seq", "sha256sum", "dd", "hexdump", "od")


def busybox_files(busybox: Path, extra: dict[str, File] | None = None) -> dict[str, File]:
    files = {"/bin/busybox": File(busybox.read_bytes(), 0o755), "/tmp": File(directory=True, mode=0o1777),
             "/etc/passwd": File(b"root:x:0:0:root:/root:/bin/sh\n"), "/etc/group": File(b"root:x:0:\n"),
             "/root": File(directory=True, mode=0o700)}
    for a in BUSYBOX_APPLETS:
        files[f"/bin/{a}"] = File(link="busybox")
    files.update(extra or {})
    return files
