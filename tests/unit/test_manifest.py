import json

import pytest

from control.images import manifest as m
from control.errors import ManifestError, UserError
from control.images.manifest import ChunkRef, Chunking, FileEntry, Location, Manifest

from .fakes import TUPLE

H1, H2, P = "a" * 64, "b" * 64, "c" * 64


def good() -> Manifest:
    return Manifest(key="wl-1", tuple=TUPLE, chunking=Chunking("fastcdc-gear-v1", 64, 256, 1024),
                    files=(FileEntry("checkpoint.img", 300, (ChunkRef(H1, 100), ChunkRef(H2, 200))),
                           FileEntry("pages.img", 100, (ChunkRef(H1, 100),))),
                    locations={H1: Location(P, 0, 100, "none"), H2: Location(P, 100, 50, "zlib")},
                    creator={"host": "n1"})


def doc() -> dict:
    return json.loads(good().to_json())


def parse(d: dict) -> Manifest:
    return m.parse(json.dumps(d).encode(), "test")


def field_of(d: dict) -> str:
    with pytest.raises(ManifestError) as e:
        parse(d)
    return e.value.field


def test_round_trip():
    x = parse(doc())
    assert x == good()
    assert x.size == 400 and x.unique_chunks() == {H1: 100, H2: 200}
    assert x.stored_bytes == 150


def test_unknown_schema_version_is_refused_by_name():
    d = doc()
    d["schema_version"] = 4
    with pytest.raises(ManifestError) as e:
        parse(d)
    assert e.value.field == "schema_version" and "unknown version 4" in str(e.value)


B1, B2 = "d" * 64, "e" * 64


def good_v2() -> Manifest:
    g = good()
    return Manifest(key=g.key, tuple=g.tuple, chunking=Chunking("fastcdc-gear-v1", 64, 256, 1024, check="blake3"),
                    files=(FileEntry("checkpoint.img", 300, (ChunkRef(H1, 100, B1), ChunkRef(H2, 200, B2))),
                           FileEntry("pages.img", 100, (ChunkRef(H1, 100, B1),))),
                    locations=g.locations, creator=g.creator)


def test_schema_2_carries_a_blake3_check_per_chunk_and_round_trips():
    d = json.loads(good_v2().to_json())
    assert d["schema_version"] == 2 and d["chunking"]["check"] == "blake3"
    assert d["files"][0]["chunks"][1] == [H2, 200, 0, 100, 50, "zlib", B2]
    assert parse(d) == good_v2()
    # A manifest without checks is still written, and read, as version 1.
    assert doc()["schema_version"] == 1 and len(doc()["files"][0]["chunks"][0]) == 6


@pytest.mark.parametrize("mutate,fld", [
    (lambda d: d["files"][0]["chunks"][0].__setitem__(6, "X" * 64), "files[0].chunks[0][6]"),
    (lambda d: d["files"][0]["chunks"][0].pop(), "files[0].chunks[0]"),            # six elements in version 2
    (lambda d: d["files"][1]["chunks"][0].__setitem__(6, B2), "files[1].chunks[0]"),  # one chunk, two checks
    (lambda d: d["chunking"].pop("check"), "chunking.check"),
    (lambda d: d["chunking"].__setitem__("check", "md5"), "chunking.check"),
    (lambda d: d.__setitem__("schema_version", 1), "chunking.check"),                # version 1 has no check
])
def test_schema_2_checks_are_validated(mutate, fld):
    d = json.loads(good_v2().to_json())
    mutate(d)
    assert field_of(d) == fld


@pytest.mark.parametrize("name", ["../pages.img", "a/b", "/etc/passwd", ".hidden", "..", "", "x" * 200, "a\x00b"])
def test_path_traversal_and_odd_names_are_refused(name):
    d = doc()
    d["files"][1]["name"] = name
    assert field_of(d) == "files[1].name"


def test_chunk_lists_must_add_up():
    d = doc()
    d["files"][0]["size"] = 301
    with pytest.raises(ManifestError) as e:
        parse(d)
    assert e.value.field == "files[0].chunks" and "add up to 300" in str(e.value)


def test_total_size_must_add_up():
    d = doc()
    d["size"] = 1
    assert field_of(d) == "size"


@pytest.mark.parametrize("i,value,fld", [
    (0, "A" * 64, "files[0].chunks[0][0]"),
    (1, 0, "files[0].chunks[0][1]"),
    (2, 5, "files[0].chunks[0][2]"),
    (3, -1, "files[0].chunks[0][3]"),
    (5, "lz4", "files[0].chunks[0][5]"),
    (4, 99, "files[0].chunks[0][4]"),   # uncompressed but stored length differs
])
def test_chunk_fields(i, value, fld):
    d = doc()
    d["files"][0]["chunks"][0][i] = value
    assert field_of(d) == fld


def test_same_chunk_two_locations_is_refused():
    d = doc()
    d["files"][1]["chunks"][0][3] = 7
    assert field_of(d) == "files[1].chunks[0]"


def test_tuple_hash_must_match_tuple():
    d = doc()
    d["tuple"]["machine_type"] = "other"
    assert field_of(d) == "tuple_hash"


def test_unknown_fields_and_garbage():
    d = doc() | {"surprise": 1}
    assert field_of(d) == "surprise"
    with pytest.raises(ManifestError, match="not valid JSON"):
        m.parse(b"{nope", "x")
    with pytest.raises(ManifestError) as e:
        m.parse(b"[]", "x")
    assert e.value.field == "(document)"


def test_duplicate_file_names():
    d = doc()
    d["files"][1]["name"] = "checkpoint.img"
    d["files"][1]["chunks"] = d["files"][0]["chunks"]
    d["files"][1]["size"] = 300
    d["size"] = 600
    assert field_of(d) == "files[1].name"


@pytest.mark.parametrize("key", ["ok", "a.b_c-1", "A" * 128])
def test_valid_keys(key):
    assert m.validate_key(key) == key


@pytest.mark.parametrize("key", ["", "-x", ".x", "a/b", "a b", "A" * 129, "ü", None])
def test_invalid_keys(key):
    with pytest.raises(UserError):
        m.validate_key(key)


def test_a_deeply_nested_document_is_a_manifest_error_naming_it():
    """Issue 30: 200 KB of brackets was RecursionError (exit 70; under thawd, `thawd-unavailable`)."""
    from control.errors import ManifestRefused
    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(ManifestError, match="nested too deeply") as e:
        m.parse(deep, "s3://b/manifests/k/t.json")
    assert e.value.source == "s3://b/manifests/k/t.json" and e.value.field == "(document)"
    with pytest.raises(ManifestRefused, match="nested too deeply"):
        m.verify(deep, b"k" * 32, "s3://b/x")


def test_a_manifests_own_field_names_and_values_do_not_make_a_long_line():
    huge = "f" * 100_000
    with pytest.raises(ManifestError) as e:
        m.parse(json.dumps({"schema": "thaw.manifest", "schema_version": 2, huge: 1}).encode())
    assert len(str(e.value)) < 700 and "100000 characters" in str(e.value)
    with pytest.raises(ManifestError) as e:
        m.parse(json.dumps({"schema": huge}).encode())
    assert len(str(e.value)) < 700
