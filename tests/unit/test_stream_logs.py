"""The streams' thaw-gofer logs are bounded (control/images/stream.py prune_logs): one file
per streamed restore used to pile up in <node.log_dir>/streams for ever (issue 32 item 4)."""
from __future__ import annotations

import os

from control.images.stream import prune_logs


def _log(d, name: str, age_s: int) -> None:
    p = d / name
    p.write_text(name)
    t = 1_800_000_000 - age_s
    os.utime(p, (t, t))


def test_the_newest_are_kept_and_other_files_are_left(tmp_path):
    for i in range(5):
        _log(tmp_path, f"e{i}.gofer.log", age_s=i)      # e0 newest
    _log(tmp_path, "notes.txt", age_s=100)
    gone = prune_logs(tmp_path, "*.gofer.log", 2)
    assert sorted(p.name for p in gone) == ["e2.gofer.log", "e3.gofer.log", "e4.gofer.log"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e0.gofer.log", "e1.gofer.log", "notes.txt"]


def test_within_the_bound_nothing_goes(tmp_path):
    _log(tmp_path, "a.gofer.log", age_s=1)
    assert prune_logs(tmp_path, "*.gofer.log", 1) == [] and (tmp_path / "a.gofer.log").exists()
    assert prune_logs(tmp_path / "missing", "*.gofer.log", 0) == []
