"""The `*-verified` variants of bench/gpu/models.py (issue 30): a restore that reads its image
through thaw-gofer in verify mode, every chunk checked against its hash as the sentry reads it,
exactly as a node's restore from its cache does (cache.verify = read, control/images/served.py).

models.py's images are plain runsc image directories, not cache entries, so before the timed
restore (once per image) this chunks the image with thaw-chunk (FastCDC at the default 256 KiB
average, SHA-256 + BLAKE3: what a node's cache entry's manifest holds) into a chunk list of the
manifest's shape, and for each restore writes a view: gcs_opts.json and a sidecar directory
naming thaw-gofer `checkpointgofer`. The restore then runs `runsc restore --image-path VIEW`
with GVISOR_SIDECAR_BINARIES_DIR set: the same image and runsc as the variant it is set beside
(`thaw-thp` and `thaw-thp-verified`).

Standalone on purpose (the GPU machine's python3 has torch, not thaw's dependencies: boto3,
cryptography, filelock), so the two formats it writes are twins of thaw's:
gcs_opts.json of control/images/served.py `write_view`, the chunk list of
control/images/manifest.py `Manifest.to_dict` (files[].chunks rows), and it reads thaw-chunk's
output as control/images/chunk.py `chunk_files` does.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

AVG_CHUNK = 256 << 10             # pack.avg_chunk_bytes' default. Twin: control/config.py
RUNSC_FILES = ("checkpoint.img", "pages_meta.img", "pages.img")   # Twin: control/images/stream.py
GOFER_CONFIG_VERSION = 2          # Twin: go/internal/stream/gofer.go GoferConfigVersion
SIDECAR, SIDECAR_ENV = "checkpointgofer", "GVISOR_SIDECAR_BINARIES_DIR"   # Twin: control/images/stream.py
CORRUPT_REPORT = "corrupt.json"   # Twin: control/images/cache.py


def chunk_list(image: Path, chunker: Path, out: Path) -> dict:
    """Chunk `image`'s runsc files into `out` (the manifest's files[] shape); what it took."""
    t0 = time.monotonic()
    paths = [image / n for n in RUNSC_FILES if (image / n).is_file()]
    argv = [str(chunker), f"-min={AVG_CHUNK // 4}", f"-avg={AVG_CHUNK}", f"-max={AVG_CHUNK * 4}", *map(str, paths)]
    p = subprocess.run(argv, capture_output=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"thaw-chunk failed ({p.returncode}): {p.stderr.decode(errors='replace')[-800:]}")
    lines = p.stdout.decode().splitlines()
    rows: list[list] = [[] for _ in paths]
    sizes: dict[int, int] = {}
    for line in lines[1:]:
        rec = json.loads(line)
        if "size" in rec:
            sizes[rec["f"]] = rec["size"]
        else:
            rows[rec["f"]].append([rec["h"], rec["n"], 0, 0, rec["n"], "none", rec["b"]])
    files = []
    for i, path in enumerate(paths):
        if sum(r[1] for r in rows[i]) != sizes.get(i):
            raise RuntimeError(f"thaw-chunk output for {path} is incomplete")
        files.append({"name": path.name, "size": sizes[i], "chunks": rows[i]})
    out.write_text(json.dumps({"files": files}, separators=(",", ":")))
    return {"chunks": sum(len(r) for r in rows), "bytes": sum(sizes.values()),
            "chunk_s": round(time.monotonic() - t0, 3), "hash": "blake3"}


def view(image: Path, chunks: Path, gofer: Path, work: Path,
         huge: bool = False) -> tuple[Path, tuple[tuple[str, str], ...]]:
    """A fresh view of `image` for one restore: (its path, runsc restore's extra environment).
    `huge`: the restore's memory file is on huge pages (a *-thp variant), which decides the
    reads the gofer offers, as on a node (control/node/hugepages.py gofer_read_shape)."""
    from control.node.hugepages import gofer_read_shape
    parallel, read_bytes = gofer_read_shape(huge, len(os.sched_getaffinity(0)))
    # Experiments only (docs/benchmarks.md says which were run): another read shape.
    parallel = int(os.environ.get("THAW_BENCH_GOFER_READERS", parallel))
    read_bytes = int(os.environ.get("THAW_BENCH_GOFER_READ_KIB", read_bytes >> 10)) << 10
    v = work / "view"
    shutil.rmtree(v, ignore_errors=True)
    v.mkdir(parents=True, mode=0o700)
    served = []
    for p in sorted(image.iterdir()):
        if p.is_file():
            os.symlink(p, v / p.name)
            if p.name in RUNSC_FILES:
                served.append({"name": p.name, "path": str(p), "size": p.stat().st_size, "pages": p.name == "pages.img"})
    cfg = {"version": GOFER_CONFIG_VERSION, "socket": "", "complete": "", "files": served, "deadline_s": 60.0,
           "boost_s": 0.0, "max_parallel": parallel, "max_read_bytes": read_bytes, "log": str(v / "gofer.log"), "verify": str(chunks),
           "corrupt": str(v / CORRUPT_REPORT)}
    (v / "gcs_opts.json").write_text(json.dumps(cfg))
    side = work / "sidecars"
    side.mkdir(parents=True, exist_ok=True)
    link = side / SIDECAR
    if not link.is_symlink() or os.readlink(link) != str(gofer.resolve()):
        link.unlink(missing_ok=True)
        os.symlink(gofer.resolve(), link)
    return v, ((SIDECAR_ENV, str(side)),)


def report(v: Path) -> dict:
    """What thaw-gofer found altered in this view (corrupt: None when nothing) and its last
    log line (its reads and the chunks it checked: proof the restore read through it)."""
    p, log = v / CORRUPT_REPORT, v / "gofer.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return {"corrupt": p.read_text() if p.exists() else None, "gofer": lines[-1] if lines else None,
            "gofer_log": lines[:8]}
