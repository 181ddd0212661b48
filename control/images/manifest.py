"""Image manifests: what a checkpoint image is made of, versioned and validated.

A manifest names the workload key, the compatibility tuple the image was saved
under, how the files were chunked, and for every file its size and ordered
chunk list: SHA-256 and length of each chunk, and where its bytes lie in the
store (pack object, offset, stored length, codec). Packs (`packs/<sha256>`)
hold encoded chunks back to back, so a fetch reads long ranges instead of one
object per chunk (docs/store.md has the measurements); the manifest is the
only thing that ties chunks into files.

Everything read from outside goes through `parse`, which checks every field
and raises ManifestError naming the dotted field: an unknown schema version, a
file name that could leave the entry directory, or chunk lengths that do not
add up to the file size are refused before a byte is fetched.

Schema (version 2), JSON:
    {"schema": "thaw.manifest", "schema_version": 2, "key": K,
     "tuple": {CompatTuple fields}, "tuple_hash": HEX,
     "chunking": {"algorithm": "fastcdc-gear-v1", "hash": "sha256", "check": "blake3",
                  "min": N, "avg": N, "max": N},
     "packs": [PACK_SHA256, ...],
     "files": [{"name": "checkpoint.img", "size": N,
                "chunks": [[HEX, LEN, PACK_INDEX, OFFSET_IN_PACK, STORED_LEN, CODEC, BLAKE3_HEX], ...]}, ...],
     "size": N, "creator": {"host": H, "thaw": V, "created": ISO8601}}
CODEC is "none" (STORED_LEN == LEN) or "zlib". A chunk is named by its
SHA-256 (dedup, the node's chunk index, local copies: hashlib checks it);
BLAKE3_HEX is what thaw-fetch checks fetched bytes against, because it costs
about half as much CPU per byte (docs/store.md). Version 1 is the same without
"check" and without the seventh element (fetches then check SHA-256); it is
still read, and written for a manifest that has no checks.

Version 3 (issue 13) adds "tenant" (whose image it is: the key starts with it,
and the store holds it under that tenant's prefix), "encryption" (absent, or
keys.ENCRYPTION when every chunk is sealed with the tenant's key: STORED_LEN
is then the sealed length, keys.SEALED_OVERHEAD more than the payload) and
"tag": HMAC-SHA256 under the cluster's manifest key of the canonical JSON of
every other field (`sign`, `verify`). A node with a manifest key refuses a
manifest whose tag is missing or wrong before it fetches a byte.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

from control.node.compat import CompatTuple
from control.errors import ManifestError, ManifestRefused, UserError
from control.images import keys as keysmod

SCHEMA = "thaw.manifest"
SCHEMA_VERSION = 3
SCHEMA_VERSIONS = (1, 2, 3)         # read; 1 has no per-chunk BLAKE3 check, 1 and 2 no tenant
HASH = "sha256"
CHECK = "blake3"                    # twin: go/cmd/thaw-chunk (the "b" field), go/cmd/thaw-fetch
MAX_FILES = 16
MAX_MANIFEST_BYTES = 64 << 20      # a 1 TiB image at 256 KiB chunks is ~ 350 MB of JSON; ours are far smaller
MAX_CHUNK_BYTES = 64 << 20         # no chunker setting we accept makes larger chunks
MAX_PACK_BYTES = 1 << 30
CODECS = ("none", "zlib")          # twin: control/images/pack.py CODEC_*

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
    check: str = ""  # BLAKE3-256 of the raw bytes (schema 2), "" where unknown (schema 1)


@dataclass(frozen=True)
class Location:
    """Where a chunk's encoded bytes lie in the store."""
    pack: str      # pack object name (control/images/pack.py name: SHA-256 of its table of contents)
    offset: int
    stored: int    # encoded length
    codec: str


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
    check: str = ""   # CHECK when every chunk carries one (schema 2)


@dataclass(frozen=True)
class Manifest:
    key: str
    tuple: CompatTuple
    chunking: Chunking
    files: tuple[FileEntry, ...]
    locations: dict = field(default_factory=dict)   # hash -> Location
    creator: dict = field(default_factory=dict)
    tenant: str = ""        # schema 3: whose image (the store tenant)
    encryption: str = ""    # "" or keys.ENCRYPTION: every chunk sealed with the tenant's key

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

    @property
    def packs(self) -> list[str]:
        return sorted({loc.pack for loc in self.locations.values()})

    @property
    def stored_bytes(self) -> int:
        return sum(loc.stored for loc in self.locations.values())

    def to_dict(self) -> dict:
        packs = self.packs
        index = {p: i for i, p in enumerate(packs)}

        checked = bool(self.chunking.check)

        def ref(c: ChunkRef) -> list:
            loc = self.locations[c.hash]
            return [c.hash, c.length, index[loc.pack], loc.offset, loc.stored, loc.codec] + ([c.check] if checked
                                                                                            else [])
        chunking = {"algorithm": self.chunking.algorithm, "hash": self.chunking.hash,
                    "min": self.chunking.min, "avg": self.chunking.avg, "max": self.chunking.max}
        if checked:
            chunking["check"] = self.chunking.check
        v3 = bool(self.tenant)
        extra: dict = {}
        if v3:
            extra["tenant"] = self.tenant
            if self.encryption:
                extra["encryption"] = self.encryption
        return {
            **extra,
            "schema": SCHEMA, "schema_version": 3 if v3 else 2 if checked else 1, "key": self.key,
            "tuple": self.tuple.to_dict(), "tuple_hash": self.tuple_hash,
            "chunking": chunking,
            "packs": packs,
            "files": [{"name": f.name, "size": f.size, "chunks": [ref(c) for c in f.chunks]} for f in self.files],
            "size": self.size, "creator": dict(self.creator),
        }

    def to_json(self) -> bytes:
        return (json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")) + "\n").encode()


def parse(data: bytes, source: str | None = None) -> Manifest:
    """Decode and validate a manifest; ManifestError names the first bad field."""
    return from_dict(load_json(data, source), source)


def load_json(data: bytes, source: str | None = None, limit: int = MAX_MANIFEST_BYTES) -> Any:
    """A document from the store as JSON, bounded: at most `limit` bytes (the store's reads
    stop there too: Store._get_bounded) and nested at most as deep as CPython's decoder
    recurses (sys.getrecursionlimit(), 1000 levels; a manifest has 5). A document nested
    deeper was exit 70 "RecursionError" and, under thawd, a cold start that blamed thawd
    (issue 30): it is ManifestError naming the document instead."""
    if len(data) > limit:
        raise ManifestError("(document)", f"{len(data)} bytes exceeds the {limit}-byte limit", source)
    try:
        return json.loads(data)
    except RecursionError:
        raise ManifestError("(document)", "nested too deeply to be a manifest", source) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ManifestError("(document)", f"not valid JSON: {str(e)[:200]}", source) from None


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
    need(ver in SCHEMA_VERSIONS, "schema_version",
         f"unknown version {ver}; this thaw reads versions {', '.join(map(str, SCHEMA_VERSIONS))} "
         "(upgrade thaw to read it)")
    known = {"schema", "schema_version", "key", "tuple", "tuple_hash", "chunking", "packs", "files", "size",
             "creator"} | ({"tenant", "encryption", "tag"} if ver >= 3 else set())
    for k in d:
        need(k in known, k, "unknown field")
    tenant, encryption = "", ""
    if ver >= 3:
        tenant = d.get("tenant")
        need(isinstance(tenant, str) and bool(_TENANT.match(tenant)), "tenant", "must be a tenant id")
        encryption = d.get("encryption", "")
        need(encryption in ("", keysmod.ENCRYPTION), "encryption",
             f"unknown encryption {encryption!r}; this thaw knows {keysmod.ENCRYPTION!r}")
        need(d.get("tag") is None or (isinstance(d["tag"], str) and bool(_HEX.match(d["tag"]))), "tag",
             "must be 64 lowercase hex digits")
    overhead = keysmod.SEALED_OVERHEAD if encryption else 0
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
    for k in ch:
        need(k in ("algorithm", "hash", "min", "avg", "max") + (("check",) if ver >= 2 else ()), f"chunking.{k}",
             "unknown field")
    if ver >= 3:
        need(key.startswith(tenant + "."), "key", f"{key!r} does not start with its tenant {tenant!r} and a '.'")
    # Version 2 always has the BLAKE3 checks; version 3 has them when "check" is there.
    has_check = ver == 2 or (ver >= 3 and "check" in ch)
    if has_check:
        need(ch.get("check") == CHECK, "chunking.check", f"must be {CHECK!r}, got {ch.get('check')!r}")
    width = 7 if has_check else 6
    for k in ("min", "avg", "max"):
        need(integer(ch.get(k)) and 0 < ch[k] <= MAX_CHUNK_BYTES, f"chunking.{k}",
             f"must be an integer in 1..{MAX_CHUNK_BYTES}")
    chunking = Chunking(ch["algorithm"], ch["min"], ch["avg"], ch["max"], check=CHECK if has_check else "")

    packs = d.get("packs")
    need(isinstance(packs, list) and all(isinstance(p, str) and bool(_HEX.match(p)) for p in packs),
         "packs", "must be a list of 64-hex-digit pack names")
    need(len(set(packs)) == len(packs), "packs", "lists a pack twice")
    locations: dict[str, Location] = {}
    checks: dict[str, str] = {}

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
            need(isinstance(c, list) and len(c) == width, cw,
                 "must be [sha256, length, pack index, offset in pack, stored length, codec"
                 + (", blake3]" if width == 7 else "]"))
            need(isinstance(c[0], str) and bool(_HEX.match(c[0])), f"{cw}[0]", "must be 64 lowercase hex digits")
            need(integer(c[1]) and 0 < c[1] <= MAX_CHUNK_BYTES, f"{cw}[1]",
                 f"must be an integer in 1..{MAX_CHUNK_BYTES}")
            need(integer(c[2]) and 0 <= c[2] < len(packs), f"{cw}[2]", f"pack index must be in 0..{len(packs) - 1}")
            need(integer(c[3]) and 0 <= c[3] < MAX_PACK_BYTES, f"{cw}[3]", "offset must be a non-negative integer")
            need(integer(c[4]) and overhead < c[4] <= MAX_CHUNK_BYTES + 1024 + overhead, f"{cw}[4]",
                 "stored length must be a positive integer" + (" above the sealing overhead" if overhead else ""))
            need(c[5] in CODECS, f"{cw}[5]", f"codec must be one of {', '.join(CODECS)}")
            need(c[5] != "none" or c[4] == c[1] + overhead, f"{cw}[4]",
                 "an uncompressed chunk is stored at its own length" + (" plus the sealing overhead" if overhead
                                                                         else ""))
            loc = Location(packs[c[2]], c[3], c[4], c[5])
            prev = locations.setdefault(c[0], loc)
            need(prev == loc, cw, "the same chunk appears with two different locations")
            check = ""
            if width == 7:
                need(isinstance(c[6], str) and bool(_HEX.match(c[6])), f"{cw}[6]", "must be 64 lowercase hex digits")
                check = c[6]
                need(checks.setdefault(c[0], check) == check, cw,
                     "the same chunk appears with two different blake3 checks")
            total += c[1]
            refs.append(ChunkRef(c[0], c[1], check))
        need(total == size, f"{where}.chunks",
             f"chunk lengths add up to {total} bytes, but {where}.size is {size}")
        out.append(FileEntry(name, size, tuple(refs)))
    total_size = sum(f.size for f in out)
    need(d.get("size") == total_size, "size", f"is {d.get('size')!r}, but the files add up to {total_size}")
    creator = d.get("creator", {})
    need(isinstance(creator, dict) and all(isinstance(k, str) and isinstance(v, (str, int, float))
                                           for k, v in creator.items()),
         "creator", "must map strings to strings or numbers")
    lengths: dict[str, int] = {}
    for f in out:
        for c in f.chunks:
            need(lengths.setdefault(c.hash, c.length) == c.length, f"files[{out.index(f)}].chunks",
                 f"chunk {c.hash[:16]} appears with two different lengths")
    return Manifest(key=key, tuple=tup, chunking=chunking, files=tuple(out), locations=locations,
                    creator=dict(creator), tenant=tenant, encryption=encryption)


# -- the integrity tag (issue 13) ------------------------------------------------------

_TENANT = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,46}[a-z0-9])?$")   # config.TENANT_PATTERN


def _canonical(d: dict) -> bytes:
    return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()


def _tag(d: dict, key: bytes) -> str:
    rest = {k: v for k, v in d.items() if k != "tag"}
    return hmac.new(key, keysmod.MANIFEST_TAG_LABEL + _canonical(rest), hashlib.sha256).hexdigest()


def sign(body: bytes, key: bytes) -> bytes:
    """A manifest's JSON with its integrity tag under the cluster's manifest key."""
    d = json.loads(body)
    d["tag"] = _tag(d, key)
    return (json.dumps(d, sort_keys=True, separators=(",", ":")) + "\n").encode()


def verify(body: bytes, key: bytes, source: str) -> None:
    """ManifestRefused unless `body` carries a valid tag under `key`. The tag covers
    the canonical form of the parsed document, the very fields `parse` builds
    the manifest from."""
    try:
        d = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ManifestRefused(source, "not JSON (or nested too deeply)") from None
    if not isinstance(d, dict) or not isinstance(d.get("tag"), str):
        raise ManifestRefused(source, "it carries no integrity tag: written by someone without this cluster's "
                              "manifest key (store.manifest_key_file), or by a thaw that signed nothing")
    if not hmac.compare_digest(d["tag"], _tag(d, key)):
        raise ManifestRefused(source, "its integrity tag does not verify under this cluster's manifest key "
                              "(store.manifest_key_file): it was altered, or written by someone without the key")
