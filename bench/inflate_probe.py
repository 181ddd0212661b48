"""Inflate speed of thaw-compressed 256 KiB chunks (pack.encode, CPython zlib): a real runsc
image of a Python runtime vs the mixed benchmark image's 4-bit-entropy state (docs/store.md,
"Compression costs more than it saves"). One measurement each; prints a line per data set.

    .venv/bin/python bench/inflate_probe.py
"""
import random
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import workloads  # noqa: E402

from control import config

from control.images import pack  # noqa: E402

CHUNK = 256 << 10


def measure(name: str, data: bytes) -> None:
    chunks = [data[i:i + CHUNK] for i in range(0, len(data) - CHUNK, CHUNK)]
    z = [(c, p) for c in chunks for codec, p in [pack.encode(c)] if codec == "zlib"]
    raw = sum(len(c) for c, _ in z)
    t = time.perf_counter()
    for _ in range(3):
        for _, p in z:
            zlib.decompress(p)
    dt = time.perf_counter() - t
    print(f"{name}: {len(z)}/{len(chunks)} chunks compressed, saving {1 - sum(len(p) for _, p in z) / max(raw, 1):.2f}, "
          f"inflate {3 * raw / dt / 1e6:.0f} MB/s")


def main() -> None:
    s = config.load()
    work = Path("/var/tmp/thaw-inflate")
    workloads.remove_tree(work)
    try:
        img = workloads.make_checkpoint(s.runsc_path, work, "runtime", ["none"])
        measure("runsc runtime image pages.img", (img / "pages.img").read_bytes())
    finally:
        workloads.remove_tree(work)
    table = bytes.maketrans(bytes(range(256)), b"etaoinshrdlucmfw" * 16)   # as bench/workloads.py "mixed"
    measure("mixed image's 4-bit state", random.Random(8).randbytes(64 << 20).translate(table))


if __name__ == "__main__":
    main()
