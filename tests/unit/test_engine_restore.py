"""Engine.restore with --background: the restore ends when every page is in
(`runsc wait --restore`), after the gate opened; a loader failure is the restore's."""

from pathlib import Path

import pytest

from control import config
from control.errors import RunscError, UnhealthyRestore
from control.lifecycle.engine import Engine, Handle
from runsc_hooks.runsc import CreateOptions, RestoreOptions


class _Runsc:
    """Records restore/wait calls; `wait --restore` fails when `load_error` is set."""

    def __init__(self, load_error: str | None = None):
        self.calls: list[tuple] = []
        self.load_error = load_error

    def restore(self, cid, opts, timeout_s=None, stdio=None, timeout_key=None):
        self.calls.append(("restore", opts.background))

    def wait(self, cid, timeout_s=None, restore=False, timeout_key=None):
        self.calls.append(("wait", restore))
        if self.load_error:
            raise RunscError(["runsc", "wait", "--restore", cid], 128, self.load_error, subcommand="wait")
        return 0


def _restore(r: _Runsc, background: bool, env=(), **kw):
    h = Handle("t-engine-restore", r, Path("/nonexistent"))
    opts = RestoreOptions(image_path=Path("/i"), create=CreateOptions(bundle=Path("/b")), detach=True,
                          background=background, env=env)
    return Engine(config.load(environ={})).restore(h, Path("/i"), [], opts=opts, health_check=False,
                                                   post_restore_hooks=False, **kw)


def test_a_background_restore_ends_when_every_page_is_in():
    r = _Runsc()
    done = _restore(r, background=True)
    assert r.calls == [("restore", True), ("wait", True)]
    assert done.ready_s is not None and done.loaded_s is not None and done.loaded_s >= done.ready_s


def test_no_wait_without_background_for_a_stream_or_a_pods_sandbox():
    for kw in ({"background": False}, {"background": True, "env": (("X", "1"),)},
               {"background": True, "await_pages": False}):
        r = _Runsc()
        done = _restore(r, **kw)
        assert [c[0] for c in r.calls] == ["restore"], kw
        assert done.loaded_s is None


def test_a_loader_failure_fails_the_restore():
    r = _Runsc(load_error="waiting for restore to complete: pages file: unexpected EOF")
    with pytest.raises(RunscError, match="unexpected EOF"):
        _restore(r, background=True)


def test_an_unhealthy_background_restore_reports_the_loaders_error_first(monkeypatch):
    from runsc_hooks import probe as probemod
    unhealthy = probemod.HealthResult(healthy=False, probes=[], seconds=0.1)
    monkeypatch.setattr(Engine, "check", lambda self, h, probes, policy=None: unhealthy)
    h = Handle("t-engine-restore", _Runsc(load_error="pages file: unexpected EOF"), Path("/nonexistent"))
    opts = RestoreOptions(image_path=Path("/i"), detach=True, background=True)
    with pytest.raises(RunscError, match="unexpected EOF"):
        Engine(config.load(environ={})).restore(h, Path("/i"), [], opts=opts, post_restore_hooks=False)
    h = Handle("t-engine-restore", _Runsc(), Path("/nonexistent"))   # pages fine: unhealthy it is
    with pytest.raises(UnhealthyRestore):
        Engine(config.load(environ={})).restore(h, Path("/i"), [], opts=opts, post_restore_hooks=False)
