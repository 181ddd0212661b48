"""The object store: S3 through boto3.

Layout under the configured bucket and prefix (ARCHITECTURE.md, "Data"):
    chunks/<sha256>                      a chunk, content-addressed, shared by all images;
                                         metadata thaw-codec (none|zlib), thaw-length (raw bytes)
    manifests/<key>/<tuple-hash>.json    an image; written last, with If-None-Match: *

Endpoint, region and prefix come from thaw's settings; credentials the way
boto3 users give them (environment, shared credentials file, profile,
instance role), optionally with `store.profile` and `store.credentials_file`.
Every botocore failure becomes StoreError naming the operation and object.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterator

import boto3
import botocore.session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from control.config import Settings
from control.errors import StoreError

log = logging.getLogger(__name__)

_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}


@dataclass(frozen=True)
class ChunkObject:
    codec: str
    payload: bytes
    length: int | None   # raw length recorded at upload (None if the object lacks it)


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

    # -- names -------------------------------------------------------------

    def chunk_name(self, h: str) -> str:
        return f"{self.prefix}chunks/{h}"

    def manifest_name(self, key: str, tuple_hash: str) -> str:
        return f"{self.prefix}manifests/{key}/{tuple_hash}.json"

    def _fail(self, op: str, obj: str, e: Exception) -> StoreError:
        if isinstance(e, ClientError):
            err = e.response.get("Error", {})
            problem = f"{err.get('Code', '?')}: {err.get('Message', '')}".strip()
        else:
            problem = f"{type(e).__name__}: {e}"
        return StoreError(op, f"s3://{self.bucket}/{obj}", problem, self.endpoint)

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

    # -- chunks ----------------------------------------------------------------

    def has_chunk(self, h: str) -> bool:
        name = self.chunk_name(h)
        try:
            self.client.head_object(Bucket=self.bucket, Key=name)
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in _NOT_FOUND:
                return False
            raise self._fail("head", name, e) from None
        except BotoCoreError as e:
            raise self._fail("head", name, e) from None

    def put_chunk(self, h: str, codec: str, payload: bytes, length: int) -> None:
        name = self.chunk_name(h)
        try:
            self.client.put_object(Bucket=self.bucket, Key=name, Body=payload,
                                   Metadata={"thaw-codec": codec, "thaw-length": str(length)})
        except (ClientError, BotoCoreError) as e:
            raise self._fail("put", name, e) from None

    def get_chunk(self, h: str) -> ChunkObject:
        name = self.chunk_name(h)
        try:
            r = self.client.get_object(Bucket=self.bucket, Key=name)
            payload = r["Body"].read()
        except (ClientError, BotoCoreError) as e:
            raise self._fail("get", name, e) from None
        meta = r.get("Metadata", {})
        length = meta.get("thaw-length")
        return ChunkObject(codec=meta.get("thaw-codec", "none"), payload=payload,
                           length=int(length) if length and length.isdigit() else None)

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
        name = self.manifest_name(key, tuple_hash)
        try:
            return self.client.get_object(Bucket=self.bucket, Key=name)["Body"].read()
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in _NOT_FOUND:
                return None
            raise self._fail("get", name, e) from None
        except BotoCoreError as e:
            raise self._fail("get", name, e) from None

    def list_manifests(self, key: str | None = None) -> Iterator[tuple[str, str, int]]:
        """(key, tuple_hash, bytes) of every manifest, or of one key's."""
        base = f"{self.prefix}manifests/" + (f"{key}/" if key else "")
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base):
                for obj in page.get("Contents", []):
                    rest = obj["Key"][len(f"{self.prefix}manifests/"):]
                    k, _, leaf = rest.partition("/")
                    if leaf.endswith(".json") and "/" not in leaf:
                        yield k, leaf[:-len(".json")], int(obj["Size"])
        except (ClientError, BotoCoreError) as e:
            raise self._fail("list", base, e) from None

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
