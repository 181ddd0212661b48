"""A stream filling the node cache (control/images/stream.py) through the real
thaw-gofer binary (`thaw-gofer stream`), with no runsc: packs are served over
HTTP from an in-memory store (ranged GETs of the presigned URLs the plan
names; tests/unit/fakes.py), so the Python plan, the Go engine and the cache's
install meet for real; thaw.json, which runsc does not read, is filled by the
real thaw-fetch first. What a sandbox reads through the gofer is tests/integration/test_stream.py's."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from control import config
from control.errors import ManifestRefused, UserError
from control.images import image as images
from control.images import stream as streammod
from control.images import transfer
from control.images.cache import Cache
from tests.conftest import BUILD
from tests.unit.fakes import TUPLE, FakeStore, layout

GOFER = BUILD / "thaw-gofer"


class HttpStore(FakeStore):
    """FakeStore (its packs served over HTTP on loopback) with the learned order's objects."""

    def __init__(self) -> None:
        super().__init__()
        self.orders: dict[str, bytes] = {}

    @property
    def encrypted(self) -> bool:
        return self.tenant_key is not None

    def order_name(self, key: str, th: str) -> str:
        return self.manifest_name(key, th).removesuffix(".json") + ".order"

    def get_order(self, key: str, th: str) -> bytes | None:
        return self.orders.get(self.order_name(key, th))

    def put_order(self, key: str, th: str, body: bytes) -> None:
        self.orders[self.order_name(key, th)] = body


@pytest.fixture
def store():
    return HttpStore()


@pytest.fixture
def settings(tmp_path) -> config.Settings:
    assert GOFER.is_file(), f"{GOFER} missing: run `make build`"
    (tmp_path / "empty.toml").write_text("")
    return config.load(environ={"THAW_NODE_STATE_DIR": str(tmp_path / "state"),
                                "THAW_NODE_LOG_DIR": str(tmp_path / "log"), "THAW_STORE_GOFER": str(GOFER),
                                "THAW_RUNSC_PATH": str(tmp_path / "no-runsc"), "THAW_STORE_RETRIES": "0",
                                "THAW_STORE_TIMEOUT_S": "5"},
                       config_file=tmp_path / "empty.toml")


def image_files(seed: int, pages: int = 1 << 20) -> dict[str, bytes]:
    """The files of a runsc image (what the sentry reads, and thaw.json, which it does not)."""
    rnd = random_bytes(seed, pages)
    return {"checkpoint.img": random_bytes(seed + 1, 70_000), "pages_meta.img": b"meta" * 600,
            "pages.img": rnd[:pages // 2] + bytes(64 << 10) + rnd[pages // 2:], "thaw.json": b'{"fake": 1}'}


def random_bytes(seed: int, n: int) -> bytes:
    import random
    return random.Random(seed).randbytes(n)


def publish(store: HttpStore, tmp_path: Path, key: str, files: dict[str, bytes]):
    """Upload the files' chunks (sealed when the store's tenant encrypts) and put the
    manifest as `thaw push` would (sealed and tagged as the tenant's settings say)."""
    d = tmp_path / f"src-{key}"
    d.mkdir()
    for n, data in files.items():
        (d / n).write_bytes(data)
    lay = layout(key, d, 16 << 10, TUPLE)
    locs, _ = transfer.upload(lay, d, store, workers=4)
    m = dataclasses.replace(lay, locations=locs, tenant=store.tenant, encryption=store.encryption)
    assert store.put_manifest_if_absent(key, m.tuple_hash, images._published_body(store, m))
    return m


def stream(cache: Cache, store, s, key: str) -> streammod.Stream:
    src = streammod.open_image(cache, store, s, key, TUPLE, lock_timeout_s=5)
    assert isinstance(src, streammod.Stream), src
    assert src.wait(60), "the stream did not end"
    return src


def test_stream_fills_the_cache_entry_as_a_pull_would(tmp_path, store, settings):
    files = image_files(1)
    view = store.for_tenant("user-root")
    publish(view, tmp_path, "user-root.app", files)
    cache = Cache(tmp_path / "cache", 1 << 30)
    st = stream(cache, view, settings, "user-root.app")
    assert st.error is None and st.entry_id, st.to_dict()
    [e] = cache.entries("user-root.app")
    assert e.state == "ready" and e.id == st.entry_id
    for name, data in files.items():
        assert (e.path / name).read_bytes() == data, name
    st.release()
    assert not st.path.exists(), "the stream's directory goes with its release"
    # The next start is a hit: a lease, nothing streams.
    hit = streammod.open_image(cache, view, settings, "user-root.app", TUPLE)
    assert not isinstance(hit, streammod.Stream) and hit.hit
    hit.release()


def test_another_tenants_key_is_refused_even_when_cached(tmp_path, store, settings):
    """open_image checks the key's tenant before the cache, as image.pull does: a
    cached entry of tenant A is no hit for tenant B's view of the store."""
    a = store.for_tenant("ctr-a")
    publish(a, tmp_path, "ctr-a.app", image_files(2))
    cache = Cache(tmp_path / "cache", 1 << 30)
    stream(cache, a, settings, "ctr-a.app").release()
    assert [e.state for e in cache.entries("ctr-a.app")] == ["ready"]
    with pytest.raises(UserError, match="is not tenant 'ctr-b''s"):
        streammod.open_image(cache, store.for_tenant("ctr-b"), settings, "ctr-a.app", TUPLE)


def test_why_a_miss_is_pulled_whole(tmp_path, store, settings):
    view = store.for_tenant("user-root")
    assert streammod.why_not(settings, view) == ""
    assert streammod.why_not(dataclasses.replace(settings, store_stream=False), view) == "store.stream is off"
    missing = dataclasses.replace(settings, store_gofer=tmp_path / "no-gofer")
    assert "thaw-gofer is not at" in streammod.why_not(missing, view)
    assert config.load(environ={}, default_file=Path(os.devnull)).store_stream is True, "on by default"


@pytest.fixture
def small_fs(tmp_path):
    """A 4 MiB tmpfs, named after the test; unmounted after."""
    import subprocess
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "thaw-stream-fill", str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_cache_ends_the_stream_in_no_space_and_no_entry(tmp_path, store, settings, small_fs):
    """ENOSPC while thaw-gofer fills the partial (an 8 MiB image, a 4 MiB file
    system): the Stream's error is NoSpace naming the cache, as a pull's (exit 4),
    the partial is gone and the cache lists nothing."""
    from control.errors import NoSpace
    view = store.for_tenant("user-root")
    publish(view, tmp_path, "user-root.big", image_files(3, pages=8 << 20))
    cache = Cache(small_fs / "cache", 1 << 30)
    st = stream(cache, view, settings, "user-root.big")
    assert isinstance(st.error, NoSpace), st.error
    assert str(cache.root) in str(st.error) and "user-root.big" in str(st.error)
    st.release()
    assert cache.entries() == [] and list((cache.root / "tmp").iterdir()) == []
    streams = cache.root / streammod.STREAMS_DIR
    assert not streams.exists() or list(streams.iterdir()) == []


def test_an_encrypting_tenants_image_streams_decrypted_and_verified(tmp_path, store, settings):
    """issue 13 x issue 18: every chunk sealed with the tenant's key (Python's
    keys.seal_chunk); thaw-gofer opens each with the chunk key the plan carries,
    checks its SHA-256 name, and the entry is the plaintext image, as a pull's."""
    key_bytes = os.urandom(32)
    view = store.for_tenant("ctr-enc", key_bytes)
    files = image_files(4)
    publish(view, tmp_path, "ctr-enc.app", files)
    packs = [body for name, body in store.objects.items() if "/packs/" in name]
    assert packs and not any(files["checkpoint.img"][:4096] in body for body in packs), "the store holds no plaintext"
    assert streammod.why_not(settings, view) == "", "an encrypting tenant streams too"
    cache = Cache(tmp_path / "cache", 1 << 30)
    st = stream(cache, view, settings, "ctr-enc.app")
    assert st.error is None, st.error
    [e] = cache.entries("ctr-enc.app")
    for name, data in files.items():
        assert (e.path / name).read_bytes() == data, name
    st.release()
    # With another key the manifest does not open: refused before a chunk is asked for
    # (a chunk that does not open: go/internal/stream TestStreamRefusesASealedChunkThatDoesNotOpen).
    with pytest.raises(ManifestRefused):
        streammod.open_image(Cache(tmp_path / "cache2", 1 << 30), store.for_tenant("ctr-enc", os.urandom(32)),
                             settings, "ctr-enc.app", TUPLE)


def test_an_encrypting_tenants_learned_order_is_sealed(tmp_path, store):
    """The ranges a workload faulted on say what memory it touches first: an
    encrypting tenant's order object is sealed with its key, and one that is not
    (or does not open) is ignored: it is only a hint."""
    from control.images import keys as keysmod
    view = store.for_tenant("ctr-enc", os.urandom(32))
    m = publish(view, tmp_path, "ctr-enc.app", image_files(5))
    streammod.record_order(view, m, {"pages.img": [[4096, 8192], [1 << 20, 4096]]})
    [body] = store.orders.values()
    assert body.startswith(keysmod.SEALED_ORDER_MAGIC) and b"pages.img" not in body
    assert streammod.read_order(view, m) == {"pages.img": [[4096, 8192], [1 << 20, 4096]]}
    assert streammod.read_order(store.for_tenant("ctr-enc", os.urandom(32)), m) == {}, "another key: no order"
    store.orders[next(iter(store.orders))] = b'{"schema": "thaw.order", "version": 1, "files": {"pages.img": [[0, 1]]}}'
    assert streammod.read_order(view, m) == {}, "a plaintext order under an encrypting tenant is not used"
