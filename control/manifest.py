"""Image manifests: what a checkpoint image is made of, versioned and validated.

A manifest names the workload key, the compatibility tuple the image was saved
under, how the files were chunked, and for every file its size and ordered
chunk list (SHA-256 and length of each chunk). Chunks live in the store under
`chunks/<sha256>`; the manifest is the only thing that ties them into files.

Everything read from outside goes through `parse`, which checks every field
and raises ManifestError naming the dotted field: an unknown schema version, a
file name that could leave the entry directory, or chunk lengths that do not
add up to the file size are refused before a byte is fetched.

Schema (version 1), JSON:
    {"schema": "thaw.manifest", "schema_version": 1, "key": K,
     "tuple": {CompatTuple fields}, "tuple_hash": HEX,
     "chunking": {"algorithm": "fastcdc-gear-v1", "hash": "sha256", "min": N, "avg": N, "max": N},
     "files": [{"name": "checkpoint.img", "size": N, "chunks": [[HEX, LEN], ...]}, ...],
     "size": N, "creator": {"host": H, "thaw": V, "created": ISO8601}}
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

from control.compat import CompatTuple
from control.errors import ManifestError, UserError

SCHEMA = "thaw.manifest"
SCHEMA_VERSION = 1
HASH = "sha256"
MAX_FILES = 16
MAX_MANIFEST_BYTES = 64 << 20      # a 1 TiB image at 256 KiB chunks is ~ 350 MB of JSON; ours are far smaller
MAX_CHUNK_BYTES = 64 << 20         # no chunker setting we accept makes larger chunks

# Keys and file names: one path component, no dot-files, safe in S3 keys,
# file names and SQLite without quoting.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_HEX = re.compile(r"^[0-9a-f]{64}$")


def validate_key(key: Any, field_name: str = "key") -> str:
    """A workload key: 1-128 of [A-Za-z0-9._-], starting alphanumeric."""
    if not isinstance(key, str) or not _NAME.match(key):
        raise UserError(f"{field_name} {key!r}: must be 1-128 characters of A-Z a-z 0-9 . _ -, "
                        "starting with a letter or digit", field=field_name)
    return key


@dataclass(frozen=True)
class ChunkRef:
    hash: str      # SHA-256 of the raw bytes, lowercase hex
    length: int


@dataclass(frozen=True)
class FileEntry:
    name: str
    size: int
    chunks: tuple[ChunkRef, ...]

    def placed(self) -> Iterator[tuple[int, ChunkRef]]:
        """(offset, chunk) in file order."""
        off = 0
        for c in self.chunks:
            yield off, c
            off += c.length


@dataclass(frozen=True)
class Chunking:
    algorithm: str
    min: int
    avg: int
    max: int
    hash: str = HASH


@dataclass(frozen=True)
class Manifest:
    key: str
    tuple: CompatTuple
    chunking: Chunking
    files: tuple[FileEntry, ...]
    creator: dict = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def tuple_hash(self) -> str:
        return self.tuple.hash()

    def unique_chunks(self) -> dict[str, int]:
        """hash -> length of every distinct chunk."""
        out: dict[str, int] = {}
        for f in self.files:
            for c in f.chunks:
                out[c.hash] = c.length
        return out

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "key": self.key,
            "tuple": self.tuple.to_dict(), "tuple_hash": self.tuple_hash,
            "chunking": {"algorithm": self.chunking.algorithm, "hash": self.chunking.hash,
                         "min": self.chunking.min, "avg": self.chunking.avg, "max": self.chunking.max},
            "files": [{"name": f.name, "size": f.size, "chunks": [[c.hash, c.length] for c in f.chunks]}
                      for f in self.files],
            "size": self.size, "creator": dict(self.creator),
        }

    def to_json(self) -> bytes:
        return (json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")) + "\n").encode()


def parse(data: bytes, source: str | None = None) -> Manifest:
    """Decode and validate a manifest; ManifestError names the first bad field."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError("(document)", f"{len(data)} bytes exceeds the {MAX_MANIFEST_BYTES}-byte limit", source)
    try:
        d = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ManifestError("(document)", f"not valid JSON: {e}", source) from None
    return from_dict(d, source)


def from_dict(d: Any, source: str | None = None) -> Manifest:
    def need(cond: bool, fld: str, problem: str) -> None:
        if not cond:
            raise ManifestError(fld, problem, source)

    def integer(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    need(isinstance(d, dict), "(document)", "must be a JSON object")
    need(d.get("schema") == SCHEMA, "schema", f"must be {SCHEMA!r}, got {d.get('schema')!r}")
    ver = d.get("schema_version")
    need(integer(ver), "schema_version", f"must be an integer, got {ver!r}")
    need(ver == SCHEMA_VERSION, "schema_version",
         f"unknown version {ver}; this thaw reads version {SCHEMA_VERSION} (upgrade thaw to read it)")
    known = {"schema", "schema_version", "key", "tuple", "tuple_hash", "chunking", "files", "size", "creator"}
    for k in d:
        need(k in known, k, "unknown field")
    key = d.get("key")
    need(isinstance(key, str) and bool(_NAME.match(key)), "key",
         "must be 1-128 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit")
    tup = CompatTuple.from_dict(d.get("tuple"), "tuple", source)
    need(d.get("tuple_hash") == tup.hash(), "tuple_hash",
         f"{d.get('tuple_hash')!r} is not the hash of the tuple ({tup.hash()})")

    ch = d.get("chunking")
    need(isinstance(ch, dict), "chunking", "must be an object")
    need(isinstance(ch.get("algorithm"), str) and ch["algorithm"] != "", "chunking.algorithm", "must be a string")
    need(ch.get("hash") == HASH, "chunking.hash", f"must be {HASH!r}, got {ch.get('hash')!r}")
    for k in ("min", "avg", "max"):
        need(integer(ch.get(k)) and 0 < ch[k] <= MAX_CHUNK_BYTES, f"chunking.{k}",
             f"must be an integer in 1..{MAX_CHUNK_BYTES}")
    chunking = Chunking(ch["algorithm"], ch["min"], ch["avg"], ch["max"])

    files = d.get("files")
    need(isinstance(files, list) and 0 < len(files) <= MAX_FILES, "files", f"must be a list of 1..{MAX_FILES} files")
    seen: set[str] = set()
    out: list[FileEntry] = []
    for i, f in enumerate(files):
        where = f"files[{i}]"
        need(isinstance(f, dict), where, "must be an object")
        for k in f:
            need(k in ("name", "size", "chunks"), f"{where}.{k}", "unknown field")
        name = f.get("name")
        need(isinstance(name, str) and bool(_NAME.match(name)), f"{where}.name",
             f"{name!r} is not a plain file name (one path component of A-Z a-z 0-9 . _ -, "
             "not starting with '.'): refusing a path that could leave the entry directory")
        need(name not in seen, f"{where}.name", f"{name!r} appears twice")
        seen.add(name)
        size = f.get("size")
        need(integer(size) and size >= 0, f"{where}.size", "must be a non-negative integer")
        chunks = f.get("chunks")
        need(isinstance(chunks, list), f"{where}.chunks", "must be a list")
        refs = []
        total = 0
        for j, c in enumerate(chunks):
            cw = f"{where}.chunks[{j}]"
            need(isinstance(c, list) and len(c) == 2, cw, "must be [sha256, length]")
            need(isinstance(c[0], str) and bool(_HEX.match(c[0])), f"{cw}[0]", "must be 64 lowercase hex digits")
            need(integer(c[1]) and 0 < c[1] <= MAX_CHUNK_BYTES, f"{cw}[1]",
                 f"must be an integer in 1..{MAX_CHUNK_BYTES}")
            total += c[1]
            refs.append(ChunkRef(c[0], c[1]))
        need(total == size, f"{where}.chunks",
             f"chunk lengths add up to {total} bytes, but {where}.size is {size}")
        out.append(FileEntry(name, size, tuple(refs)))
    total_size = sum(f.size for f in out)
    need(d.get("size") == total_size, "size", f"is {d.get('size')!r}, but the files add up to {total_size}")
    creator = d.get("creator", {})
    need(isinstance(creator, dict) and all(isinstance(k, str) and isinstance(v, (str, int, float))
                                           for k, v in creator.items()),
         "creator", "must map strings to strings or numbers")
    return Manifest(key=key, tuple=tup, chunking=chunking, files=tuple(out), creator=dict(creator))
