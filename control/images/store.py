"""The object store: S3 through boto3.

Layout under the configured bucket and prefix (ARCHITECTURE.md, "Data"), for
each tenant under tenants/<tenant>/ (issue 13: `for_tenant`; a pack, a
pointer or a manifest of one tenant is never read or probed for another, so
there is no cross-tenant "does this chunk exist" answer):
    packs/<sha256>                       encoded chunks back to back (~32 MiB); named by
                                         the SHA-256 of their bytes; never rewritten
    chunks/<sha256>                      a chunk's pointer, content-addressed, shared by all
                                         images: an empty object whose metadata says where its
                                         bytes are (thaw-pack, -offset, -stored, -codec, -length);
                                         written after its pack, so it never points at nothing;
                                         an encrypting tenant's pointers are named by an HMAC
                                         under its key instead (keys.pointer_name)
    manifests/<key>/<tuple-hash>.json    an image; written last, with If-None-Match: *
                                         (sealed with the tenant's key when it encrypts)
    manifests/<key>/<tuple-hash>.order   the byte ranges restores of that image faulted on
                                         (control/images/stream.py): a fetch-order hint, never data

One object per chunk would be the plain content-addressed layout, but each
GET costs the store a metadata lookup: on SeaweedFS here 1 MiB objects came
back at 200-300 MB/s and 4-16 MiB ranges of 32 MiB objects at 0.8-1.3 GB/s
(docs/store.md). Packs keep chunk-level dedup and fetch in long ranges.

Endpoint, region and prefix come from thaw's settings; credentials the way
boto3 users give them (environment, shared credentials file, profile,
instance role), optionally with `store.profile` and `store.credentials_file`.
Every botocore failure becomes StoreError naming the operation and object.
"""

from __future__ import annotations

import copy
import logging
import re
from dataclasses import dataclass
from typing import Iterator

import boto3
import botocore.session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from control import metrics
from control.config import TENANT_PATTERN, Settings
from control.errors import ManifestError, StoreError, UserError
from control.images import keys as keysmod
from control.images.manifest import CODECS, MAX_MANIFEST_BYTES, Location
from control.images.retry import RetryPolicy

log = logging.getLogger(__name__)

_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
# A learned order (control/images/stream.py) is a hint of at most 4096 ranges a file: far below this.
MAX_ORDER_BYTES = 4 << 20


@dataclass(frozen=True)
class Obj:
    """One object as a listing or a HEAD shows it: its name under the store's prefix,
    size, the store's LastModified (seconds since the epoch, the store's clock) and,
    from a HEAD only, its user metadata."""
    name: str
    size: int
    mtime: float
    meta: dict | None = None


class Store:
    """One bucket (and key prefix) of an S3 endpoint."""

    def __init__(self, settings: Settings, *, bucket: str | None = None, prefix: str | None = None,
                 max_connections: int | None = None) -> None:
        self.endpoint = settings.store_endpoint
        self.bucket = bucket or settings.store_bucket
        p = settings.store_prefix if prefix is None else prefix
        self.prefix = (p.strip("/") + "/") if p.strip("/") else ""
        core = botocore.session.Session(profile=settings.store_profile or None)
        if settings.store_credentials_file is not None:
            core.set_config_variable("credentials_file", str(settings.store_credentials_file))
        session = boto3.Session(botocore_session=core)
        cfg = Config(
            region_name=settings.store_region,
            connect_timeout=settings.store_timeout_s, read_timeout=settings.store_timeout_s,
            retries={"max_attempts": settings.store_retries, "mode": "standard"},
            max_pool_connections=max_connections or max(10, settings.store_workers + 2),
            s3={"addressing_style": "path"} if self.endpoint else {},
            # Chunks are verified by SHA-256 against the manifest; a CRC on top
            # costs CPU on every byte and is only computed where S3 requires it.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        self.client = session.client("s3", endpoint_url=self.endpoint or None, config=cfg)
        # A pull's reads (manifests, listings) retry under thaw's own policy
        # (control/images/retry.py: botocore's standard mode plus a time budget, the
        # twin of go/internal/fetch's, which the pack GETs of thaw-fetch and
        # thaw-gofer follow: `policy.plan()` is their plan's "retry"), so botocore
        # must not retry them as well.
        self.policy = RetryPolicy.from_settings(settings)
        self.reader = session.client("s3", endpoint_url=self.endpoint or None,
                                     config=cfg.merge(Config(retries={"total_max_attempts": 1, "mode": "standard"})))
        self.fetcher = settings.store_fetcher   # thaw-fetch: transfer.fill's ranged reads, checks and writes
        self.timeout_s = settings.store_timeout_s
        self.presign_expires_s = settings.store_presign_expires_s
        self.gc_grace_s = settings.store_gc_grace_s   # a publish longer than this is refused (gc.py)
        self.tenant = ""                        # set by for_tenant
        self.tenant_key: bytes | None = None    # the tenant's key when it encrypts (never logged)
        self.manifest_key: bytes | None = None  # the cluster's manifest key, when configured

    def for_tenant(self, tenant: str, keyring: "keysmod.Keyring | None" = None) -> "Store":
        """This store as one tenant sees it: its own prefix (tenants/<tenant>/), its
        key when encryption is on (KeyMissing without one), the manifest key.
        Shares the S3 client."""
        if not re.fullmatch(TENANT_PATTERN, tenant or ""):
            raise UserError(f"tenant {tenant!r} is not a tenant id", field="tenant")
        view = copy.copy(self)
        view.prefix = f"{self.prefix}tenants/{tenant}/"
        view.tenant = tenant
        view.tenant_key = keyring.tenant_key(tenant) if keyring is not None else None
        view.manifest_key = keyring.manifest_key if keyring is not None else None
        return view

    def __repr__(self) -> str:   # never the keys
        return f"Store(s3://{self.bucket}/{self.prefix}, tenant={self.tenant!r}, encrypted={self.encrypted})"

    @property
    def encrypted(self) -> bool:
        return self.tenant_key is not None

    @property
    def encryption(self) -> str:
        """What a manifest published here says in its "encryption" field."""
        return keysmod.ENCRYPTION if self.tenant_key is not None else ""

    def chunk_key(self, h: str) -> bytes | None:
        """The key chunk `h` is sealed with in this tenant's packs, None when it does not encrypt."""
        return keysmod.chunk_key(self.tenant_key, h) if self.tenant_key is not None else None

    # -- names -------------------------------------------------------------

    def chunk_name(self, h: str) -> str:
        if self.tenant_key is not None:
            return f"{self.prefix}chunks/{keysmod.pointer_name(self.tenant_key, h)}"
        return f"{self.prefix}chunks/{h}"

    def manifest_name(self, key: str, tuple_hash: str) -> str:
        return f"{self.prefix}manifests/{key}/{tuple_hash}.json"

    def _fail(self, op: str, obj: str, e: Exception) -> StoreError:
        if isinstance(e, ClientError):
            err = e.response.get("Error", {})
            problem = f"{err.get('Code', '?')}: {err.get('Message', '')}".strip()
        else:
            problem = f"{type(e).__name__}: {e}"
        note = getattr(e, "retry_note", "")
        metrics.inc("thaw_store_errors_total", op=op)
        return StoreError(op, f"s3://{self.bucket}/{obj}", f"{problem}; {note}" if note else problem, self.endpoint)

    # -- bucket --------------------------------------------------------------

    def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist (S3-compatible test stores start empty)."""
        try:
            self.client.head_bucket(Bucket=self.bucket)
            return
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") not in _NOT_FOUND | {"NoSuchBucket"}:
                raise self._fail("head-bucket", "", e) from None
        except BotoCoreError as e:
            raise self._fail("head-bucket", "", e) from None
        try:
            self.client.create_bucket(Bucket=self.bucket)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise self._fail("create-bucket", "", e) from None
        except BotoCoreError as e:
            raise self._fail("create-bucket", "", e) from None

    # -- packs and chunk pointers ------------------------------------------------

    def pack_name(self, pack: str) -> str:
        return f"{self.prefix}packs/{pack}"

    def put_pack(self, pack: str, body: bytes) -> None:
        name = self.pack_name(pack)
        try:
            self.client.put_object(Bucket=self.bucket, Key=name, Body=body)
        except (ClientError, BotoCoreError) as e:
            raise self._fail("put", name, e) from None

    def presign_get(self, pack: str) -> str:
        """A URL that GETs a pack (any byte range) without credentials for
        store.presign_expires_s (or until temporary credentials expire).
        Signed locally by boto3, so endpoint, addressing and credentials stay configured
        the boto3 way for the Go fetch engine that uses it (go/internal/fetch: thaw-fetch,
        thaw-gofer stream)."""
        try:
            return self.client.generate_presigned_url("get_object", ExpiresIn=self.presign_expires_s,
                                                      Params={"Bucket": self.bucket, "Key": self.pack_name(pack)})
        except (ClientError, BotoCoreError) as e:
            raise self._fail("presign", self.pack_name(pack), e) from None

    def uri(self, name: str) -> str:
        return f"s3://{self.bucket}/{name}"

    def chunk_location(self, h: str) -> Location | None:
        """Where the store keeps chunk `h` (its pointer's metadata), None if it lacks it."""
        name = self.chunk_name(h)
        try:
            meta = self.client.head_object(Bucket=self.bucket, Key=name).get("Metadata", {})
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in _NOT_FOUND:
                return None
            raise self._fail("head", name, e) from None
        except BotoCoreError as e:
            raise self._fail("head", name, e) from None
        try:
            loc = Location(meta["thaw-pack"], int(meta["thaw-offset"]), int(meta["thaw-stored"]), meta["thaw-codec"])
        except (KeyError, ValueError):
            return None   # not a pointer thaw wrote: treat the chunk as absent and upload it again
        ok = len(loc.pack) == 64 and loc.offset >= 0 and loc.stored > 0 and loc.codec in CODECS
        # A pointer written before this tenant encrypted (or after it stopped) names
        # bytes sealed differently: upload the chunk again rather than mix the two.
        ok = ok and meta.get("thaw-encryption", "") == self.encryption
        return loc if ok else None

    def put_chunk_pointer(self, h: str, loc: Location, length: int) -> None:
        name = self.chunk_name(h)
        try:
            meta = {"thaw-pack": loc.pack, "thaw-offset": str(loc.offset), "thaw-stored": str(loc.stored),
                    "thaw-codec": loc.codec, "thaw-length": str(length)}
            if self.encryption:
                meta["thaw-encryption"] = self.encryption
            self.client.put_object(Bucket=self.bucket, Key=name, Body=b"", Metadata=meta)
        except (ClientError, BotoCoreError) as e:
            raise self._fail("put", name, e) from None

    # -- manifests ---------------------------------------------------------------

    def put_manifest_if_absent(self, key: str, tuple_hash: str, body: bytes) -> bool:
        """Publish a manifest unless one exists (If-None-Match: *). True if this call wrote it.

        S3 (since 2024-08) and SeaweedFS answer 412 PreconditionFailed to the
        loser of a race, so exactly one writer wins (docs/store.md).
        """
        name = self.manifest_name(key, tuple_hash)
        try:
            self.client.put_object(Bucket=self.bucket, Key=name, Body=body, IfNoneMatch="*",
                                   ContentType="application/json")
            return True
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code")
            if code in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                return False
            raise self._fail("put", name, e) from None
        except BotoCoreError as e:
            raise self._fail("put", name, e) from None

    def get_manifest(self, key: str, tuple_hash: str) -> bytes | None:
        """A manifest's bytes, None when there is none. ManifestError past MAX_MANIFEST_BYTES."""
        return self._get_bounded(self.manifest_name(key, tuple_hash), MAX_MANIFEST_BYTES, "manifest")

    def _get_bounded(self, name: str, cap: int, what: str) -> bytes | None:
        """An object of at most `cap` bytes, read so that no more than cap + 1 bytes ever
        arrive (issue 30: a 1.6 GB manifest was read whole before its size was checked,
        3.3 GB at the peak): a ranged GET of the first cap + 1 bytes, its body read to
        that bound. ManifestError (naming the object) when it is larger; None when absent."""
        def once() -> bytes:
            try:
                r = self.reader.get_object(Bucket=self.bucket, Key=name, Range=f"bytes=0-{cap}")
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") in ("InvalidRange", "416"):
                    return b""          # an empty object (a range of nothing)
                raise
            total = str(r.get("ContentRange") or "").rpartition("/")[2]
            if total.isdigit() and int(total) > cap:
                r["Body"].close()
                raise _TooLarge(int(total))
            body = r["Body"].read(cap + 1)
            r["Body"].close()
            if len(body) > cap:
                raise _TooLarge(len(body))
            return body
        try:
            return self.policy.call(once)
        except _TooLarge as e:
            raise ManifestError("(document)", f"{e.size} bytes or more: a {what} may have at most {cap} "
                                "(read no further)", self.uri(name)) from None
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in _NOT_FOUND:
                return None
            raise self._fail("get", name, e) from None
        except BotoCoreError as e:
            raise self._fail("get", name, e) from None

    def order_name(self, key: str, tuple_hash: str) -> str:
        """Beside the manifest, so it follows the manifest's naming (and any per-tenant
        prefix); not ending in .json, so list_manifests does not take it for one."""
        return self.manifest_name(key, tuple_hash).removesuffix(".json") + ".order"

    def get_order(self, key: str, tuple_hash: str) -> bytes | None:
        """The learned order's bytes, None when there is none; ManifestError past MAX_ORDER_BYTES."""
        return self._get_bounded(self.order_name(key, tuple_hash), MAX_ORDER_BYTES, "learned order")

    def put_order(self, key: str, tuple_hash: str, body: bytes) -> None:
        """Last writer wins: an order is a hint, merged by its writers (stream.py)."""
        name = self.order_name(key, tuple_hash)
        try:
            self.client.put_object(Bucket=self.bucket, Key=name, Body=body, ContentType="application/json")
        except (ClientError, BotoCoreError) as e:
            raise self._fail("put", name, e) from None

    # -- pod tables (control/thawd/podtables.py) -----------------------------------

    def pod_table_name(self, lookup: str, key: str) -> str:
        """One object per (lookup key, pod key): two versions of a workload keep both."""
        return f"{self.prefix}pods/{lookup}/{key}.json"

    def put_pod_table(self, lookup: str, key: str, body: bytes) -> None:
        """Last writer wins: a table says what its key's pods are made of, the same for every writer."""
        name = self.pod_table_name(lookup, key)
        try:
            self.policy.call(lambda: self.client.put_object(Bucket=self.bucket, Key=name, Body=body,
                                                            ContentType="application/json"))
        except (ClientError, BotoCoreError) as e:
            raise self._fail("put", name, e) from None

    def get_pod_table(self, lookup: str, key: str, max_bytes: int) -> bytes | None:
        """A pod table's bytes, read no further than `max_bytes` + 1 (a ranged GET: a
        larger object is never read whole); None when it does not exist."""
        name = self.pod_table_name(lookup, key)
        try:
            return self.policy.call(lambda: self.reader.get_object(
                Bucket=self.bucket, Key=name, Range=f"bytes=0-{max_bytes}")["Body"].read(max_bytes + 1))
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in _NOT_FOUND | {"InvalidRange"}:
                return None
            raise self._fail("get", name, e) from None
        except BotoCoreError as e:
            raise self._fail("get", name, e) from None

    def list_pod_tables(self, lookup: str, limit: int) -> list[tuple[str, float]]:
        """(pod key, last modified as a Unix time) of a lookup key's tables, newest first,
        at most `limit` (one listing page)."""
        base = f"{self.prefix}pods/{lookup}/"
        try:
            page = self.policy.call(lambda: self.reader.list_objects_v2(Bucket=self.bucket, Prefix=base,
                                                                        MaxKeys=1000))
        except (ClientError, BotoCoreError) as e:
            raise self._fail("list", base, e) from None
        out = [(o["Key"][len(base):].removesuffix(".json"), o["LastModified"].timestamp())
               for o in page.get("Contents", []) if o["Key"].endswith(".json") and "/" not in o["Key"][len(base):]]
        return sorted(out, key=lambda t: -t[1])[:limit]

    def list_manifests(self, key: str | None = None) -> Iterator[tuple[str, str, int]]:
        """(key, tuple_hash, bytes) of every manifest, or of one key's."""
        base = f"{self.prefix}manifests/" + (f"{key}/" if key else "")
        kw = {"Bucket": self.bucket, "Prefix": base}
        try:
            while True:   # one page (<= 1000 keys) in memory at a time, each retried under the policy
                page = self.policy.call(lambda: self.reader.list_objects_v2(**kw))
                for obj in page.get("Contents", []):
                    rest = obj["Key"][len(f"{self.prefix}manifests/"):]
                    k, _, leaf = rest.partition("/")
                    if leaf.endswith(".json") and "/" not in leaf:
                        yield k, leaf[:-len(".json")], int(obj["Size"])
                if not page.get("IsTruncated") or not page.get("NextContinuationToken"):
                    return
                kw["ContinuationToken"] = page["NextContinuationToken"]
        except (ClientError, BotoCoreError) as e:
            raise self._fail("list", base, e) from None

    def delete_bucket(self) -> None:
        """Empty and delete the bucket (tests and benchmarks clean up with this)."""
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError:
            return
        except BotoCoreError as e:
            raise self._fail("head-bucket", "", e) from None
        saved, self.prefix = self.prefix, ""
        try:
            self.delete_prefix("")
        finally:
            self.prefix = saved
        try:
            self.client.delete_bucket(Bucket=self.bucket)
        except (ClientError, BotoCoreError) as e:
            raise self._fail("delete-bucket", "", e) from None

    # -- plain objects (benchmarks compare against boto3's own transfer) ----------

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under `prefix` (relative to the store prefix); the count."""
        base = self.prefix + prefix
        n = 0
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base):
                objs = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                if objs:
                    self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": objs, "Quiet": True})
                    n += len(objs)
        except (ClientError, BotoCoreError) as e:
            raise self._fail("delete", base, e) from None
        return n

    # -- lifecycle: what control/images/gc.py lists, looks at and removes --------------

    def list_objects(self, under: str) -> Iterator[Obj]:
        """Every object under `under` (relative to the store prefix), with LastModified."""
        base = self.prefix + under
        try:
            pages = self.policy.call(lambda: list(self.reader.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=base)))
        except (ClientError, BotoCoreError) as e:
            raise self._fail("list", base, e) from None
        for page in pages:
            for o in page.get("Contents", []):
                yield Obj(o["Key"][len(self.prefix):], int(o["Size"]), o["LastModified"].timestamp())

    def list_dirs(self, under: str) -> list[str]:
        """The names one level below `under` (S3 common prefixes), e.g. the tenants."""
        base = self.prefix + under
        try:
            pages = self.policy.call(lambda: list(self.reader.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=base, Delimiter="/")))
        except (ClientError, BotoCoreError) as e:
            raise self._fail("list", base, e) from None
        return sorted(p["Prefix"][len(base):].rstrip("/") for page in pages for p in page.get("CommonPrefixes", []))

    def head(self, name: str) -> Obj | None:
        """An object under the store prefix with its metadata; None if it is not there."""
        full = self.prefix + name
        try:
            r = self.policy.call(lambda: self.reader.head_object(Bucket=self.bucket, Key=full))
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in _NOT_FOUND:
                return None
            raise self._fail("head", full, e) from None
        except BotoCoreError as e:
            raise self._fail("head", full, e) from None
        return Obj(name, int(r.get("ContentLength", 0)), r["LastModified"].timestamp(), r.get("Metadata", {}))

    def put_empty(self, name: str) -> None:
        full = self.prefix + name
        try:
            self.client.put_object(Bucket=self.bucket, Key=full, Body=b"")
        except (ClientError, BotoCoreError) as e:
            raise self._fail("put", full, e) from None

    def delete(self, names: list[str]) -> None:
        """Delete objects (names under the store prefix), up to 1000 a request; StoreError
        naming the first one the store refused. Deleting an absent object is no error (S3)."""
        for i in range(0, len(names), 1000):
            part = [{"Key": self.prefix + n} for n in names[i:i + 1000]]
            try:
                r = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": part, "Quiet": True})
            except (ClientError, BotoCoreError) as e:
                raise self._fail("delete", part[0]["Key"], e) from None
            errs = r.get("Errors") or []
            if errs:
                raise StoreError("delete", self.uri(errs[0].get("Key", "")),
                                 f"{errs[0].get('Code', '?')}: {errs[0].get('Message', '')} "
                                 f"({len(errs)} of {len(part)} refused)", self.endpoint)

    def clock(self) -> float:
        """The store's time now (its LastModified of an object written now: every age the GC
        compares is then in the store's clock, never this node's)."""
        self.put_empty("gc/clock")
        o = self.head("gc/clock")
        if o is None:
            raise StoreError("head", self.uri(self.prefix + "gc/clock"), "just written, yet absent", self.endpoint)
        return o.mtime

class _TooLarge(Exception):
    """A bounded read found more than its cap (Store._get_bounded); not retried."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size
