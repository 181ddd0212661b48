"""Chunking (control/images/chunk.py): the reference cut rule, image directories, file states."""
import os

import pytest

from control.images import chunk
from control.errors import ImageError


def test_zero_hash():
    assert chunk.zero_hash(4096) == chunk.sha256(bytes(4096))


def test_reference_cuts_respect_bounds():
    data = os.urandom(200_000)
    cuts = chunk.reference_cuts(data, 1024, 4096, 16384)
    assert sum(cuts) == len(data)
    assert all(1024 < c <= 16384 for c in cuts[:-1])
    # content-defined: a prefix insertion moves only the first boundaries
    shifted = chunk.reference_cuts(b"xyz" + data, 1024, 4096, 16384)
    ends = set()
    off = 0
    for c in cuts:
        off += c
        ends.add(off + 3)
    off, same = 0, 0
    for c in shifted:
        off += c
        same += off in ends
    assert same >= len(cuts) - 3


def test_image_files(tmp_path):
    with pytest.raises(ImageError, match="no checkpoint.img"):
        chunk.image_files(tmp_path)
    (tmp_path / "checkpoint.img").write_bytes(b"x")
    (tmp_path / "pages.img").write_bytes(b"y")
    assert [p.name for p in chunk.image_files(tmp_path)] == ["checkpoint.img", "pages.img"]
    (tmp_path / "sub").mkdir()
    with pytest.raises(ImageError, match="regular files only"):
        chunk.image_files(tmp_path)


def test_file_state_sees_a_rewrite_that_keeps_size_and_mtime(tmp_path):
    p = tmp_path / "pages.img"
    p.write_bytes(b"a" * 100)
    before = chunk.file_state([p])
    st = p.stat()
    with open(p, "r+b") as f:
        f.write(b"b")
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))   # size and mtime as before: ctime still moved
    assert p.stat().st_mtime_ns == st.st_mtime_ns
    assert chunk.file_state([p]) != before
    assert chunk.file_state([p]) == chunk.file_state([p])
