"""Fakes for the store's unit tests: an in-memory store and images chunked in Python."""
from __future__ import annotations

import copy
import hashlib
import threading
from pathlib import Path

from control.images import keys as keysmod

from control.node.compat import CompatTuple
from control.errors import StoreError
from control.images.manifest import ChunkRef, Chunking, FileEntry, Location, Manifest

TUPLE = CompatTuple(runsc_version="thaw-gvisor-test", platform="systrap", arch="x86_64",
                    cpu_features=("avx2", "sse4_2"), gpu_product="", gpu_count=0, driver_version="",
                    cuda_driver_version="", machine_type="test")


def layout(key: str, directory: Path, chunk: int = 4096, tup: CompatTuple = TUPLE) -> Manifest:
    """A manifest (without locations) of every file in `directory`, fixed-size chunks."""
    files = []
    for p in sorted(directory.iterdir()):
        data = p.read_bytes()
        refs = tuple(ChunkRef(hashlib.sha256(data[i:i + chunk]).hexdigest(), len(data[i:i + chunk]))
                     for i in range(0, len(data), chunk))
        files.append(FileEntry(p.name, len(data), refs))
    return Manifest(key=key, tuple=tup, chunking=Chunking("fixed-test", chunk, chunk, chunk), files=tuple(files))


class FakeStore:
    """The parts of control.images.store.Store that transfer and images use, in memory."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.meta: dict[str, dict] = {}
        self.gets = 0
        self.fail_gets = False
        self.lock = threading.Lock()
        self.endpoint = "fake://"
        self.fetcher = None        # in-process fills, unless a test points it at a fetcher
        self.retries = 1
        self.retry_budget_s = 0.0
        self.timeout_s = 1.0
        self.prefix = ""
        self.tenant = ""
        self.tenant_key: bytes | None = None
        self.manifest_key: bytes | None = None
        self.heads: list[str] = []   # every pointer name asked about (chunk_location)

    def for_tenant(self, tenant: str, tenant_key=None, manifest_key: bytes | None = None):
        """A view with Store.for_tenant's naming and keys over the same objects;
        `tenant_key` may be a keys.Keyring, as Store.for_tenant takes."""
        if isinstance(tenant_key, keysmod.Keyring):
            tenant_key, manifest_key = tenant_key.tenant_key(tenant), tenant_key.manifest_key
        view = copy.copy(self)
        view.prefix, view.tenant = f"tenants/{tenant}/", tenant
        view.tenant_key, view.manifest_key = tenant_key, manifest_key
        return view

    @property
    def encryption(self) -> str:
        return keysmod.ENCRYPTION if self.tenant_key is not None else ""

    def chunk_key(self, h: str) -> bytes | None:
        return keysmod.chunk_key(self.tenant_key, h) if self.tenant_key is not None else None

    def chunk_name(self, h: str) -> str:
        if self.tenant_key is not None:
            return f"{self.prefix}chunks/{keysmod.pointer_name(self.tenant_key, h)}"
        return f"{self.prefix}chunks/{h}"

    def pack_name(self, p: str) -> str:
        return f"{self.prefix}packs/{p}"

    def manifest_name(self, key: str, th: str) -> str:
        return f"{self.prefix}manifests/{key}/{th}.json"

    def ensure_bucket(self) -> None:
        pass

    def presign_get(self, p: str) -> str:
        return f"http://fake.invalid/{self.pack_name(p)}"

    def uri(self, name: str) -> str:
        return f"s3://fake/{name}"

    def put_pack(self, p: str, body: bytes) -> None:
        self.objects[self.pack_name(p)] = body

    def get_range_into(self, p: str, offset: int, buf: memoryview) -> None:
        with self.lock:
            self.gets += 1
        if self.fail_gets:
            raise StoreError("get", self.pack_name(p), "connection refused")
        data = self.objects[self.pack_name(p)][offset:offset + len(buf)]
        if len(data) != len(buf):
            raise StoreError("get", self.pack_name(p), "short")
        buf[:] = data

    def chunk_location(self, h: str) -> Location | None:
        self.heads.append(self.chunk_name(h))
        m = self.meta.get(self.chunk_name(h))
        return None if m is None else Location(m["pack"], m["offset"], m["stored"], m["codec"])

    def put_chunk_pointer(self, h: str, loc: Location, length: int) -> None:
        self.objects[self.chunk_name(h)] = b""
        self.meta[self.chunk_name(h)] = {"pack": loc.pack, "offset": loc.offset, "stored": loc.stored,
                                         "codec": loc.codec}

    def put_manifest_if_absent(self, key: str, th: str, body: bytes) -> bool:
        with self.lock:
            name = self.manifest_name(key, th)
            if name in self.objects:
                return False
            self.objects[name] = body
            return True

    def get_manifest(self, key: str, th: str) -> bytes | None:
        return self.objects.get(self.manifest_name(key, th))

    def list_manifests(self, key: str | None = None):
        base = f"{self.prefix}manifests/"
        for name, body in sorted(self.objects.items()):
            if name.startswith(base + (f"{key}/" if key else "")):
                k, leaf = name[len(base):].split("/")
                yield k, leaf[:-len(".json")], len(body)
