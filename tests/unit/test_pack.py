import os
import zlib

import pytest

from control.images import chunk as pack
from control.errors import ImageError


def test_compressible_chunks_are_compressed_and_round_trip():
    raw = (b"python heap \x00\x00\x00\x00" * 20000)[:200000]
    codec, payload = pack.encode(raw)
    assert codec == pack.CODEC_ZLIB and len(payload) < len(raw) // 10
    assert pack.decode(codec, payload, len(raw)) == raw


def test_incompressible_chunks_are_stored_raw():
    raw = os.urandom(300000)
    assert pack.encode(raw) == (pack.CODEC_NONE, raw)
    small = os.urandom(1000)
    assert pack.encode(small) == (pack.CODEC_NONE, small)


def test_compression_must_save_ten_percent():
    # 85% random, 15% zeros: zlib saves < 10% on the whole chunk
    raw = os.urandom(8500) + bytes(1500)
    codec, _ = pack.encode(raw)
    assert codec == pack.CODEC_ZLIB if len(zlib.compress(raw, 1)) <= 0.9 * len(raw) else pack.CODEC_NONE


def test_decode_refuses_wrong_lengths_and_garbage():
    z = zlib.compress(b"x" * 1000)
    with pytest.raises(ValueError, match="expected 999"):
        pack.decode("zlib", z, 999)
    with pytest.raises(ValueError, match="zlib"):
        pack.decode("zlib", b"not zlib", 10)
    with pytest.raises(ValueError, match="unknown codec"):
        pack.decode("lz4", b"", 0)
    with pytest.raises(ValueError):
        pack.decode("none", b"abc", 4)


def test_zero_hash():
    assert pack.zero_hash(4096) == pack.sha256(bytes(4096))


def test_reference_cuts_respect_bounds():
    data = os.urandom(200_000)
    cuts = pack.reference_cuts(data, 1024, 4096, 16384)
    assert sum(cuts) == len(data)
    assert all(1024 < c <= 16384 for c in cuts[:-1])
    # content-defined: a prefix insertion moves only the first boundaries
    shifted = pack.reference_cuts(b"xyz" + data, 1024, 4096, 16384)
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
        pack.image_files(tmp_path)
    (tmp_path / "checkpoint.img").write_bytes(b"x")
    (tmp_path / "pages.img").write_bytes(b"y")
    assert [p.name for p in pack.image_files(tmp_path)] == ["checkpoint.img", "pages.img"]
    (tmp_path / "sub").mkdir()
    with pytest.raises(ImageError, match="regular files only"):
        pack.image_files(tmp_path)


def test_write_runs_merges_neighbours_and_survives_short_writes(tmp_path, monkeypatch):
    from control.images import transfer
    p = tmp_path / "f"
    fd = os.open(p, os.O_RDWR | os.O_CREAT)
    try:
        os.ftruncate(fd, 40)
        calls = []
        real = os.pwritev

        def short(fd_, bufs, off):   # write only the first buffer of each call
            calls.append(len(bufs))
            return real(fd_, bufs[:1], off)
        monkeypatch.setattr(transfer.os, "pwritev", short)
        transfer._write_runs([(fd, 10, b"cccc"), (fd, 0, b"aaaa"), (fd, 4, b"bbbbbb"), (fd, 30, memoryview(b"zz"))])
        assert calls == [3]          # 0..4, 4..10 and 10..14 in one call; 30..32 alone
    finally:
        os.close(fd)
    assert p.read_bytes() == b"aaaabbbbbbcccc" + bytes(16) + b"zz" + bytes(8)
