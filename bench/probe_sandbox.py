"""A static C probe in a bare runsc sandbox, for the CPU-only restore
experiments (bench/restore_contention.py, bench/first_touch.py): the work
directories, the probe compiled into the root filesystem, and a bundle with a
host directory bind-mounted at /share for the probe's files."""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


def sh(*argv: str, timeout: float = 300) -> str:
    # Output to an anonymous file, not a pipe: runsc's sandbox and gofer inherit
    # it and would hold a pipe open (docs/gvisor-notes.md "Output pipes hang").
    with tempfile.TemporaryFile("w+") as f:
        p = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, stdin=subprocess.DEVNULL)
        f.seek(0)
        out = f.read()
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {p.returncode}: {out[-2000:]}")
    return out


def read_once(image: Path) -> None:
    """Read every file of a checkpoint image once: its pages in the page cache."""
    for p in image.iterdir():
        with open(p, "rb") as f:
            while f.read(16 << 20):
                pass


@dataclass
class ProbeSandbox:
    share: Path        # the host side of /share
    logs: Path         # runsc's per-command debug logs
    image: Path        # where the checkpoint goes
    bundle: Path
    runsc: list[str]   # runsc and its global flags: append the command


def make(work: Path, runsc: str, source: Path, args: list[str]) -> ProbeSandbox:
    """Empty `work`, compile `source` statically to /probe in a fresh root
    filesystem, and write a bundle running `/probe ARGS` (no network, systrap)."""
    shutil.rmtree(work, ignore_errors=True)
    rootfs, share, logs, img, bundle = (work / n for n in ("rootfs", "share", "logs", "image", "bundle"))
    for d in (rootfs, share, logs, bundle):
        d.mkdir(parents=True)
    sh("gcc", "-O2", "-static", "-o", str(rootfs / "probe"), str(source))
    sh(runsc, "spec", "--bundle", str(bundle))
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["terminal"] = False
    spec["process"]["args"] = ["/probe", *args]
    spec["root"] = {"path": str(rootfs), "readonly": False}
    spec["mounts"].append({"destination": "/share", "type": "bind", "source": str(share), "options": ["rbind", "rw"]})
    (bundle / "config.json").write_text(json.dumps(spec, indent=2))
    g = [runsc, f"--root={work / 'runsc-root'}", "--network=none", "--platform=systrap",
         f"--debug-log={logs}/%ID%.%COMMAND%.log"]
    return ProbeSandbox(share, logs, img, bundle, g)
