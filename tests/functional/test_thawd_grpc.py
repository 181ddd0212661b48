"""thawd's gRPC surface on a real Unix socket: validation, error conversion in
one place, and one bad request harming no other. The image source is a fake
(this tier runs no runsc and no store)."""
from __future__ import annotations

import os
import stat
import threading
import time

import grpc
import pytest

from control import config

from control.thawd import server as daemon
from control.thawd.rpc import thawd_pb2 as pb
from runsc_hooks import spec as specmod


class NoImages:
    def pull(self, key):
        from control.errors import NotFound
        raise NotFound("image", key)

    def has(self, key):
        return False

    def entries(self):
        return []

    def evict(self, key):
        return False

    def store_for(self, key):
        return None


@pytest.fixture
def thawd(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("thawd's socket directory is root-only: run the tests as root", pytrace=False)
    (tmp_path / "empty.toml").write_text("")
    s = config.load(environ={"THAW_NODE_STATE_DIR": str(tmp_path / "state"),
                             "THAW_THAWD_SOCKET": str(tmp_path / "run" / "thawd.sock"),
                             "THAW_THAWD_METRICS_ADDR": ""}, config_file=tmp_path / "empty.toml")
    server, t, _ = daemon.build(s, NoImages(), "tuplehash")
    server.start()
    ch = grpc.insecure_channel(f"unix:{s.thawd_socket}")
    from control.thawd.rpc import thawd_pb2_grpc as pbg
    yield pbg.ThawdStub(ch), s, tmp_path
    ch.close()
    server.stop(0)
    t.close()


def test_socket_directory_is_root_only(thawd):
    _, s, _ = thawd
    assert stat.S_IMODE(os.stat(s.thawd_socket.parent).st_mode) == 0o700
    assert stat.S_ISSOCK(os.stat(s.thawd_socket).st_mode)


def test_bad_requests_get_the_mapped_status_and_the_server_keeps_serving(thawd):
    stub, _, tmp = thawd
    with pytest.raises(grpc.RpcError) as e:
        stub.PrepareRestore(pb.PrepareRestoreRequest(runtime=pb.Runtime(container_id="../x", bundle="/b",
                                                                        runsc_root="/r")), timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "container_id" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:  # a bundle without config.json: SpecError -> INVALID_ARGUMENT
        stub.PrepareRestore(pb.PrepareRestoreRequest(runtime=pb.Runtime(container_id="c1", bundle=str(tmp),
                                                                        runsc_root="/r")), timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "config.json" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        stub.ReportOutcome(pb.ReportOutcomeRequest(runtime=pb.Runtime(container_id="c1", bundle="/b",
                                                                      runsc_root="/r")), timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "outcome" in e.value.details()
    h = stub.Health(pb.HealthRequest(), timeout=5)
    assert h.ok and h.tuple_hash == "tuplehash"


def test_prepare_answers_cold_with_a_reason(thawd):
    stub, _, tmp = thawd
    plain = specmod.Bundle(tmp / "plain")
    plain.write(specmod.command_spec(["/bin/true"], rootfs="rootfs"))
    r = stub.PrepareRestore(pb.PrepareRestoreRequest(runtime=pb.Runtime(
        container_id="c1", bundle=str(plain.path), runsc_root="/r")), timeout=5)
    assert (r.decision, r.reason) == (pb.PrepareRestoreResponse.COLD, "not-opted-in")
    opted = specmod.Bundle(tmp / "opted")
    opted.write(specmod.command_spec(["/bin/true"], rootfs="rootfs", annotations={"thaw.dev/workload": "w"}))
    r = stub.PrepareRestore(pb.PrepareRestoreRequest(runtime=pb.Runtime(
        container_id="c2", bundle=str(opted.path), runsc_root="/r")), timeout=5)
    # An opted-in container whose runsc root is not <containerd.runsc_root>/<namespace>:
    # nobody can tell whose it is, so it starts cold and gets no key (issue 13).
    assert r.decision == pb.PrepareRestoreResponse.COLD and r.workload_key == ""
    assert r.reason.startswith("identity-unknown: runsc root /r is not <containerd.runsc_root>/<namespace>")
    assert stub.Stats(pb.StatsRequest(), timeout=5).counters[
        'thaw_cold_decisions_total{reason="identity-unknown"}'] == 1


def test_subcontainer_restored_is_only_for_a_pods_app_container(thawd):
    """The stand-in runs `runsc restore` itself for a pod's app container and says
    so (control/thawd/pods.py); any other container's Restore must not claim it."""
    stub, _, tmp = thawd
    lone = specmod.Bundle(tmp / "lone")
    lone.write(specmod.command_spec(["/bin/true"], rootfs="rootfs", annotations={"thaw.dev/workload": "w"}))
    with pytest.raises(grpc.RpcError) as e:
        stub.Restore(pb.RestoreRequest(runtime=pb.Runtime(container_id="c1", bundle=str(lone.path), runsc_root="/r"),
                                       subcontainer_restored=True), timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "subcontainer_restored" in e.value.details()
    member = specmod.Bundle(tmp / "member")
    member.write(specmod.command_spec(["/bin/true"], rootfs="rootfs", annotations={
        "thaw.dev/workload": "w", "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.sandbox-id": "s1", "io.kubernetes.cri.container-name": "app"}))
    rt = pb.Runtime(container_id="c2", bundle=str(member.path), runsc_root="/r")
    with pytest.raises(grpc.RpcError) as e:
        stub.Restore(pb.RestoreRequest(runtime=rt), timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # A member of a pod thawd does not know (thawd restarted): not restored, with the reason.
    r = stub.Restore(pb.RestoreRequest(runtime=rt, subcontainer_restored=True), timeout=5)
    assert not r.restored and "no restoring pod" in r.detail
    p = stub.PrepareRestore(pb.PrepareRestoreRequest(runtime=rt), timeout=5)
    assert p.decision == pb.PrepareRestoreResponse.COLD and p.reason.startswith("pod-unknown")


def test_stats_answers_what_each_container_decided_and_why(thawd):
    stub, _, tmp = thawd
    plain = specmod.Bundle(tmp / "plain")
    plain.write(specmod.command_spec(["/bin/true"], rootfs="rootfs"))
    for cid in ("d1", "d2", "d1"):
        stub.PrepareRestore(pb.PrepareRestoreRequest(runtime=pb.Runtime(
            container_id=cid, bundle=str(plain.path), runsc_root="/r")), timeout=5)
    assert list(stub.Stats(pb.StatsRequest(), timeout=5).decisions) == []     # only when asked
    rows = stub.Stats(pb.StatsRequest(decisions=10), timeout=5).decisions
    assert [(r.container_id, r.decision, r.reason) for r in rows] == [
        ("d1", "cold", "not-opted-in"), ("d2", "cold", "not-opted-in"), ("d1", "cold", "not-opted-in")]
    assert all(r.time > 0 and r.seconds >= 0 for r in rows)
    mine = stub.Stats(pb.StatsRequest(decisions=1, container_id="d1"), timeout=5).decisions
    assert [r.container_id for r in mine] == ["d1"]
    from control.thawd.client import Client
    _, s, _ = thawd
    with Client(s) as c:
        d = c.stats(decisions=5, container="d2")
    assert [(r["container"], r["decision"]) for r in d["decisions"]] == [("d2", "cold")]


class CachedImages(NoImages):
    """An image source over a real node cache holding one entry, leased by a parked sandbox."""

    def __init__(self, root) -> None:
        from control.images import image as images
        from control.images.cache import Cache
        from tests.unit.fakes import FakeStore
        from tests.unit.fakes import TUPLE
        from tests.unit.test_cache import image, publish
        self.cache = Cache(root / "cache", 1 << 30)
        store = FakeStore()
        publish(store, root, "ctr-t.w.0123456789abcdef", image(5))
        self.lease = images.pull(self.cache, store, "ctr-t.w.0123456789abcdef", TUPLE, workers=2).lease
        self.lease.describe("parked sandbox p-1")

    def evict(self, key):
        return any([self.cache.evict(e.id) for e in self.cache.entries(key)])


def test_evict_says_why_it_refuses_and_who_holds_the_entry(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("thawd's socket directory is root-only: run the tests as root", pytrace=False)
    (tmp_path / "empty.toml").write_text("")
    s = config.load(environ={"THAW_NODE_STATE_DIR": str(tmp_path / "state"),
                             "THAW_THAWD_SOCKET": str(tmp_path / "run" / "thawd.sock"),
                             "THAW_THAWD_METRICS_ADDR": ""}, config_file=tmp_path / "empty.toml")
    imgs = CachedImages(tmp_path)
    server, t, _ = daemon.build(s, imgs, "tuplehash")
    server.start()
    try:
        from control.thawd.client import Client
        with Client(s) as c:
            r = c.evict_why("ctr-t.w.0123456789abcdef")
            assert r["evicted"] is False
            assert "in use (leased)" in r["reason"] and "parked sandbox p-1" in r["reason"]
            assert r["held_by"] == [f"pid {os.getpid()} ({r['held_by'][0].split('(')[1].split(')')[0]}): "
                                    "parked sandbox p-1"]
            imgs.lease.release()
            assert c.evict_why("ctr-t.w.0123456789abcdef") == {"evicted": True, "reason": "", "held_by": []}
            assert c.evict_why("ctr-t.w.0123456789abcdef")["reason"] == "this node's cache holds no entry of it"
    finally:
        server.stop(0)
        t.close()


@pytest.mark.parametrize("interval", ["2", "0"])
def test_startup_sets_build_info_and_starts_the_cache_scrub_unless_it_is_off(tmp_path, interval):
    """server.build (what `thaw serve` runs): thaw_build_info is 1 with this build's labels
    at once; running containers' shim logs are bounded (control/thawd/shimlogs.py); with a
    node cache the scrub runs on its thread and checks the idle entry within its interval
    (cache.scrub_interval_s); 0 starts no scrub thread; close stops both."""
    from control.config import RUNSC_VERSION_LABEL
    from control.version import VERSION
    if os.geteuid() != 0:
        pytest.fail("thawd's socket directory is root-only: run the tests as root", pytrace=False)
    (tmp_path / "empty.toml").write_text("")
    s = config.load(environ={"THAW_NODE_STATE_DIR": str(tmp_path / "state"),
                             "THAW_THAWD_SOCKET": str(tmp_path / "run" / "thawd.sock"),
                             "THAW_THAWD_METRICS_ADDR": "", "THAW_CACHE_SCRUB_INTERVAL_S": interval,
                             "THAW_NODE_LOG_DIR": str(tmp_path / "log"), "THAW_STANDIN_SHIM_LOG_MAX_BYTES": "64k"},
                    config_file=tmp_path / "empty.toml")
    # A running container's shim log (held open without O_APPEND, as gVisor's shim holds it).
    (tmp_path / "log" / "shim").mkdir(parents=True)
    shim_log = tmp_path / "log" / "shim" / "runsc-shim-c1.log"
    shim_fd = os.open(shim_log, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(shim_fd, b"".join(b"level=debug msg=%08d\n" % i for i in range(100_000)))
    imgs = CachedImages(tmp_path)
    imgs.lease.release()                      # idle: the scrub's to check
    [before] = imgs.cache.entries()
    server, t, metrics = daemon.build(s, imgs, "tuplehash")
    server.start()
    thread = t.scrub._thread
    try:
        deadline = time.monotonic() + 10      # the shim-log thread's first pass runs at once
        while os.stat(shim_log).st_blocks * 512 > (64 << 10) + 8192 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.stat(shim_log).st_blocks * 512 <= (64 << 10) + 8192 and t.shim_logs._thread.is_alive()
        assert f'thaw_build_info{{runsc="{RUNSC_VERSION_LABEL}",version="{VERSION}"}} 1.0' in metrics.render()
        if interval == "0":
            assert thread is None and "cache-scrub" not in {th.name for th in threading.enumerate()}
            time.sleep(3)
            assert t.scrub.checked == 0
        else:
            assert thread is not None and thread.is_alive() and thread.name == "cache-scrub"
            deadline = time.monotonic() + 30
            while t.scrub.checked == 0 and time.monotonic() < deadline:
                time.sleep(0.1)
            [after] = imgs.cache.entries()
            assert t.scrub.checked >= 1 and not t.scrub.found and after.verified > before.verified
    finally:
        server.stop(0)
        t.close()
        os.close(shim_fd)
    t.shim_logs._thread.join(timeout=10)
    assert not t.shim_logs._thread.is_alive()
    if thread is not None:
        thread.join(timeout=10)
        assert not thread.is_alive(), "thawd's close stops the scrub"
