"""Every timeout error names the setting that bounds it (issue 31): runsc calls,
the cache's key lock, containerd lookups, the health check."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from filelock import FileLock

from control import config
from control.errors import RunscError, Timeout
from control.images.cache import Cache
from runsc_hooks import probe as probemod
from runsc_hooks.runsc import CheckpointOptions, GlobalOptions, Runsc


def _sleepy_runsc(tmp_path: Path) -> Path:
    p = tmp_path / "runsc"
    p.write_text("#!/bin/sh\nexec sleep 5\n")
    p.chmod(0o755)
    return p


def test_a_runsc_call_that_runs_out_of_time_names_runsc_timeout_s(tmp_path):
    r = Runsc(_sleepy_runsc(tmp_path), GlobalOptions(root=tmp_path / "root"), timeout_s=0.3)
    with pytest.raises(RunscError) as e:
        r.checkpoint("x", CheckpointOptions(image_path=tmp_path / "img"))
    assert e.value.returncode is None
    assert "runsc checkpoint failed (timed out): no answer within 0.3 s (runsc.timeout_s)" in str(e.value)


def test_a_call_with_its_own_deadline_names_the_key_its_caller_gives(tmp_path):
    r = Runsc(_sleepy_runsc(tmp_path), GlobalOptions(root=tmp_path / "root"), timeout_s=60)
    with pytest.raises(RunscError, match=r"no answer within 0.2 s \(thawd.health_attempt_timeout_s\)"):
        r.exec("x", ["true"], timeout_s=0.2, timeout_key="thawd.health_attempt_timeout_s")


def test_the_cache_lock_wait_names_cache_lock_timeout_s(tmp_path):
    cache = Cache(tmp_path / "cache", 1 << 30, lock_timeout_s=0.1)
    held = FileLock(tmp_path / "cache" / "locks" / "t.k.lock")
    (tmp_path / "cache" / "locks").mkdir(parents=True, exist_ok=True)
    with held:
        with pytest.raises(Timeout) as e:
            with cache.key_lock("t.k"):
                pass
    assert "did not finish within 0.1 s (cache.lock_timeout_s)" in str(e.value)
    assert e.value.to_dict()["setting"] == "cache.lock_timeout_s"


def test_a_containerd_lookup_that_runs_out_of_time_names_containerd_info_timeout_s(monkeypatch, tmp_path):
    from control.thawd import ctrinfo

    def hang(*a, **kw):
        raise subprocess.TimeoutExpired(a[0], kw.get("timeout", 0))
    monkeypatch.setattr(ctrinfo.subprocess, "run", hang)
    s = config.load(environ={}, default_file=tmp_path / "absent")
    with pytest.raises(Exception, match=r"within 2s \(containerd.info_timeout_s\)"):
        ctrinfo._invoke(s, "default", ["info", "x"], 2.0, lambda d: RuntimeError(d))


def test_a_health_check_past_its_deadline_names_its_setting():
    now = [0.0]

    def clock() -> float:
        return now[0]

    def sleep(s: float) -> None:
        now[0] += s

    class Never:
        def attempt(self, target, timeout_s):
            now[0] += timeout_s
            raise probemod.ProbeFailed("connection refused")

        def __str__(self) -> str:
            return "tcp:8000"

    result = probemod.check([Never()], probemod.Target(running=lambda: True, gone=lambda: False),
                            probemod.Policy(3.0, 1.0, "thawd.health_timeout_s"), clock=clock, sleep=sleep)
    assert not result.healthy
    assert result.summary().endswith("the check's deadline is 3 s (thawd.health_timeout_s)")
    assert result.to_dict()["setting"] == "thawd.health_timeout_s"


def test_a_workload_that_exited_is_not_reported_as_a_deadline():
    class Refused:
        def attempt(self, target, timeout_s):
            raise probemod.ProbeFailed("connection refused")

        def __str__(self) -> str:
            return "tcp:8000"

    result = probemod.check([Refused()], probemod.Target(running=lambda: False, gone=lambda: True),
                            probemod.Policy(3.0, 1.0, "thawd.health_timeout_s"))
    assert probemod.GONE in result.summary() and "deadline" not in result.summary()


def test_the_engines_policy_names_thawd_health_timeout_s(tmp_path):
    from control.lifecycle.engine import Engine
    s = config.load(environ={}, default_file=tmp_path / "absent")
    assert Engine(s).policy().setting == "thawd.health_timeout_s"
