"""The automatic checkpoint (control/thawd/autocheckpoint.py) given fakes of its parts:
the image source's staged image and publish, the engine's save. A pod's sandbox is
saved as its pause container, with the profile's hooks run against an app container
and the GPU containers named for the CUDA helper (Engine.checkpoint cuda_on); the
image is published under the pod's key. A lone container's cold start, reported by
its stand-in, ends its record cold and is counted. The container records are real."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from control import config
from control.lifecycle.engine import Engine, Saved
from control.thawd.autocheckpoint import AutoCheckpointer
from control.thawd.containers import Containers, RuntimeRef, State
from control.thawd.metrics import Metrics
from tests.unit.test_pod import member, sandbox


class Staged:
    def __init__(self, path: Path, key: str) -> None:
        self.path, self.key = path, key

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FakeImages:
    def __init__(self, tmp: Path) -> None:
        self.tmp, self.published = tmp, []

    def staged(self, key: str) -> Staged:
        return Staged(self.tmp / "staged", key)

    def publish(self, image: Staged) -> bool:
        self.published.append((image.key, json.loads((image.path / "thaw.json").read_text())["door"]))
        return True

    def has(self, key: str) -> bool:
        return False


class NoQuarantine:
    def reason(self, key: str):
        return None


class Inline:
    """A pool that runs what is submitted at once."""

    def submit(self, fn, *args):
        fn(*args)


@pytest.fixture
def parts(tmp_path):
    (tmp_path / "empty.toml").write_text("")
    s = config.load(environ={"THAW_NODE_STATE_DIR": str(tmp_path / "state"),
                             "THAW_RUNSC_PATH": str(tmp_path / "bin" / "runsc")}, config_file=tmp_path / "empty.toml")
    metrics = Metrics()
    containers = Containers(s, metrics, identify=None, identify_sandbox=None)
    images = FakeImages(tmp_path)
    return AutoCheckpointer(s, containers, images, NoQuarantine(), metrics, Inline(), parking=None), images, tmp_path


def rt_of(tmp: Path, cid: str, spec: dict) -> RuntimeRef:
    b = tmp / "bundles" / cid
    b.mkdir(parents=True)
    (b / "config.json").write_text(json.dumps(spec))
    return RuntimeRef.validate(cid, str(b), "/run/test-root", ["--root=/run/test-root"])


def test_a_gpu_pods_sandbox_is_saved_with_its_gpu_containers_named_and_published_under_the_pods_key(
        parts, monkeypatch):
    ac, images, tmp = parts
    asked = {}

    def checkpoint(self, h, out, stop_after=False, timeout_s=None, hooks_on=None, cuda_on=None):
        asked.update(id=h.id, hooks_on=hooks_on.id, cuda_on=[g.id for g in cuda_on or []], stop_after=stop_after)
        out.mkdir()
        return Saved(out, 0.1, {"checkpoint.img": 1}, bool(cuda_on))
    monkeypatch.setattr(Engine, "checkpoint", checkpoint)
    gpu = member("app")
    gpu.setdefault("linux", {})["devices"] = [{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
                                              {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]
    box, app, side = rt_of(tmp, "s2", sandbox()), rt_of(tmp, "s2-app", gpu), rt_of(tmp, "s2-sidecar", member("sidecar"))
    res = ac.checkpoint(box, leave_running=True, key="pod-key", hooks_rt=app, members={"app": app, "sidecar": side})
    assert res["published"] and res["workload_key"] == "pod-key"
    assert asked == {"id": "s2", "hooks_on": "s2-app", "cuda_on": ["s2-app"], "stop_after": False}
    assert images.published == [("pod-key", "containerd")]
    # The image says each app container's spec (a restore judges its GPUs against it, as a
    # lone container's) and the GPU container's needs, not the pause container's.
    meta = json.loads((tmp / "staged" / "thaw.json").read_text())
    assert sorted(meta["containers"]) == ["app", "sidecar"]
    assert [d["path"] for d in meta["containers"]["app"]["linux"]["devices"]] == ["/dev/nvidiactl", "/dev/nvidia0"]
    assert meta["gpu"]["containers"]["app"]["count"] == 1 and list(meta["gpu"]["containers"]) == ["app"]
    assert ac.metrics.counters().get("thaw_checkpoints_total") == 1


def test_a_lone_cold_start_ends_its_record_cold_is_counted_and_asks_for_a_checkpoint(parts, caplog):
    ac, images, tmp = parts
    caplog.set_level(logging.INFO, logger="thawd")
    jobs = []
    ac._lone_job = lambda rt, key: jobs.append((rt.container_id, key))
    rt = rt_of(tmp, "c1", member("app"))
    ac.containers.begin(rt)
    ac.containers.decide(rt, State.COLD, "k1", reason="no-image")
    ac.cold_started(rt, "k1", "no-image")
    assert ac.containers.state_of(rt) == State.COLD and jobs == [("c1", "k1")]
    assert ac.metrics.counters().get("thaw_cold_starts_total") == 1
    [line] = [r for r in caplog.records if "COLD_STARTED" in r.getMessage()]
    assert line.fields == {"container": "c1", "key": "k1", "decision": "COLD_STARTED", "reason": "no-image"}
