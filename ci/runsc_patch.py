"""The one edit every ci/patch-runsc-*.py makes to thaw's copy of the pinned gVisor:
replace text that must occur exactly once, or stop the build naming the file (the pin
moved and the patch needs a look). Imported by those scripts (ci/ is their sys.path[0])."""
from __future__ import annotations

import sys
from pathlib import Path


def patch_file(who: str, path: Path, edits: list[tuple[str, str]], hint: str = "") -> None:
    """Apply each (old, new) of `edits` to `path`, every old found exactly once, and
    write the file only when all were; else exit with `who`'s message (and `hint`)."""
    text = path.read_text()
    for old, new in edits:
        if text.count(old) != 1:
            sys.exit(f"{who}: {path} changed upstream (expected one {old.strip()[:70]!r}){hint}")
        text = text.replace(old, new)
    path.write_text(text)
