#!/usr/bin/env python3
"""How long the host takes to fault in a second mapping of a shared-memory file, the way
nvproxy mirrors application memory for the driver (issue 32 item 6).

    python3 bench/gpu/mirror_populate.py [--gib 4] [--repeat 3] [--out FILE]

Why: a parked cooperative ~8B sandbox wakes in 2.17 s where the driver's own restore of the
same offloaded model takes 0.97 s (docs/notes/2026-12-07-gpu-soak.md). The difference is
suspected in re-registering the 16 GB of page-locked weights: nvproxy's rmAllocOSDescriptor
(pkg/sentry/devices/nvproxy/frontend.go at the pin) pins the application range, reserves a
PROT_NONE range, moves a duplicate of each of the memory file's internal mappings into it
(mremap with old_size 0, MREMAP_FIXED) and faults the new range in with
MADV_POPULATE_WRITE before the driver's pin_user_pages. That new range has no page tables;
natively the process's own pages are already mapped. Whether the host can map it with
2 MiB entries depends on the range's virtual address and file offset agreeing modulo
2 MiB, and on shmem huge pages (runsc's provision sets shmem_enabled=advise and the
memory file is MADV_HUGEPAGE).

This measures that host step alone, no GPU and no gVisor: a memfd of --gib GiB, written
once through a MADV_HUGEPAGE mapping (the "memory file"), then mirrored into a fresh
reservation three ways: aligned to 2 MiB, offset by 4 KiB (congruence broken), and split
into 2 MiB-aligned 64 MiB blocks (what a file made of many ranges gives), each faulted in
with MADV_POPULATE_WRITE and timed. It prints one JSON object with the host's THP settings
beside the times. It changes no host setting: run it where shmem_enabled is what the node
runs with (the GPU machine after provision: advise).
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.mremap.restype = ctypes.c_void_p
libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]

PROT_NONE, PROT_RW = 0, 0x1 | 0x2
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS = 0x01, 0x02, 0x10, 0x20
MADV_HUGEPAGE, MADV_POPULATE_WRITE = 14, 23      # <asm-generic/mman-common.h>
MREMAP_MAYMOVE, MREMAP_FIXED = 1, 2
MAP_FAILED = ctypes.c_void_p(-1).value
HUGE = 2 << 20
BLOCK = 64 << 20


def check(ptr, what: str) -> int:
    if ptr is None or ptr == MAP_FAILED:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return ptr


def reserve(length: int, misalign: int) -> int:
    """A PROT_NONE range of length bytes whose start is misalign bytes past a 2 MiB boundary."""
    raw = check(libc.mmap(None, length + 2 * HUGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), "mmap reserve")
    return (raw + HUGE - 1) // HUGE * HUGE + misalign


def mirror(src: int, length: int, dst: int, block: int) -> None:
    """Duplicate [src, src+length) at dst in pieces of block bytes, as nvproxy does per
    internal-mapping block (mremap old_size 0 duplicates a shared mapping)."""
    off = 0
    while off < length:
        n = min(block, length - off)
        check(libc.mremap(src + off, 0, n, MREMAP_MAYMOVE | MREMAP_FIXED, dst + off), "mremap")
        off += n


def populate_s(addr: int, length: int) -> float:
    t = time.perf_counter()
    if libc.madvise(addr, length, MADV_POPULATE_WRITE) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"madvise(MADV_POPULATE_WRITE): {os.strerror(e)}")
    return time.perf_counter() - t


def thp_settings() -> dict:
    base = Path("/sys/kernel/mm/transparent_hugepage")
    out = {}
    for name in ("enabled", "shmem_enabled", "defrag"):
        try:
            out[name] = (base / name).read_text().strip()
        except OSError as e:
            out[name] = f"unreadable: {e}"
    return out


def shmem_huge_kib() -> int | None:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("ShmemHugePages:"):
            return int(line.split()[1])
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=4.0, help="size of the memory file (GiB)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    a = ap.parse_args()
    length = int(a.gib * (1 << 30)) // HUGE * HUGE
    fd = os.memfd_create("thaw-mirror-populate")
    try:
        os.ftruncate(fd, length)
        base = reserve(length, 0)
        src = check(libc.mmap(base, length, PROT_RW, MAP_SHARED | MAP_FIXED, fd, 0), "mmap memory file")
        libc.madvise(src, length, MADV_HUGEPAGE)
        t = time.perf_counter()
        libc.memset(src, 0x5A, length)
        fill_s = time.perf_counter() - t
        result = {"benchmark": "mirror_populate", "bytes": length, "thp": thp_settings(),
                  "kernel": os.uname().release, "fill_s": round(fill_s, 4),
                  "shmem_huge_kib_after_fill": shmem_huge_kib(), "variants": {}}
        variants = {"aligned-one-mapping": (0, length), "misaligned-4k": (4096, length),
                    "aligned-64m-blocks": (0, BLOCK)}
        for name, (misalign, block) in variants.items():
            runs = []
            for _ in range(a.repeat):
                dst = reserve(length, misalign)
                mirror(src, length, dst, block)
                runs.append(populate_s(dst, length))
                libc.munmap(dst, length)
            median = statistics.median(runs)
            result["variants"][name] = {"median_s": round(median, 6), "runs_s": [round(r, 6) for r in runs],
                                        "gb_per_s": round(length / median / 1e9, 2)}
        text = json.dumps(result, indent=2)
        print(text)
        if a.out:
            a.out.write_text(text + "\n")
        return 0
    finally:
        os.close(fd)


if __name__ == "__main__":
    sys.exit(main())
