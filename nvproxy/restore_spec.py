"""A GPU sandbox's spec for restore: its image's spec with the GPUs this node
assigns now, and the checks runsc's restore validation makes of it, done first
so that a mismatch is a clear error instead of a failed `runsc restore`
(docs/notes/gvisor-facts.md "checkpoint / restore").

The GPUs may be other minors than at checkpoint (runsc pairs saved and new
GPUs by minor); every mount destination, type and option, and every device
other than /dev/nvidiaN, must be the same. CDI injection itself is
nvproxy/cdi.py's.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Mapping

from control.errors import SpecError
from nvproxy import cdi


def for_restore(spec: dict, saved: dict, registry: cdi.Registry, devices: Iterable[str],
                stat: Callable[[str], os.stat_result] = os.stat) -> dict:
    """The spec to restore `saved`'s image with, on this node, with `devices` assigned.

    `spec` is the spec the container is started with now (its own earlier
    injection, if any, is taken out first); `saved` is the spec the image was
    checkpointed with. The GPUs may be other minors than at checkpoint; a
    mount whose destination moved (a driver file in another directory on this
    node) is put back at the saved destination, matched by file name. Raises
    SpecError when the result would fail runsc's restore validation.
    """
    new = cdi.inject(cdi.strip(spec), registry, devices, stat)
    saved_dests = {m.get("destination") for m in saved.get("mounts") or []}
    new_dests = {m.get("destination") for m in new.get("mounts") or []}
    orphans = {}   # basename -> saved destination with no counterpart now
    for d in saved_dests - new_dests:
        orphans.setdefault(os.path.basename(d), []).append(d)
    for m in new.get("mounts") or []:
        d = m.get("destination")
        if d in saved_dests:
            continue
        cands = orphans.get(os.path.basename(d), [])
        if len(cands) == 1:
            m["destination"] = cands.pop()
    check_restore_compatible(saved, new)
    return new


def _mount_key(m: Mapping[str, Any]) -> tuple:
    return (m.get("destination"), m.get("type", "bind"), tuple(m.get("options") or []))


def check_restore_compatible(saved: dict, new: dict) -> None:
    """Raise SpecError where `new` differs from `saved` in what runsc restore
    validates about GPUs and mounts (docs/notes/gvisor-facts.md "checkpoint / restore"):
    mount destinations, types and options; the device set other than
    /dev/nvidiaN; and the number of GPUs (runsc pairs saved and new GPUs by
    minor and needs one for each)."""
    sm = {_mount_key(m)[0]: _mount_key(m) for m in saved.get("mounts") or []}
    nm = {_mount_key(m)[0]: _mount_key(m) for m in new.get("mounts") or []}
    gone, added = sorted(set(sm) - set(nm)), sorted(set(nm) - set(sm))
    if gone:
        raise SpecError("mounts", f"{', '.join(gone)} mounted in the checkpoint but not on this node "
                        "(a driver file missing or in another place?)")
    if added:
        raise SpecError("mounts", f"{', '.join(added)} mounted on this node but not in the checkpoint "
                        "(a different driver or CDI spec?)")
    changed = [d for d in sorted(sm) if sm[d] != nm[d]]
    if changed:
        d = changed[0]
        raise SpecError("mounts", f"{d}: type/options {sm[d][1:]} at checkpoint, {nm[d][1:]} now")

    def others(s: dict) -> dict:
        return {d.get("path"): (d.get("type"), d.get("major"), d.get("minor"))
                for d in (s.get("linux") or {}).get("devices") or [] if not cdi.GPU_NODE.match(str(d.get("path", "")))}
    so, no = others(saved), others(new)
    if so != no:
        diff = sorted(set(so.items()) ^ set(no.items()), key=str)
        raise SpecError("linux.devices", f"device set differs from the checkpoint: {diff}")
    sg, ng = cdi.gpu_nodes(saved), cdi.gpu_nodes(new)
    if len(sg) != len(ng):
        raise SpecError("linux.devices", f"the checkpoint has {len(sg)} GPU(s) ({', '.join(sg) or 'none'}), "
                        f"this restore assigns {len(ng)} ({', '.join(ng) or 'none'})")
