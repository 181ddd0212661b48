"""A streamed restore, for real (issue 18): a runsc checkpoint of a server
holding 256 MB of random bytes, published to SeaweedFS, restored on a node
with an empty cache through thaw-gofer as runsc's checkpoint-gofer while the
store is throttled by thaw-s3proxy, so the image is still arriving when the
server answers. The answer must come from the checkpoint's memory (same boot
id, the same SHA-256 over all 256 MB recomputed from live memory), the image
must end up in the cache as after a pull, and a second node must learn the
faulted ranges."""
from __future__ import annotations

import dataclasses
import json

import pytest

from control.images import stream as streammod
from control.images.store import Store
from tests.conftest import BUILD, require
from tests.integration.faults.s3proxy import S3Proxy

from . import streamed

MB = 256
RATE = 40 << 20   # bytes/s: the ~270 MB image needs ~7 s, the first answer far less


@pytest.fixture
def proxy(weed, scratch) -> S3Proxy:
    binary = BUILD / "thaw-s3proxy"
    require(binary.is_file(), f"thaw-s3proxy built at {binary} (ci/build-go.sh)")
    require((BUILD / "thaw-gofer").is_file(), f"thaw-gofer built at {BUILD / 'thaw-gofer'} (ci/build-go.sh)")
    p = S3Proxy(binary, weed.endpoint, scratch / "s3proxy.log").start()
    yield p
    p.stop()


def node(settings, proxy, scratch, tag):
    """Another node: its own empty cache, the store behind the proxy."""
    return dataclasses.replace(settings, store_endpoint=proxy.endpoint, cache_dir=scratch / f"cache-{tag}")


def test_streamed_restore_answers_from_the_checkpoints_memory_while_the_image_arrives(
        base, name, settings, proxy, scratch):
    key = f"user-root.{name}"   # the CLI's tenant (issue 13): keys carry it
    before = streamed.publish(streamed.env_for(base, settings), key, f"{name}-src", MB, scratch)
    host = before["host"]
    b = node(settings, proxy, scratch, "b")
    env = streamed.env_for(base, b, THAW_STORE_STREAM=1, THAW_STORE_STREAM_DEADLINE_S=60)
    proxy.add(kind="throttle", rate_bps=RATE)

    p = streamed.start(env, "restore", "--from-store", key, "--id", f"{name}-r", "--json")
    try:
        try:
            answer, t_first = streamed.first_answer(host, 120, restoring=p)
        except streamed.NoAnswer as e:   # what `thaw restore` said is the reason: show it
            p.kill()
            raise AssertionError(f"{e}; thaw restore said: {p.communicate()[1][-3000:]}") from None
        still_streaming = p.poll() is None   # the command returns only once the image is all in
        out, err = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err
    r = json.loads(out)
    assert answer["boot"] == before["boot"] and answer["digest"] == before["digest"]
    assert still_streaming, f"the first answer ({t_first:.2f} s) came only after the stream ended"
    assert r["source"] == "stream" and r["mode"] == "restored"
    st = r["stream"]
    assert st["error"] is None and st["entry"], st
    assert st["stats"]["peers"] >= 1 and st["stats"]["fetched_chunks"] == st["stats"]["chunks"], st
    # Every page of the 256 MB block, hashed from the restored sandbox's live memory.
    assert streamed.get(host, "/sum", 120)["digest"] == before["digest"]
    # The gofer made reads wait for bytes that had not arrived, and none failed.
    log = streamed.gofer_logs(base)
    assert " fault pages.img+" in log and " 0 failed" in log, log[-3000:]
    assert " 0 waited " not in log, log[-3000:]

    # The cache holds the image as after a pull: a pull is a hit, nothing half-made is left.
    state = streamed.cache_state(b.cache_dir, key)
    assert len(state["ready"]) == 1 and state["partials"] == [] and state["streams"] == [], state
    pulled = streamed.run(env, "pull", key, "--json")
    assert pulled.returncode == 0 and json.loads(pulled.stdout)["hit"] is True, pulled.stderr
    # The faulted ranges are recorded beside the manifest.
    from control.node.compat import node_tuple
    order = Store(b).for_tenant("user-root").get_order(key, node_tuple(b).hash())
    assert order is not None and json.loads(order)["files"].get(streammod.PAGES), order
    assert streamed.run(env, "delete", f"{name}-r", "--force").returncode == 0

    # A second start on this node restores from the cache.
    r2 = streamed.run(env, "restore", "--from-store", key, "--id", f"{name}-s", "--json")
    assert r2.returncode == 0, r2.stderr
    assert json.loads(r2.stdout)["source"] == "cache"
    assert streamed.get(host, "/ping")["boot"] == before["boot"]
    assert streamed.run(env, "delete", f"{name}-s", "--force").returncode == 0

    # A third node streams with the learned order: those ranges are fetched first.
    c = node(settings, proxy, scratch, "c")
    env_c = streamed.env_for(base, c, THAW_STORE_STREAM=1, THAW_STORE_STREAM_DEADLINE_S=60)
    r3 = streamed.run(env_c, "restore", "--from-store", key, "--id", f"{name}-t", "--json")
    assert r3.returncode == 0, r3.stderr
    st3 = json.loads(r3.stdout)["stream"]
    assert st3["learned_ranges"] > 0 and st3["error"] is None, st3
    assert streamed.get(host, "/sum", 120)["digest"] == before["digest"]
    assert streamed.run(env_c, "delete", f"{name}-t", "--force").returncode == 0
