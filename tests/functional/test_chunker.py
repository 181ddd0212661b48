"""thaw-chunk (go/cmd/thaw-chunk) against the Python twin of its cut rule."""
import hashlib
import os
import random
from pathlib import Path

import pytest

from control.images import chunk
from tests.conftest import BUILD

CHUNKER = BUILD / "thaw-chunk"


@pytest.fixture(scope="module")
def chunker() -> Path:
    assert CHUNKER.is_file(), f"{CHUNKER} missing: run `make build`"
    return CHUNKER


def chunks_of(chunker, path, avg):
    _, [entry] = chunk.chunk_files([path], chunker, avg)
    return entry


def test_go_cuts_equal_the_python_reference(tmp_path, chunker):
    rng = random.Random(5)
    data = rng.randbytes(150_000) + bytes(40_000) + b"abc" * 30_000 + rng.randbytes(60_000)
    p = tmp_path / "pages.img"
    p.write_bytes(data)
    avg = 4096
    entry = chunks_of(chunker, p, avg)
    mn, av, mx = chunk.chunk_params(avg)
    assert [c.length for c in entry.chunks] == chunk.reference_cuts(data, mn, av, mx)
    off = 0
    for c in entry.chunks:
        assert c.hash == hashlib.sha256(data[off:off + c.length]).hexdigest()
        off += c.length
    assert entry.size == len(data)


@pytest.mark.parametrize("avg", [64 << 10, 256 << 10, 1 << 20])
def test_zero_runs_are_max_size_chunks(tmp_path, chunker, avg):
    # transfer.fill relies on this to recognise all-zero chunks cheaply.
    p = tmp_path / "z"
    p.write_bytes(bytes(avg * 4 * 5 + 123))
    lengths = [c.length for c in chunks_of(chunker, p, avg).chunks]
    assert lengths[:-1] == [avg * 4] * (len(lengths) - 1)


def test_insertion_moves_few_boundaries(tmp_path, chunker):
    data = os.urandom(8 << 20)
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(data)
    b.write_bytes(data[:3 << 20] + b"inserted" + data[3 << 20:])
    ha = {c.hash for c in chunks_of(chunker, a, 256 << 10).chunks}
    hb = [c.hash for c in chunks_of(chunker, b, 256 << 10).chunks]
    assert sum(h not in ha for h in hb) <= 2


def test_bad_arguments_and_empty_files(tmp_path, chunker):
    import subprocess
    r = subprocess.run([str(chunker), "-avg=1000", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and "power of two" in r.stderr
    e = tmp_path / "empty"
    e.write_bytes(b"")
    assert chunks_of(chunker, e, 4096).chunks == ()


def test_every_chunk_carries_its_blake3_check(tmp_path, chunker):
    # BLAKE3("abc"), the published test vector; hashlib has no BLAKE3 to compare with.
    (tmp_path / "abc").write_bytes(b"abc")
    [one] = chunk.chunk_files([tmp_path / "abc"], chunker, 1 << 16)[1][0].chunks
    assert one.hash == hashlib.sha256(b"abc").hexdigest()
    assert one.check == "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"
    data = random.Random(7).randbytes(3 << 20)
    (tmp_path / "r").write_bytes(data)
    chunking, [entry] = chunk.chunk_files([tmp_path / "r"], chunker, 1 << 16)
    assert chunking.check == "blake3" and len(entry.chunks) > 10
    assert len({c.check for c in entry.chunks}) == len(entry.chunks)
