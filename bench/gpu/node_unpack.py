"""Unpack what bench/gpu/node.sh needs on the GPU machine from the carry parts
that are present (.carry-node/a, b, c: ci/carry-node.sh stages them),
and say whether everything bench/gpu/node-parts.txt lists is now there.

Standard library only: it runs before the carried wheels are installed.

    python3 bench/gpu/node_unpack.py --parts .carry-node --bin DIR [--list bench/gpu/node-parts.txt]

Binaries (NAME.xz) go to DIR/NAME, checked against the part's SHA256SUMS;
wheels are installed with pip into DIR/site (--no-deps --target); rpc.tar
(thaw's generated gRPC code, git-ignored, so the tree does not carry it) is
extracted into control/thawd/rpc. What is already there and checked is not
done again: each later device call carries only another part. Prints one JSON
object; exit 0 when complete, 3 when a part is still missing (it names it), 2
on a damaged part.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RPC = REPO / "control" / "thawd" / "rpc"


def read_list(path: Path) -> list[tuple[str, str, str]]:
    rows = []
    for line in path.read_text().splitlines():
        words = line.split()
        if words and not words[0].startswith("#"):
            part, kind, name = words
            rows.append((part, kind, name))
    return rows


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def wheel_dist(filename: str) -> str:
    """"python_dateutil-2.9.0.post0-py2.py3-none-any.whl" -> "python-dateutil"."""
    return filename.split("-")[0].replace("_", "-").lower()


def marker(bindir: Path, name: str) -> Path:
    """What says binary `name` (cni-bin/ptp: below a directory) was unpacked and checked."""
    dest = bindir / name
    return dest.with_name(f".{dest.name}.sha256")


def unpack(parts: Path, bindir: Path, rows: list[tuple[str, str, str]], rpc: Path = RPC) -> dict:
    bindir.mkdir(parents=True, exist_ok=True)
    site = bindir / "site"
    done: list[str] = []
    damaged: list[str] = []
    for part in sorted({r[0] for r in rows}):
        pdir = parts / part
        if not pdir.is_dir():
            continue
        sums = {}
        if (pdir / "SHA256SUMS").is_file():
            for line in (pdir / "SHA256SUMS").read_text().splitlines():
                digest, name = line.split()
                sums[name] = digest
        for p, kind, name in rows:
            if p != part or kind != "bin":
                continue
            src, dest, mark = pdir / f"{name}.xz", bindir / name, marker(bindir, name)
            if not src.is_file():
                continue
            want = sums.get(name, "")
            if dest.is_file() and mark.is_file() and mark.read_text().strip() == want and want:
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)     # cni-bin/ptp
            tmp = dest.with_name(f".{dest.name}.partial")
            with lzma.open(src) as fin, open(tmp, "wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
            got = sha256(tmp)
            if want and got != want:
                damaged.append(f"{part}/{name}: sha256 {got}, SHA256SUMS says {want}")
                tmp.unlink()
                continue
            os.chmod(tmp, 0o755)
            tmp.replace(dest)
            mark.write_text(want + "\n")
            done.append(name)
        wheels = sorted((pdir / "wheels").glob("*.whl")) if (pdir / "wheels").is_dir() else []
        new = [w for w in wheels if not (site / f".installed-{w.name}").exists()]
        if new:
            site.mkdir(exist_ok=True)
            cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                   "--no-cache-dir", "--upgrade", "--target", str(site), *map(str, new)]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                damaged.append(f"{part}: pip install failed: {p.stderr.strip()[-1500:]}")
            else:
                for w in new:
                    (site / f".installed-{w.name}").write_text("")
                done += [w.name for w in new]
        if (pdir / "rpc.tar").is_file():
            rpc.mkdir(parents=True, exist_ok=True)
            with tarfile.open(pdir / "rpc.tar") as tar:
                tar.extractall(rpc, filter="data")
    missing = []
    for part, kind, name in rows:
        if kind == "bin" and not ((bindir / name).is_file() and marker(bindir, name).is_file()):
            missing.append(f"{part}: {name}")
        if kind == "wheel" and not any(wheel_dist(m.name[len(".installed-"):]) == name.lower()
                                       for m in site.glob(".installed-*")):
            missing.append(f"{part}: wheel {name}")
    if not (rpc / "thawd_pb2.py").is_file():
        missing.append("a or b: rpc.tar (control/thawd/rpc)")
    return {"bin": str(bindir), "site": str(site), "unpacked": done, "missing": missing, "damaged": damaged,
            "parts_present": sorted(p.name for p in parts.iterdir() if p.is_dir()) if parts.is_dir() else []}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", type=Path, default=REPO / ".carry-node")
    ap.add_argument("--bin", type=Path, required=True)
    ap.add_argument("--list", type=Path, default=REPO / "bench" / "gpu" / "node-parts.txt")
    ap.add_argument("--rpc", type=Path, default=RPC, help="where thaw's generated gRPC code goes")
    a = ap.parse_args(argv)
    r = unpack(a.parts, a.bin, read_list(a.list), a.rpc)
    print(json.dumps(r, indent=2))
    if r["damaged"]:
        return 2
    return 3 if r["missing"] else 0


if __name__ == "__main__":
    sys.exit(main())
