import os
import zlib

import pytest

from control.images import pack


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


def test_groups_keep_file_order_and_fill_packs():
    chunks = [(f"h{i}", 10) for i in range(7)]
    assert pack.groups(chunks, limit=30) == [["h0", "h1", "h2"], ["h3", "h4", "h5"], ["h6"]]
    assert pack.groups([], limit=30) == []


def test_build_places_encoded_chunks_and_names_the_pack_by_its_table():
    a, b = os.urandom(50_000), b"heap\0\0\0\0" * 10_000
    salt = b"s" * pack.SALT_BYTES
    p = pack.build([("ha", a), ("hb", memoryview(b))], salt=salt)
    (ha, la, na), (hb, lb, nb) = p.chunks
    assert (ha, la.codec, la.offset, la.stored, na) == ("ha", pack.CODEC_NONE, 0, len(a), len(a))
    assert (hb, lb.codec, lb.offset, nb) == ("hb", pack.CODEC_ZLIB, len(a), len(b))
    assert len(p.body) == la.stored + lb.stored and p.raw_bytes == len(a) + len(b)
    assert pack.decode(lb.codec, p.body[lb.offset:lb.offset + lb.stored], nb) == b
    assert bytes(p.body[:la.stored]) == a
    table = [("ha", "none", len(a)), ("hb", "zlib", lb.stored)]
    assert la.pack == lb.pack == p.name == pack.name(table, salt=salt)
    # The name depends on the table and the salt only: the same chunks in another order,
    # or another codec, differ.
    assert pack.build([("hb", b), ("ha", a)], salt=salt).name != p.name
    assert pack.name([("ha", "zlib", len(a)), ("hb", "zlib", lb.stored)], salt=salt) != p.name
    # Unsalted (packs written before issue 33) it is the table's hash alone.
    assert pack.name(table) not in (p.name, pack.name(table, salt=b"t" * pack.SALT_BYTES))


def test_no_two_builds_share_a_name():
    """The store GC relies on it: a publish never re-puts an object an old pack had (issue 33)."""
    chunks = [("ha", b"x" * 1000)]
    names = {pack.build(chunks).name for _ in range(50)}
    assert len(names) == 50
