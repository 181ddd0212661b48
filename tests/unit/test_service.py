"""thawd's decisions (control/thawd/service.py) with a fake image source.

The fake stands in for control/thawd/image_source.py only; the bundle, the spec
validation and the quarantine file are real."""
from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pytest

from control import config
from control.errors import (IdentityError, IntegrityError, KeyMissing, ManifestRefused, NoSpace, NotFound, StoreError,
                            ThawError, TupleMismatch, UserError)
from control.thawd.ctrinfo import Identity
from control.thawd.prepare import ORIG_CONFIG
from control.thawd.service import RuntimeRef, Thawd
from control.lifecycle.engine import Engine
from runsc_hooks import gate as gatemod
from runsc_hooks import netns as netnsmod
from runsc_hooks import network as netmod
from runsc_hooks import spec as specmod


class FakeLease:
    """A restorable image from the cache (control/images/source.py Restorable)."""
    streamed = False

    def __init__(self, path: Path, hit: bool) -> None:
        self.path, self.hit, self.released = path, hit, False

    def env(self) -> dict:
        return {}

    def verdict(self, wait_s: float = 0) -> object:
        return None

    def describe(self, holder: str) -> None:   # Restorable: who holds it (`thaw evict`)
        self.holder = holder

    def release(self) -> None:
        self.released = True


class FakeImages:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.available: dict[str, object] = {}   # key -> True | exception
        self.pulls = 0
        self.gate = threading.Event()
        self.gate.set()

    def pull(self, key: str) -> FakeLease:
        self.gate.wait(10)
        self.pulls += 1
        v = self.available.get(key)
        if v is None:
            raise NotFound("image", key)
        if isinstance(v, Exception):
            raise v
        return FakeLease(self.tmp / key, hit=self.pulls > 1)

    def has(self, key: str) -> bool:
        return key in self.available

    def store_for(self, key: str):
        """No store behind this fake: pod tables stay on the node (test_podtables.py has the store's)."""
        return None


IMAGE = "sha256:" + "a" * 64


class FakeIdentities:
    """What containerd's records say about each container (control/thawd/ctrinfo.py's part)."""

    def __init__(self) -> None:
        self.by_id: dict[str, object] = {}   # container id -> Identity | IdentityError
        self.asked: list[str] = []

    def __call__(self, rt: RuntimeRef) -> Identity:
        self.asked.append(rt.container_id)
        v = self.by_id.get(rt.container_id, Identity("ctr-t", IMAGE, "test"))
        if isinstance(v, Exception):
            raise v
        return v


@pytest.fixture
def env(tmp_path):
    (tmp_path / "empty.toml").write_text("")
    s = config.load(environ={"THAW_NODE_STATE_DIR": str(tmp_path / "state"),
                             "THAW_THAWD_QUARANTINE_AFTER": "2", "THAW_THAWD_PREPARE_TIMEOUT_S": "1",
                             "THAW_RUNSC_PATH": str(tmp_path / "bin" / "runsc")},
                    config_file=tmp_path / "empty.toml")
    images = FakeImages(tmp_path)
    t = Thawd(s, images, identify=FakeIdentities())
    yield t, images, tmp_path
    t.close()


def bundle(tmp: Path, cid: str, annotations: dict | None = None, gpu: bool = False) -> RuntimeRef:
    sp = specmod.command_spec(["/app/run.sh"], rootfs="rootfs", annotations=annotations or {})
    if gpu:
        sp["linux"]["devices"] = [{"path": p, "type": "c", "major": 195, "minor": m}
                                  for p, m in (("/dev/nvidiactl", 255), ("/dev/nvidia0", 0))]
    specmod.Bundle(tmp / "bundles" / cid).write(sp)
    return RuntimeRef.validate(cid, str(tmp / "bundles" / cid), "/run/r", ["--root=/run/r"])


OPT_IN = {"thaw.dev/workload": "web"}


def test_not_opted_in_is_cold_without_a_pull(env):
    t, images, tmp = env
    d = t.prepare_restore(bundle(tmp, "c1"))
    assert (d.restore, d.reason) == (False, "not-opted-in") and images.pulls == 0


def test_no_image_then_image(env):
    t, images, tmp = env
    rt = bundle(tmp, "c1", OPT_IN)
    d = t.prepare_restore(rt)
    assert (d.restore, d.reason) == (False, "no-image") and d.key.startswith("ctr-t.web.")
    images.available[d.key] = True
    d2 = t.prepare_restore(rt)
    assert d2.restore and d2.image_path == str(tmp / d.key)
    # The stand-in's deadline for Restore: runsc + health check (+ hooks), from thawd's settings.
    assert d2.restore_timeout_s == t.s.runsc_timeout_s + t.s.thawd_health_timeout_s + 5.0


def test_tuple_mismatch_and_store_errors_are_cold_with_reason(env):
    t, images, tmp = env
    rt = bundle(tmp, "c1", OPT_IN)
    key = t.prepare_restore(rt).key
    images.available[key] = TupleMismatch(key, ["gpu_product: H100 != H200"])
    d = t.prepare_restore(rt)
    assert not d.restore and d.reason.startswith("tuple-mismatch") and "H100" in d.reason


def test_slow_fetch_answers_cold_and_keeps_fetching(env):
    t, images, tmp = env
    rt = bundle(tmp, "c1", OPT_IN)
    key = t.prepare_restore(rt).key
    images.available[key] = True
    images.gate.clear()
    d = t.prepare_restore(rt)
    assert not d.restore and d.reason.startswith("fetch-in-progress")
    images.gate.set()


def test_two_containers_sharing_one_fetch_get_their_own_leases(env):
    t, images, tmp = env
    a, b = bundle(tmp, "a", OPT_IN), bundle(tmp, "b", OPT_IN)
    key = t.prepare_restore(a).key
    images.available[key] = True
    images.gate.clear()
    out = {}
    th = [threading.Thread(target=lambda r=r: out.__setitem__(r.container_id, t.prepare_restore(r))) for r in (a, b)]
    for x in th:
        x.start()
    images.gate.set()
    for x in th:
        x.join()
    assert out["a"].restore and out["b"].restore
    la, lb = t.lease_of(a), t.lease_of(b)
    assert la is not lb
    assert t.release("a", "/run/r") and la.released and not lb.released
    assert not t.release("a", "/run/r")  # once


def test_consecutive_failures_quarantine_and_persist(env):
    t, images, tmp = env
    rt = bundle(tmp, "c1", OPT_IN)
    key = t.prepare_restore(rt).key
    images.available[key] = True
    t.report_outcome(rt, "RESTORE_FAILED", "runsc restore failed: boom")
    assert t.prepare_restore(rt).restore  # one failure is not enough (quarantine_after = 2)
    t.quarantine.succeeded(key)  # what a healthy Restore records (tests/functional/test_thawd_restore.py)
    t.report_outcome(rt, "RESTORE_FAILED", "x")
    assert t.prepare_restore(rt).restore  # a success in between resets the count
    t.report_outcome(rt, "RESTORE_FAILED", "unhealthy after restore: exit 1")
    d = t.prepare_restore(rt)
    assert not d.restore and d.reason.startswith("quarantined: 2 restores in a row failed")
    saved = json.loads((tmp / "state" / "thawd" / "quarantine.json").read_text())
    assert "unhealthy after restore" in saved[key]
    t2 = Thawd(t.s, images, identify=t.containers.identify)  # a restarted thawd remembers
    assert key in t2.quarantined()
    assert t2.unquarantine(key)
    assert t2.prepare_restore(rt).restore
    t2.close()


def test_a_chunk_altered_in_the_store_counts_towards_quarantine(env):
    """Every pull of an image whose stored bytes are wrong fails alike: after
    quarantine_after (2 here) such pulls its starts are cold without a download."""
    t, images, tmp = env
    rt = bundle(tmp, "c1", OPT_IN)
    key = t.prepare_restore(rt).key
    images.available[key] = IntegrityError("store", "ab" * 32, "bytes at packs/p1 offset 7 hash to cd...")
    d = t.prepare_restore(rt)
    assert not d.restore and d.reason.startswith("fetch-failed: store chunk abab")
    assert key not in t.quarantined()
    d = t.prepare_restore(rt)
    assert key in t.quarantined() and "fetch-failed: store chunk" in t.quarantined()[key]
    assert t.metrics.counters().get("thaw_quarantined_total") == 1
    pulls = images.pulls
    d = t.prepare_restore(rt)
    assert not d.restore and d.reason.startswith("quarantined: 2 restores in a row failed")
    assert images.pulls == pulls, "a quarantined key is not pulled again"


def test_an_unreachable_store_does_not_quarantine(env):
    t, images, tmp = env
    rt = bundle(tmp, "c1", OPT_IN)
    key = t.prepare_restore(rt).key
    images.available[key] = StoreError("get", "packs/p1", "connection refused")
    for _ in range(3):
        d = t.prepare_restore(rt)
        assert not d.restore and d.reason.startswith("fetch-failed")
    assert t.quarantined() == {}


def test_gpu_container_gets_the_helper_mount_and_the_original_is_kept(env):
    t, images, tmp = env
    (tmp / "bin").mkdir()
    (tmp / "bin" / "thaw-cuda-checkpoint").write_bytes(b"\x7fELF")
    rt = bundle(tmp, "g1", OPT_IN, gpu=True)
    original = (rt.bundle / "config.json").read_text()
    t.prepare_restore(rt)
    spec = json.loads((rt.bundle / "config.json").read_text())
    helper = [m for m in spec["mounts"] if m["destination"] == "/thaw/bin"]
    assert len(helper) == 1 and "ro" in helper[0]["options"]
    assert (rt.bundle / ORIG_CONFIG).read_text() == original
    t.prepare_restore(rt)  # idempotent: still one helper mount, original untouched
    spec = json.loads((rt.bundle / "config.json").read_text())
    assert len([m for m in spec["mounts"] if m["destination"] == "/thaw/bin"]) == 1
    assert (rt.bundle / ORIG_CONFIG).read_text() == original


def test_outcomes_are_validated_and_restore_needs_a_decision(env):
    t, images, tmp = env
    rt = bundle(tmp, "c1", OPT_IN)
    with pytest.raises(UserError):
        t.report_outcome(rt, "RESTORED", "")  # thawd records restores itself, in Restore
    ok, detail, _ = t.restore(rt)
    assert not ok and "no restore decision" in detail


def test_no_readiness_probe_means_no_auto_checkpoint(env):
    t, images, tmp = env
    rt = bundle(tmp, "c1", OPT_IN)
    key = t.prepare_restore(rt).key
    t.autocheckpoint._lone_job(rt, key)
    assert t.metrics.counters().get('thaw_auto_checkpoints_total{result="no-ready-probe"}') == 1


@pytest.mark.parametrize("cid, bundle_path, root, flags", [
    ("bad/id", "/b", "/r", []), ("ok", "relative", "/r", []), ("ok", "/b", "/r/../etc", []),
    ("ok", "/b", "/r", ["--x\0y"]),
])
def test_runtime_fields_are_validated(cid, bundle_path, root, flags):
    with pytest.raises(UserError):
        RuntimeRef.validate(cid, bundle_path, root, flags)


def test_identity_comes_from_the_runtime_and_a_refusal_is_cold_with_its_reason(env):
    t, images, tmp = env
    ids = t.containers.identify
    a = t.prepare_restore(bundle(tmp, "a", OPT_IN))
    images.available[a.key] = True
    assert t.prepare_restore(bundle(tmp, "a", OPT_IN)).restore
    # Another tenant with identical annotations: another key, no image.
    ids.by_id["b"] = Identity("ctr-other", IMAGE, "test")
    b = t.prepare_restore(bundle(tmp, "b", OPT_IN))
    assert (b.restore, b.reason) == (False, "no-image") and b.key != a.key and b.key.startswith("ctr-other.")
    # Another image with identical annotations: another key.
    ids.by_id["c"] = Identity("ctr-t", "sha256:" + "b" * 64, "test")
    c = t.prepare_restore(bundle(tmp, "c", OPT_IN))
    assert not c.restore and c.key != a.key
    # A forged tenant annotation: refused, no key (so never checkpointed either).
    ids.by_id["f"] = Identity("ctr-other", IMAGE, "test")
    f = t.prepare_restore(bundle(tmp, "f", {**OPT_IN, "thaw.dev/tenant": "ctr-t"}))
    assert (f.restore, f.key) == (False, "") and f.reason.startswith("tenant-refused: ")
    # containerd cannot tell (or the tag moved): cold, reason kept.
    ids.by_id["m"] = IdentityError("image-moved", "image x now names y")
    m = t.prepare_restore(bundle(tmp, "m", OPT_IN))
    assert (m.restore, m.key) == (False, "") and m.reason == "image-moved: image x now names y"
    counters = t.metrics.counters()
    assert counters['thaw_cold_decisions_total{reason="tenant-refused"}'] == 1
    assert counters['thaw_cold_decisions_total{reason="image-moved"}'] == 1
    assert counters['thaw_cold_decisions_total{reason="no-image"}'] >= 2
    # A refused container that starts cold is not checkpointed: it has no key.
    t.report_outcome(bundle(tmp, "f", {**OPT_IN, "thaw.dev/tenant": "ctr-t"}), "COLD_STARTED", f.reason)
    ids.by_id["d"] = Identity("ctr-d", IMAGE, "test")
    t.report_outcome(bundle(tmp, "d", OPT_IN), "COLD_STARTED", "")   # an accepted one without an image is
    t._pool.shutdown(wait=True)
    assert t.metrics.counters().get('thaw_auto_checkpoints_total{result="no-ready-probe"}') == 1


def test_identity_is_established_once_per_container_until_it_is_released(env):
    t, images, tmp = env
    ids = t.containers.identify
    rt = bundle(tmp, "a", OPT_IN)
    k1 = t.prepare_restore(rt).key
    ids.by_id["a"] = Identity("ctr-t", "sha256:" + "c" * 64, "test")   # the tag moved after create
    assert t.prepare_restore(rt).key == k1 and ids.asked == ["a"]      # the container keeps its key
    t.release("a", "/run/r")
    assert t.prepare_restore(rt).key != k1                            # a new container with that id asks again


@pytest.mark.parametrize("err, reason", [
    (ManifestRefused("s3://b/m.json", "its integrity tag does not verify"), "manifest-refused"),
    (KeyMissing("ctr-t", "/keys"), "no-tenant-key"),
])
def test_refused_manifests_and_missing_keys_are_cold_with_their_reason(env, err, reason):
    t, images, tmp = env
    rt = bundle(tmp, "c1", OPT_IN)
    images.available[t.prepare_restore(rt).key] = err
    d = t.prepare_restore(rt)
    assert not d.restore and d.reason.startswith(reason + ": ")
    assert t.metrics.counters()[f'thaw_cold_decisions_total{{reason="{reason}"}}'] == 1


FAKE_RUNSC_CHECKPOINT = r'''#!{python}
import pathlib, sys
args = sys.argv[1:]
if "checkpoint" not in args:
    sys.exit(0)
out = pathlib.Path(next(a.split("=", 1)[1] for a in args if a.startswith("--image-path=")))
out.mkdir(parents=True, exist_ok=True)
(out / "checkpoint.img").write_bytes(b"state " * 3000)
(out / "pages.img").write_bytes(bytes(range(256)) * 400)
if "{mode}" == "fail":
    sys.stderr.write("checkpoint failed: the sandbox went away\n")
    sys.exit(1)
'''


@pytest.mark.parametrize("mode", ["ok", "fail"])
def test_checkpoint_writes_into_the_cache_and_the_entry_is_that_directory(tmp_path, monkeypatch, mode):
    """Thawd.checkpoint (the auto-checkpoint door) with the real image source over an in-memory
    store: runsc writes into a partial of the node cache, which becomes the entry by rename;
    a failed checkpoint leaves no partial and publishes nothing."""
    from control.images import image as images
    from control.images.source import ImageSource
    from tests.unit.fakes import TUPLE, FakeStore, layout
    runsc = tmp_path / "bin" / "runsc"
    runsc.parent.mkdir()
    runsc.write_text(FAKE_RUNSC_CHECKPOINT.format(python=sys.executable, mode=mode))
    runsc.chmod(0o755)
    (tmp_path / "empty.toml").write_text("")
    s = config.load(environ={"THAW_NODE_STATE_DIR": str(tmp_path / "state"), "THAW_RUNSC_PATH": str(runsc),
                             "THAW_CACHE_DIR": str(tmp_path / "cache")}, config_file=tmp_path / "empty.toml")
    monkeypatch.setattr(images.chunk, "chunk_image", lambda d, key, tup, chunker, avg: layout(key, d, tup=tup))
    written = {}
    real_publish = images.publish_staged

    def publish_staged(cache, store, st, **kw):
        written.update({p.name: p.stat().st_ino for p in st.path.iterdir()})
        assert st.path.parent == cache.root / "tmp"     # runsc wrote into the cache itself
        return real_publish(cache, store, st, **kw)
    monkeypatch.setattr(images, "publish_staged", publish_staged)
    store = FakeStore()
    src = ImageSource(s, node=TUPLE, store=store)
    t = Thawd(s, src, identify=FakeIdentities())
    try:
        rt = bundle(tmp_path, "c1", OPT_IN)
        if mode == "fail":
            with pytest.raises(ThawError, match="the sandbox went away"):
                t.checkpoint(rt)
            assert src.cache.entries() == [] and list(store.list_manifests()) == [] and not written
        else:
            res = t.checkpoint(rt)
            [e] = src.cache.entries()
            assert res["published"] and res["image_bytes"] == 18000 + 102400 and e.key == res["workload_key"]
            assert set(written) == {"checkpoint.img", "pages.img", "thaw.json"}   # + what a restore needs
            meta = json.loads((e.path / "thaw.json").read_text())
            assert meta["door"] == "containerd" and meta["spec"]["annotations"] == OPT_IN
            assert {p.name: p.stat().st_ino for p in e.path.iterdir() if p.name in written} == written
            assert src.has(e.key)
            # thaw_checkpoint_seconds by workload: the key less its identity digest.
            from control.lifecycle.workload import workload_of
            wl = workload_of(e.key)
            assert wl != e.key and e.key.startswith(wl + ".")
            assert f'thaw_checkpoint_seconds_count{{workload="{wl}"}} 1.0' in t.metrics.render()
        assert list((tmp_path / "cache" / "tmp").iterdir()) == []
        assert not (tmp_path / "state" / "thawd" / "staging").exists()
    finally:
        t.close()


def test_an_image_whose_spec_runsc_would_refuse_starts_cold_before_runsc_runs(env):
    """The image carries the spec it was saved with (thaw.json); a container whose
    spec differs where runsc's restore validation looks (a mount, a device, the
    GPU count) is answered cold with the reason, and its lease is released."""
    t, images, tmp = env
    rt = bundle(tmp, "c1", OPT_IN)
    key = t.prepare_restore(rt).key
    images.available[key] = True
    saved = json.loads((rt.bundle / "config.json").read_text())
    (tmp / key).mkdir()
    (tmp / key / "thaw.json").write_text(json.dumps({"version": 1, "door": "containerd", "spec": saved}))
    assert t.prepare_restore(rt).restore                        # the same spec: restore
    t.release("c1", "/run/r")
    saved["mounts"].append({"destination": "/data", "type": "bind", "source": "/srv/data", "options": ["ro"]})
    (tmp / key / "thaw.json").write_text(json.dumps({"version": 1, "door": "containerd", "spec": saved}))
    d = t.prepare_restore(rt)
    assert not d.restore and d.reason.startswith("spec-mismatch: ") and "/data" in d.reason, d.reason
    assert t.lease_of(rt) is None


@pytest.mark.parametrize("gate, health_check", [(True, True), (False, False)])
def test_gate_and_health_check_follow_the_diagnostic_keys(tmp_path, monkeypatch, gate, health_check):
    """thawd.gate / thawd.health_check (diagnostics, default on): off, PrepareRestore
    closes no gate and Restore asks the engine for no health check and no gate opening
    (what bench/network_flood.py --door containerd measures as mitigations off)."""
    from control.lifecycle.engine import Restored
    from control.thawd import service as svc
    (tmp_path / "empty.toml").write_text("")
    s = config.load(environ={"THAW_NODE_STATE_DIR": str(tmp_path / "state"),
                             "THAW_RUNSC_PATH": str(tmp_path / "bin" / "runsc"),
                             "THAW_THAWD_GATE": str(gate).lower(),
                             "THAW_THAWD_HEALTH_CHECK": str(health_check).lower()},
                    config_file=tmp_path / "empty.toml")
    closed, asked = [], []
    monkeypatch.setattr(netmod, "namespace_address", lambda path: ("10.0.0.2", "web-a"))
    monkeypatch.setattr(netnsmod, "snapshot", lambda path: [])
    monkeypatch.setattr(gatemod, "close", lambda name, mark, reason="": closed.append(name) or True)

    def restore(self, h, image, probes, *, opts, health_check=True, **kw):
        asked.append((h.gate, health_check))
        return Restored(0.1, 0.05, None)
    monkeypatch.setattr(Engine, "restore", restore)
    images = FakeImages(tmp_path)
    t = Thawd(s, images, identify=FakeIdentities())
    try:
        rt = bundle(tmp_path, "c1", OPT_IN)
        sp = specmod.Bundle(rt.bundle).load()
        sp["linux"]["namespaces"].append({"type": "network", "path": "/var/run/netns/thaw-web-a"})
        specmod.Bundle(rt.bundle).write(sp)
        images.available[t.prepare_restore(rt).key] = True
        assert t.prepare_restore(rt).restore
        assert closed == (["web-a"] if gate else [])
        ok, _, _ = t.restore(rt)
        assert ok and asked == [("web-a" if gate else None, health_check)]
        # The restore's histogram is per workload: the key less its identity digest (issue 33).
        key = t.prepare_restore(rt).key
        wl = key.rsplit(".", 1)[0]
        assert f'thaw_restore_seconds_count{{workload="{wl}"}} 1.0' in t.metrics.render()
    finally:
        t.close()


def test_every_restore_decision_ends_in_exactly_one_outcome(env, caplog):
    """issue 14: a stand-in killed between create and start never reports; thawd
    records such a decision as ABANDONED when it is released or replaced."""
    t, images, tmp = env
    rt = bundle(tmp, "c1", OPT_IN)
    key = t.prepare_restore(rt).key
    images.available[key] = True
    abandoned = lambda: t.metrics.counters().get("thaw_restores_abandoned_total", 0)  # noqa: E731
    assert t.prepare_restore(rt).restore
    assert t.release("c1", "/run/r") and abandoned() == 1          # deleted before any start
    assert t.prepare_restore(rt).restore
    t.report_outcome(rt, "RESTORE_FAILED", "create for restore failed: killed")
    t.release("c1", "/run/r")
    assert abandoned() == 1                                          # it had its outcome already
    assert t.prepare_restore(rt).restore and t.prepare_restore(rt).restore
    assert abandoned() == 2                                          # replaced by a new decision
    with caplog.at_level("INFO", logger="thawd"):
        t.release("c1", "/run/r")
    assert abandoned() == 3
    assert any(r.getMessage().startswith("outcome c1 ") and "ABANDONED" in r.getMessage() for r in caplog.records)


def test_a_decision_whose_standin_is_gone_before_the_answer_is_abandoned(env):
    """issue 14: the stand-in SIGKILLed while thawd decides (PrepareRestore's RPC
    cancelled), and containerd's delete come and gone before the decision existed:
    nothing else would end it, so the servicer abandons it (test_standin_kills
    found one such decision without an outcome, 2026-12-01)."""
    from control.thawd.rpc import thawd_pb2 as pb
    from control.thawd.server import ThawdServicer
    t, images, tmp = env
    rt = bundle(tmp, "c1", OPT_IN)
    images.available[t.prepare_restore(rt).key] = True

    class Context:
        def __init__(self, active: bool) -> None:
            self.active = active

        def is_active(self) -> bool:
            return self.active

    req = pb.PrepareRestoreRequest(runtime=pb.Runtime(container_id="c1", bundle=str(rt.bundle),
                                                              runsc_root=str(rt.runsc_root)))
    servicer = ThawdServicer(t, "tuple")
    abandoned = lambda: t.metrics.counters().get("thaw_restores_abandoned_total", 0)  # noqa: E731
    assert servicer.PrepareRestore(req, Context(True)).image_path and abandoned() == 0
    t.release("c1", str(rt.runsc_root))
    assert abandoned() == 1
    servicer.PrepareRestore(req, Context(False))
    assert abandoned() == 2 and t.lease_of(rt) is None          # ended and its lease released
    assert not t.release("c1", str(rt.runsc_root)) and abandoned() == 2   # the late delete finds nothing


def test_a_standin_commits_by_its_marker_and_its_exit(tmp_path):
    """thawd keeps a restore once its stand-in exited with the marker saying "restored";
    a stand-in that died first, marker still "restore", gets it removed (issue 14)."""
    import subprocess

    from control.thawd.service import Standin
    marker = tmp_path / "m.json"
    marker.write_text(json.dumps({"id": "c1", "decision": "restore"}))
    # A process named like the stand-in (argv[0]), which the test ends.
    p = subprocess.Popen(["bash", "-c", "exec -a thaw-runsc-hooks sleep 30"])
    try:
        import time
        for _ in range(100):   # until bash has exec'ed
            if Path(f"/proc/{p.pid}/cmdline").read_bytes().startswith(b"thaw-runsc-hooks"):
                break
            time.sleep(0.01)
        s = Standin.validate(p.pid, str(marker))
        s.observe()
        assert s.watchable and not s.wait_exit(0.05)        # alive
        p.kill()
        p.wait()
        assert s.wait_exit(5) and s.committed("c1") is False  # died before committing
        marker.write_text(json.dumps({"id": "c1", "decision": "restored"}))
        assert s.committed("c1") is True and s.committed("c2") is None
    finally:
        p.kill()
    other = Standin.validate(os.getpid(), str(marker))       # not a stand-in: not watched
    other.observe()
    assert not other.watchable
    assert Standin.validate(0, "") is None
    with pytest.raises(UserError):
        Standin.validate(12, "relative/path")


def test_a_standin_killed_after_its_commit_loses_its_restore(tmp_path):
    """The marker says "restored", but the stand-in was SIGKILLed before it
    exited: containerd reports the start failed, so thawd must not keep the
    restore (the window CI caught once: issue 14). Its exit status, heard from
    the kernel (control/thawd/exits.py), decides; exit 0 keeps it."""
    import subprocess

    from control.thawd.exits import ExitWatch
    from control.thawd.service import Standin
    from tests.conftest import require
    require(os.geteuid() == 0, "root (the process events connector needs CAP_NET_ADMIN)")
    exits = ExitWatch().start()
    assert exits.available, exits.why_not
    marker = tmp_path / "m.json"
    marker.write_text(json.dumps({"id": "c1", "decision": "restored"}))
    try:
        for argv, kill, kept in ((["sleep", "30"], True, False), (["sleep", "0.3"], False, True)):
            p = subprocess.Popen(["bash", "-c", "exec -a thaw-runsc-hooks " + " ".join(argv)])
            for _ in range(100):
                if Path(f"/proc/{p.pid}/cmdline").read_bytes().startswith(b"thaw-runsc-hooks"):
                    break
                import time
                time.sleep(0.01)
            s = Standin.validate(p.pid, str(marker), exits=exits)
            s.observe()
            assert s.watchable
            if kill:
                p.kill()
            p.wait()
            assert s.wait_exit(5) and s.committed("c1") is kept, argv
        # A stand-in already dead when its request is read: watched, by its heard exit.
        p = subprocess.Popen(["bash", "-c", "exec -a thaw-runsc-hooks sleep 30"])
        s = Standin.validate(p.pid, str(marker), exits=exits)
        p.kill()
        p.wait()
        s.observe()
        assert s.watchable and s.wait_exit(1) and s.committed("c1") is False
        # Without exit events the marker alone decides (the earlier behaviour).
        s.exits = None
        assert s.committed("c1") is True
    finally:
        exits.close()


def test_a_restore_not_tried_opens_its_gate(tmp_path, monkeypatch):
    """A restore that fails before the engine runs (its spec unreadable at start)
    opens the gate PrepareRestore closed: the cold start needs its network."""
    from control.thawd import service as svc
    (tmp_path / "empty.toml").write_text("")
    s = config.load(environ={"THAW_NODE_STATE_DIR": str(tmp_path / "state"),
                             "THAW_RUNSC_PATH": str(tmp_path / "bin" / "runsc")},
                    config_file=tmp_path / "empty.toml")
    opened = []
    monkeypatch.setattr(netmod, "namespace_address", lambda path: ("10.0.0.2", "web-a"))
    monkeypatch.setattr(netnsmod, "snapshot", lambda path: [])
    monkeypatch.setattr(gatemod, "close", lambda name, mark, reason="": True)
    monkeypatch.setattr(gatemod, "open", lambda name, reason="": opened.append(name) or True)
    monkeypatch.setattr(Engine, "restore", lambda *a, **k: pytest.fail("the engine must not run"))
    images = FakeImages(tmp_path)
    t = Thawd(s, images, identify=FakeIdentities())
    try:
        rt = bundle(tmp_path, "c1", OPT_IN)
        sp = specmod.Bundle(rt.bundle).load()
        sp["linux"]["namespaces"].append({"type": "network", "path": "/var/run/netns/thaw-web-a"})
        specmod.Bundle(rt.bundle).write(sp)
        images.available[t.prepare_restore(rt).key] = True
        assert t.prepare_restore(rt).restore and opened == []
        (rt.bundle / "config.json").write_text("{")
        ok, reason, _ = t.restore(rt)
        assert not ok and reason.startswith("SpecError") and opened == ["web-a"]
    finally:
        t.close()


class FakeStream(FakeLease):
    """A streamed image (control/images/stream.Stream's surface thawd uses) whose stream failed with `error`."""
    streamed = True

    def __init__(self, path: Path, error) -> None:
        super().__init__(path, hit=False)
        self.error = error

    def verdict(self, wait_s: float = 0) -> object:
        return self.error

    def add_done_callback(self, fn) -> None:
        fn(self)


@pytest.mark.parametrize("error, quarantined", [
    (NoSpace("no space left in the cache file system /c for image 'k' (9 bytes)", path="/c"), False),
    (IntegrityError("store", "ab" * 32, "bytes at packs/p1 offset 7 hash to cd..."), True)])
def test_a_streamed_restore_that_failed_with_its_stream_says_why(tmp_path, monkeypatch, error, quarantined):
    """runsc kills a sandbox whose stream failed (its reads fail): the outcome names
    the stream's error, and only bytes the store got wrong count towards quarantine,
    as for a pull (a full cache file system is the node's fault, not the image's)."""
    from control.errors import RunscError
    from control.thawd import service as svc
    (tmp_path / "empty.toml").write_text("")
    s = config.load(environ={"THAW_NODE_STATE_DIR": str(tmp_path / "state"), "THAW_THAWD_QUARANTINE_AFTER": "2",
                             "THAW_RUNSC_PATH": str(tmp_path / "bin" / "runsc")}, config_file=tmp_path / "empty.toml")

    def restore(self, h, image, probes, *, opts, **kw):
        raise RunscError(["runsc", "restore"], 128, "Killing the sandbox after MemoryFile page loading failed")
    monkeypatch.setattr(Engine, "restore", restore)
    images = FakeImages(tmp_path)
    images.pull = lambda key: FakeStream(tmp_path / key, error)
    t = Thawd(s, images, identify=FakeIdentities())
    try:
        rt = bundle(tmp_path, "c1", OPT_IN)
        for _ in range(2):
            assert t.prepare_restore(rt).restore
            ok, reason, _ = t.restore(rt)
            assert not ok and reason.startswith(f"{type(error).__name__}: the image's stream failed: "), reason
        assert (t.prepare_restore(rt).key in t.quarantined()) is quarantined
    finally:
        t.close()
