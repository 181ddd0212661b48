"""Fakes for the store's unit tests: an in-memory store and images chunked in Python.

The store's packs are also served over HTTP on loopback, as presigned GETs, so
that a fill runs the one fetch engine, the real thaw-fetch (`make build`), as
every pull does: there is no other (issue 27 item 5)."""
from __future__ import annotations

import copy
import hashlib
import secrets
import threading
import weakref
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from control.images import keys as keysmod
from control.images.retry import RetryPolicy
from tests.conftest import BUILD

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


class Objects(dict):
    """A store's objects by name, and what its HTTP face was asked (shared by its tenant views)."""

    def __init__(self) -> None:
        super().__init__()
        self.token = secrets.token_hex(8)
        self.gets = 0              # ranged pack GETs served
        self.fail_gets = False     # answer them 500 InternalError (retryable: retried, then given up)
        self.fail_next_gets = 0    # answer only the next n of them so (a transient failure: retried)
        self.lock = threading.Lock()


class _PackServer:
    """One loopback HTTP server for every FakeStore of the test session: GET
    /<token>/<name> with a Range header, as a presigned pack GET of S3."""

    def __init__(self) -> None:
        self.stores: weakref.WeakValueDictionary[str, Objects] = weakref.WeakValueDictionary()
        stores = self.stores

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                token, _, name = self.path.lstrip("/").partition("/")
                objs = stores.get(token)
                failing = False
                if objs is not None:
                    with objs.lock:
                        objs.gets += 1
                        failing = objs.fail_gets or objs.fail_next_gets > 0
                        objs.fail_next_gets = max(0, objs.fail_next_gets - 1)
                body = objs.get(name) if objs is not None else None
                if failing:
                    return self._send(500, b"<Error><Code>InternalError</Code><Message>fake store says no"
                                           b"</Message></Error>")
                if body is None:
                    return self._send(404, b"<Error><Code>NoSuchKey</Code></Error>")
                a, _, b = self.headers["Range"].removeprefix("bytes=").partition("-")
                self._send(206, body[int(a):int(b) + 1])

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.srv.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.srv.server_port}"
        threading.Thread(target=self.srv.serve_forever, name="fake-store-http", daemon=True).start()


_server: _PackServer | None = None
_server_lock = threading.Lock()


def pack_server() -> _PackServer:
    global _server
    with _server_lock:
        if _server is None:
            _server = _PackServer()
        return _server


class FakeStore:
    """The parts of control.images.store.Store that transfer and images use, in memory."""

    def __init__(self) -> None:
        self.objects = Objects()
        self.meta: dict[str, dict] = {}
        self.lock = threading.Lock()
        self.endpoint = "fake://"
        self.fetcher = BUILD / "thaw-fetch"   # the one fetch engine (a test may point it elsewhere)
        self.policy = RetryPolicy(max_attempts=1, budget_s=0.0)
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

    @property
    def gets(self) -> int:
        return self.objects.gets

    @property
    def fail_gets(self) -> bool:
        return self.objects.fail_gets

    @fail_gets.setter
    def fail_gets(self, v: bool) -> None:
        self.objects.fail_gets = v

    def presign_get(self, p: str) -> str:
        srv = pack_server()
        srv.stores[self.objects.token] = self.objects
        return f"{srv.url}/{self.objects.token}/{self.pack_name(p)}"

    def uri(self, name: str) -> str:
        return f"s3://fake/{name}"

    def put_pack(self, p: str, body: bytes) -> None:
        self.objects[self.pack_name(p)] = body

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
