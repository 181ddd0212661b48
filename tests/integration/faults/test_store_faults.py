"""Store faults an operator meets (issue 14 items 1 and 6), injected for real:
thaw-s3proxy (go/cmd/thaw-s3proxy) between the node and a real SeaweedFS,
pulls of real runsc checkpoint images through thaw-fetch.

thaw-fetch rides out the windows under the one retry policy of the one fetch
engine (go/internal/fetch/retry.go; thaw-gofer's stream follows it too:
tests/integration/faults/test_stream_faults.py). bench/faults_store.py runs
the 20-pull counts."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest

from control.errors import IntegrityError
from control.images import image as images
from control.images.store import Store
from tests.conftest import BUILD, require
from tests.integration.conftest import store_thaw

from .s3proxy import S3Proxy

WINDOW_S = 10   # issue 14: "survive a 10 s SlowDown or 5xx window"


# The CLI's tenant when it runs as root (tests/integration/test_store.py TENANT).
TENANT = "user-root"


def same_files(a: Path, b: Path) -> None:
    for f in sorted(a.iterdir()):
        assert (b / f.name).read_bytes() == f.read_bytes(), f.name


def push(s, image, key, node):
    return images.push(None, Store(s).for_tenant(TENANT), image, key, node, chunker=s.pack_chunker,
                       avg_chunk=s.pack_avg_chunk_bytes, workers=s.store_workers)


def pull(s, key, node, **kw):
    return images.pull(images.open_cache(s), Store(s).for_tenant(TENANT), key, node, workers=s.store_workers,
                       **kw)


def through(proxy: S3Proxy, s, scratch: Path, tag: str):
    """Another node (its own cache) whose store endpoint is the proxy."""
    return dataclasses.replace(s, store_endpoint=proxy.endpoint, cache_dir=scratch / f"cache-{tag}")


@pytest.fixture
def proxy(weed, scratch) -> S3Proxy:
    binary = BUILD / "thaw-s3proxy"
    require(binary.is_file(), f"thaw-s3proxy built at {binary} (ci/build-go.sh)")
    p = S3Proxy(binary, weed.endpoint, scratch / "s3proxy.log").start()
    yield p
    p.stop()


def test_boto3_and_presigned_urls_pass_through_the_proxy(settings, weed, proxy, scratch):
    """Signed requests reach SeaweedFS unchanged: boto3's PUT, ranged GET and
    LIST, and a presigned GET. boto3's signature covers the Host header (the
    proxy's address), which the proxy passes on as received: the same signed
    request sent straight to SeaweedFS (another Host) is refused. (SeaweedFS
    4.48 does not check the Host of presigned URLs; AWS S3 does.)"""
    s = dataclasses.replace(settings, store_endpoint=proxy.endpoint)
    store = Store(s).for_tenant(TENANT)
    body = bytes(range(256)) * 64
    pack = hashlib.sha256(body).hexdigest()
    store.put_pack(pack, body)
    got = store.client.get_object(Bucket=s.store_bucket, Key=store.pack_name(pack), Range="bytes=1000-1099")
    assert got["Body"].read() == body[1000:1100]
    listed = store.client.list_objects_v2(Bucket=s.store_bucket)["Contents"]
    assert [o["Key"] for o in listed] == [store.pack_name(pack)]
    url = store.presign_get(pack)
    assert url.startswith(proxy.endpoint)
    with urllib.request.urlopen(urllib.request.Request(url, headers={"Range": "bytes=0-9"}), timeout=10) as r:
        assert r.status == 206 and r.read() == body[:10]

    creds = store.client._request_signer._credentials.get_frozen_credentials()
    path = f"/{s.store_bucket}/{store.pack_name(pack)}"

    def signed_get(endpoint: str) -> int:
        req = AWSRequest(method="GET", url=proxy.endpoint + path)     # signed for the proxy's Host
        SigV4Auth(creds, "s3", s.store_region).add_auth(req)
        try:
            with urllib.request.urlopen(urllib.request.Request(endpoint + path, headers=dict(req.headers.items())),
                                        timeout=10) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
    assert signed_get(proxy.endpoint) == 200
    assert signed_get(weed.endpoint) == 403     # urllib sends SeaweedFS's own Host: the signature no longer holds
    assert proxy.stats()["forwarded"] >= 5


WINDOWS = {"slowdown-503": {"kind": "error", "status": 503},   # S3's <Code>SlowDown</Code>
           "bad-gateway-502": {"kind": "error", "status": 502}}  # a load balancer's, no S3 code


@pytest.mark.parametrize("window", WINDOWS)
def test_pull_rides_out_a_10s_window(window, settings, checkpoints, node, scratch, proxy):
    """Issue 14 item 1: a window of 10 s during which every GET of a pack gets
    503 SlowDown (or 502), opening at the pull's first pack GET, is ridden out
    with the default retry policy; the image arrives whole."""
    push(settings, checkpoints["runtime"], "user-root.wl", node)
    b = through(proxy, settings, scratch, "b")
    fid = proxy.add(**WINDOWS[window], duration_s=WINDOW_S, start="first", key="/packs/")
    t0 = time.monotonic()
    r = pull(b, "user-root.wl", node)
    took = time.monotonic() - t0
    r.lease.release()
    f = proxy.fault(fid)
    assert r.fill.engine == "thaw-fetch" and f["hits"] >= 1 and not f["active"], f
    assert took >= WINDOW_S and r.fill.retries >= 1
    same_files(checkpoints["runtime"], r.lease.path)


def test_outage_longer_than_the_budget_ends_in_one_line(settings, checkpoints, node, scratch, proxy):
    """An outage that outlasts the retry budget (30 s by default) ends the pull
    with one line naming the store, the object and how long it was tried
    (exit 69), and leaves no partial entry; other faults on the way (the
    manifest GET) are not involved: only packs fail."""
    push(settings, checkpoints["runtime"], "user-root.wl", node)
    b = through(proxy, settings, scratch, "b")
    fid = proxy.add(kind="error", status=503, start="first", key="/packs/")   # until removed
    t0 = time.monotonic()
    r = store_thaw(b, "pull", "user-root.wl", check=False)
    took = time.monotonic() - t0
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 69 and len(lines) == 1, r.stderr
    line = lines[0]
    assert proxy.endpoint in line and f"s3://{settings.store_bucket}/tenants/{TENANT}/packs/" in line and "SlowDown" in line, line
    m = re.search(r"gave up after (\d+) tries in (\d+\.\d) s \(retry policy: 3 retries or 30 s\)", line)
    assert m and 30 <= float(m.group(2)) < 32, line
    assert 30 <= took < 30 + 20, took
    assert proxy.fault(fid)["hits"] >= int(m.group(1))
    assert images.open_cache(b).entries() == [] and list((b.cache_dir / "tmp").iterdir()) == []
    proxy.remove(fid)
    r = pull(b, "user-root.wl", node)    # the store is back: the pull completes
    r.lease.release()
    same_files(checkpoints["runtime"], r.lease.path)


# -- integrity (issue 14 item 6) --------------------------------------------------------

def test_chunk_whose_sha256_name_is_wrong_is_refused(settings, checkpoints, node, scratch):
    """A manifest whose chunk's BLAKE3 matches the stored bytes but whose
    SHA-256 name does not: thaw-fetch once installed the chunk (it checked
    BLAKE3 only) and `thaw verify` then called the entry corrupt. It must be
    refused before anything is installed, naming the chunk."""
    push(settings, checkpoints["runtime"], "user-root.wl", node)
    store = Store(settings).for_tenant(TENANT)
    m = images.remote_manifest(store, "user-root.wl", node)
    key = store.manifest_name("user-root.wl", m.tuple_hash)
    doc = json.loads(store.client.get_object(Bucket=settings.store_bucket, Key=key)["Body"].read())
    assert doc["schema_version"] >= 2
    victim = doc["files"][-1]["chunks"][len(doc["files"][-1]["chunks"]) // 2]
    old, wrong = victim[0], hashlib.sha256(b"not " + victim[0].encode()).hexdigest()
    for f in doc["files"]:
        for c in f["chunks"]:
            if c[0] == old:
                c[0] = wrong   # its BLAKE3 (c[6]) still matches the bytes
    store.client.put_object(Bucket=settings.store_bucket, Key=key, Body=json.dumps(doc).encode())
    b = dataclasses.replace(settings, cache_dir=scratch / "cache-b")
    with pytest.raises(IntegrityError) as e:
        pull(b, "user-root.wl", node)
    assert e.value.chunk == wrong and "sha256" in str(e.value)
    assert images.open_cache(b).entries() == [] and list((b.cache_dir / "tmp").iterdir()) == []


def test_bytes_altered_in_transit_are_refused(settings, checkpoints, node, scratch, proxy):
    """One byte of one chunk flipped between the store and the node (the
    proxy's corrupt fault): the pull is refused naming that chunk, nothing is
    installed, and without the fault the same pull succeeds."""
    push(settings, checkpoints["runtime"], "user-root.wl", node)
    m = images.remote_manifest(Store(settings).for_tenant(TENANT), "user-root.wl", node)
    target = m.files[-1].chunks[len(m.files[-1].chunks) // 2]
    loc = m.locations[target.hash]
    b = through(proxy, settings, scratch, "b")
    fid = proxy.add(kind="corrupt", key=f"/packs/{loc.pack}$", offsets=[loc.offset + loc.stored // 2])
    with pytest.raises(IntegrityError) as e:
        pull(b, "user-root.wl", node)
    assert e.value.chunk == target.hash and proxy.fault(fid)["hits"] >= 1
    assert images.open_cache(b).entries() == [] and list((b.cache_dir / "tmp").iterdir()) == []
    proxy.remove(fid)
    r = pull(b, "user-root.wl", node)
    r.lease.release()
    same_files(checkpoints["runtime"], r.lease.path)
