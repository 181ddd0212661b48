"""Engine.target: the workload's own monitor outranks runsc's lagging view."""

from pathlib import Path
from types import SimpleNamespace

from control import config
from control.lifecycle.engine import Engine, Handle
from runsc_hooks import probe as probemod


class _Runsc:
    """runsc as it answers for a sandbox whose init exited but whose process is
    not reaped yet: `state` still says running (kill(pid, 0) passes)."""

    def state(self, cid):
        return SimpleNamespace(status="running")


def _target(exited):
    h = Handle("t-engine-target", _Runsc(), Path("/nonexistent"), exited=exited)
    return Engine(config.load(environ={})).target(h)


def test_an_exit_the_monitor_saw_wins_over_runscs_running():
    t = _target(lambda: True)
    assert not t.running() and t.gone()
    r = probemod.check([], t, probemod.Policy(5, 1))
    assert not r.healthy and r.probes[0].attempts == 1


def test_without_an_exit_runscs_view_decides():
    t = _target(lambda: False)
    assert t.running() and not t.gone()
    t = _target(None)
    assert t.running() and not t.gone()
