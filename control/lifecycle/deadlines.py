"""Deadlines of the runsc calls that move a sandbox's memory, scaled by how much
they move (issue 32).

A checkpoint copies the sandbox's memory to disk and, on a GPU, every byte of
device memory its CUDA processes hold first (the driver's checkpoint copies
it to host memory, runsc then writes it with the rest); a restore reads the
image back. One fixed `runsc.timeout_s` that suits a 6 GB model killed the
checkpoint of a JAX server whose XLA allocator had reserved 108 GB of GPU
memory by default (151 s against 120, on an H200). So the deadline is
`runsc.timeout_s` plus `runsc.timeout_per_gib_s` for each GiB to move, and a
timeout names both settings and the size it was given, so the error says
which knob to turn.

The footprint is an upper bound, read just before the save: the sandbox's
memory as runsc accounts it (`runsc events --stats`: what the sentry holds,
its tmpfs files included) plus the memory in use on each GPU the sandbox's
spec names (NVML; a GPU shared with other work counts in full, which only
lengthens the deadline). Reading it costs one runsc call and, on a GPU node,
one NVML session: ~30-50 ms against a checkpoint of seconds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from control.config import Settings
from control.errors import ThawError
from control.logfields import fields

log = logging.getLogger(__name__)

GIB = 1 << 30
TIMEOUT_KEY = "runsc.timeout_s"
PER_GIB_KEY = "runsc.timeout_per_gib_s"


@dataclass(frozen=True)
class Deadline:
    seconds: float
    key: str          # what bounds it, as a timeout's message names it
    nbytes: int = 0   # the footprint it was scaled by


def scaled(settings: Settings, nbytes: int) -> Deadline:
    """runsc.timeout_s plus runsc.timeout_per_gib_s for each GiB of `nbytes`."""
    extra = settings.runsc_timeout_per_gib_s * max(0, nbytes) / GIB
    if extra <= 0:
        return Deadline(settings.runsc_timeout_s, TIMEOUT_KEY, max(0, nbytes))
    return Deadline(settings.runsc_timeout_s + extra,
                    f"{TIMEOUT_KEY} + {PER_GIB_KEY} x {nbytes / GIB:.1f} GiB", nbytes)


def image_bytes(image: Path) -> int:
    """The bytes of a runsc image directory's files (0 where it holds none: a streamed
    image's view, whose files arrive during the restore and whose stream has its own
    deadline)."""
    from runsc_hooks.runsc import IMAGE_FILES
    total = 0
    for name in IMAGE_FILES:
        try:
            total += (Path(image) / name).stat().st_size
        except OSError:
            pass
    return total


def for_restore(settings: Settings, image: Path) -> Deadline:
    return scaled(settings, image_bytes(image))


def footprint(runsc, cid: str, gpu_specs: list[dict], gpu_used=None) -> int:
    """What a checkpoint of sandbox `cid` will save, at most: its memory as runsc
    accounts it plus the memory in use on the GPUs the specs name. A part that cannot
    be read counts 0 (the fixed deadline then applies to it), never fails the save."""
    host = 0
    try:
        host = runsc.memory_usage(cid)
    except ThawError as e:
        log.debug("memory of %s: %s", cid, e, extra=fields(container=cid, reason=str(e)))
    gpu = 0
    if gpu_specs:
        from nvproxy import cdi, gpu as gpumod
        minors = sorted({int(p.removeprefix("/dev/nvidia")) for s in gpu_specs for p in cdi.gpu_nodes(s)})
        try:
            gpu = (gpu_used or gpumod.used_bytes)(minors)
        except ThawError as e:
            log.debug("GPU memory of %s: %s", cid, e, extra=fields(container=cid, reason=str(e)))
    return host + gpu


def for_checkpoint(settings: Settings, runsc, cid: str, gpu_specs: list[dict], gpu_used=None) -> Deadline:
    d = scaled(settings, footprint(runsc, cid, gpu_specs, gpu_used))
    log.debug("checkpoint of %s: deadline %.0f s (%s)", cid, d.seconds, d.key,
              extra=fields(container=cid, deadline_s=round(d.seconds, 1), bytes=d.nbytes))
    return d
