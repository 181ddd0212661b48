"""Weights out of the CUDA driver's copy path: what a PyTorch workload does
behind the `pytorch-offload` profile's routes (control/lifecycle/profiles.py;
issue 17, lever A). Used by bench/gpu/server.py and the native comparison
(bench/gpu/native_cuda.py).

The CUDA checkpoint API moves device memory out and back in through the
driver at ~5 GB/s (docs/gpu.md; NVIDIA's Dynamo team calls it "a single
sequential cudaMemcpy"), a tenth of what a pinned host-to-device copy does on
the H200 (51-55 GB/s, also inside a runsc sandbox: docs/notes/h200-facts.md).
So before the checkpoint the workload moves its parameters to host memory and
frees their device memory (the CUDA image then holds the context, buffers and
whatever else is live), and after the restore it copies them back itself.

Modes of `Stash.offload`:
  register  one host arena of plain memory, page-locked in place with
            cudaHostRegister: sandbox memory like any other, saved in the
            image's pages; at restore the driver registers it again (the
            sentry pins its pages: nvproxy rmAllocOSDescriptor, 4 KiB pages
            without host shmem THP: ~0.12 s/GB measured in the sandbox).
  alloc     one arena from cudaHostAlloc (torch's pinned allocator): what
            vLLM's sleep level 1 uses (GKE restored 61.7 GiB of it under gVisor).
            torch rounds a pinned block up to a power of two
            (ATen/core/CachingHostAllocator.h): 6.4 GB takes 8 GiB, 16 GB 16 GiB.
  staged    one arena of plain (pageable) memory, and a small pinned ring:
            only the ring is re-registered at restore; the copy back runs
            arena -> ring (CPU copies, several at once) -> GPU, pipelined.
  drop      no host copy: the weights are read back from the model's
            safetensors files after the restore, through the pinned ring
            (the image shrinks to the context; the restore reads the files).

The host arena stays after the weights went back (register/alloc): host memory
of the size of the weights, and the next checkpoint needs no new pinning.
Buffers (rotary tables, masks) stay on the device: small, and some are
computed, not loaded. Parameters shared by two modules (tied embeddings) move
once. Works with device "cpu" too (no pinning, plain copies), which is how it
is tested without a GPU (bench/gpu/offload_check.py).
"""
from __future__ import annotations

import gc
import json
import os
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MODES = ("register", "alloc", "staged", "drop")
ALIGN = 4096                 # arena offsets: page-aligned, like the caching allocator's blocks (512) and more
RING_SLOT = 64 << 20         # staged and drop: bytes per pinned staging slot
RING_SLOTS = 8               # ... and how many are filled at once (8 x 64 MiB pinned; 4 until 2026-12-01)

_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64", "I64": "int64",
           "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


class OffloadError(RuntimeError):
    pass


def safetensors_index(files: list[Path]) -> dict[str, dict]:
    """name -> {file, dtype, shape, start, end} (absolute byte offsets) from the files' headers."""
    index: dict[str, dict] = {}
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        base = 8 + n
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            a, b = meta["data_offsets"]
            index[name] = {"file": str(f), "dtype": _DTYPES.get(meta["dtype"], meta["dtype"]),
                           "shape": list(meta["shape"]), "start": base + a, "end": base + b}
    return index


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class Stash:
    def __init__(self, model, device: str, files: list[Path] | None = None) -> None:
        import torch
        self.torch = torch
        self.model = model
        self.device = device
        self.files = [Path(f) for f in files or []]
        self.mode: str | None = None       # None: the weights are on the device
        self.arena = None
        self.arena_mode: str | None = None
        self.registered = False
        self.views: dict[str, object] = {}
        self.meta: dict[str, tuple] = {}   # name -> (shape, dtype) while off the device
        self.ring: list = []

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    def params(self) -> list[tuple[str, object]]:
        return list(self.model.named_parameters())     # tied parameters once

    def _sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def _reserved(self) -> dict:
        if not self.cuda:
            return {}
        t = self.torch
        return {"gpu_allocated_bytes": t.cuda.memory_allocated(), "gpu_reserved_bytes": t.cuda.memory_reserved()}

    # -- before the checkpoint ----------------------------------------------------

    def offload(self, mode: str = "register") -> dict:
        """Move every parameter off the device (see the module doc); returns what it did and how long it took."""
        if mode not in MODES:
            raise OffloadError(f"unknown offload mode {mode!r}; known: {', '.join(MODES)}")
        if self.mode is not None:
            raise OffloadError(f"the weights are already off the device (mode {self.mode})")
        torch = self.torch
        t0 = time.perf_counter()
        params = self.params()
        total = sum(_align(p.numel() * p.element_size()) for _, p in params)
        info: dict = {"mode": mode, "tensors": len(params),
                      "bytes": sum(p.numel() * p.element_size() for _, p in params)}
        self._sync()
        if mode in ("staged", "drop") and not self.ring:
            # The staging ring is allocated (pinned) now, off the restore's path;
            # it is part of the image: RING_SLOTS x RING_SLOT bytes.
            t = time.perf_counter()
            self.ring = [torch.empty(RING_SLOT, dtype=torch.uint8, pin_memory=self.cuda) for _ in range(RING_SLOTS)]
            info["ring_pin_s"] = round(time.perf_counter() - t, 4)
        if mode == "drop":
            self._check_files(params)
            self._free_arena()      # an arena of an earlier mode would be saved with the image
            self.meta = {name: (tuple(p.shape), p.dtype) for name, p in params}
            for _, p in params:
                p.data = torch.empty(0, dtype=p.dtype)
        else:
            if self.arena is None or self.arena_mode != mode or self.arena.numel() < total:
                self._free_arena()
                t = time.perf_counter()
                self.arena = self._new_arena(total, mode)
                self.arena_mode = mode
                info["pin_s"] = round(time.perf_counter() - t, 4)
            t = time.perf_counter()
            off = 0
            self.views = {}
            for name, p in params:
                n = p.numel() * p.element_size()
                v = self.arena[off:off + n].view(p.dtype).view(p.shape)
                v.copy_(p.detach(), non_blocking=self.cuda)
                self.views[name] = v
                off += _align(n)
            self._sync()
            info["copy_s"] = round(time.perf_counter() - t, 4)
            self.meta = {name: (tuple(p.shape), p.dtype) for name, p in params}
            for name, p in params:
                p.data = self.views[name]
        self.mode = mode
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        info["seconds"] = round(time.perf_counter() - t0, 4)
        info.update(self._reserved())
        return info

    def _new_arena(self, total: int, mode: str):
        torch = self.torch
        if not self.cuda or mode == "staged":
            return torch.empty(total, dtype=torch.uint8)
        if mode == "alloc":
            return torch.empty(total, dtype=torch.uint8, pin_memory=True)
        arena = torch.empty(total, dtype=torch.uint8)
        rc = torch.cuda.cudart().cudaHostRegister(arena.data_ptr(), total, 0)
        if int(getattr(rc, "value", rc)) != 0:
            raise OffloadError(f"cudaHostRegister of {total} bytes failed: {rc}")
        self.registered = True
        return arena

    def _free_arena(self) -> None:
        if self.arena is not None and self.registered:
            self.torch.cuda.cudart().cudaHostUnregister(self.arena.data_ptr())
        self.arena, self.arena_mode, self.registered, self.views = None, None, False, {}

    def _check_files(self, params) -> None:
        """Fail before dropping anything when the files cannot give every parameter back."""
        if not self.files:
            raise OffloadError("drop mode needs the model's safetensors files")
        index = safetensors_index(self.files)
        bad = []
        for name, p in params:
            m = index.get(name)
            want = str(p.dtype).removeprefix("torch.")
            if m is None or m["shape"] != list(p.shape) or m["dtype"] != want:
                bad.append(f"{name} ({'missing' if m is None else m['dtype'] + str(m['shape'])}; "
                           f"model {want}{list(p.shape)})")
        if bad:
            raise OffloadError(f"{len(bad)} parameter(s) cannot be reloaded from {[str(f) for f in self.files]}: "
                               + "; ".join(bad[:5]))
        self.index = index

    # -- after the restore --------------------------------------------------------

    def restore(self) -> dict:
        """Put every parameter back on the device; returns how long it took and the copy rate."""
        if self.mode is None:
            return {"restored": False, "why": "the weights are on the device"}
        torch = self.torch
        t0 = time.perf_counter()
        # After a restore the first device call waits until runsc has restored
        # the CUDA state (the process is locked until then): timed apart, so
        # `copy_s` and `gb_per_s` are the copy's alone. (Until 2026-12-01 they
        # included that wait, and docs/gpu.md read it as a slow copy.)
        self._sync()
        wait = time.perf_counter() - t0
        params = self.params()
        dest = {name: torch.empty(self.meta[name][0], dtype=self.meta[name][1], device=self.device)
                for name, _ in params}
        if self.mode == "drop":
            nbytes = self._read_files(dest)
        elif self.mode == "staged":
            nbytes = self._from_arena(dest)
        else:
            nbytes = 0
            for name, _ in params:
                dest[name].copy_(self.views[name], non_blocking=self.cuda)
                nbytes += dest[name].numel() * dest[name].element_size()
        self._sync()
        for name, p in params:
            p.data = dest[name]
        mode, self.mode, self.meta = self.mode, None, {}
        dt = time.perf_counter() - t0
        copy = dt - wait
        return {"restored": True, "mode": mode, "bytes": nbytes, "seconds": round(dt, 4),
                "cuda_wait_s": round(wait, 4), "copy_s": round(copy, 4),
                "gb_per_s": round(nbytes / copy / 1e9, 2) if copy > 0 else None, **self._reserved()}

    def _read_files(self, dest: dict) -> int:
        """Each parameter's bytes from the safetensors files, through the ring."""
        pieces = []
        for name in dest:
            m = self.index[name]
            n = m["end"] - m["start"]
            pieces += [((m["file"], m["start"] + off), min(RING_SLOT, n - off), name, off)
                       for off in range(0, n, RING_SLOT)]
        fds = {f: os.open(f, os.O_RDONLY) for f in {p[0][0] for p in pieces}}

        def fill(slot, src, n: int) -> None:
            f, off = src
            buf = memoryview(slot.numpy())[:n]
            got = 0
            while got < n:
                k = os.preadv(fds[f], [buf[got:]], off + got)
                if k <= 0:
                    raise OffloadError(f"short read of {f} at {off + got}")
                got += k

        try:
            return self._through_ring(dest, pieces, fill)
        finally:
            for fd in fds.values():
                os.close(fd)

    def _from_arena(self, dest: dict) -> int:
        """Each parameter's bytes from the pageable arena, through the ring."""
        pieces = []
        for name in dest:
            v = self.views[name]
            n = v.numel() * v.element_size()
            flat = v.view(-1).view(self.torch.uint8)
            pieces += [(flat[off:off + min(RING_SLOT, n - off)], min(RING_SLOT, n - off), name, off)
                       for off in range(0, n, RING_SLOT)]

        def fill(slot, src, n: int) -> None:
            slot[:n].copy_(src)          # a CPU copy; torch lets go of the GIL

        return self._through_ring(dest, pieces, fill)

    def _through_ring(self, dest: dict, pieces: list, fill) -> int:
        """Copy `pieces` (source, length, destination name, destination byte
        offset) to the device through the ring: one thread per slot takes every
        RING_SLOTS-th piece, fills its slot (`fill`, a CPU copy or a file read)
        and copies the slot to its place on a CUDA stream of its own; it fills
        the slot again once that copy is done. The slots never wait for each
        other (a wave of fills waiting for its slowest one held 3B's copy to
        ~17 GB/s with 4 slots: docs/gpu.md)."""
        torch = self.torch
        ring = self.ring or [torch.empty(RING_SLOT, dtype=torch.uint8) for _ in range(RING_SLOTS)]
        k = len(ring)

        def slot_worker(slot: int) -> int:
            stream = torch.cuda.Stream() if self.cuda else None
            done = None        # the event of this slot's last copy
            total = 0
            for src, n, name, doff in pieces[slot::k]:
                if done is not None:
                    done.synchronize()
                fill(ring[slot], src, n)
                dst = dest[name].view(-1).view(torch.uint8)[doff:doff + n]
                if self.cuda:
                    with torch.cuda.stream(stream):
                        dst.copy_(ring[slot][:n], non_blocking=True)
                        done = torch.cuda.Event()
                        done.record(stream)
                else:
                    dst.copy_(ring[slot][:n])
                total += n
            if done is not None:
                done.synchronize()
            return total

        with ThreadPoolExecutor(k) as pool:
            return sum(pool.map(slot_worker, range(k)))

    def state(self) -> str:
        return "device" if self.mode is None else ("dropped" if self.mode == "drop" else "host")
