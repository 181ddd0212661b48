"""The quarantine list (control/thawd/quarantine.py): failures counted per key until
thawd.quarantine_after, persisted, marked on `thaw stats`' entries, and lifted by
`thaw evict KEY` with the key's unleased cache entries (a fake image source)."""
from __future__ import annotations

import pytest

from control import config
from control.errors import UserError
from control.thawd.quarantine import Quarantine, read_quarantine


class FakeImages:
    def __init__(self) -> None:
        self.evicted: list[str] = []

    def evict(self, key: str) -> bool:
        self.evicted.append(key)
        return True


@pytest.fixture
def settings(tmp_path):
    (tmp_path / "empty.toml").write_text("")
    return config.load(environ={"THAW_NODE_STATE_DIR": str(tmp_path / "state"), "THAW_THAWD_QUARANTINE_AFTER": "2"},
                       config_file=tmp_path / "empty.toml")


def test_a_key_is_quarantined_after_its_failures_marked_in_stats_and_lifted_by_evict(settings):
    q = Quarantine(settings)
    assert not q.failed("k1", "runsc restore: exit status 1")
    assert q.failed("k1", "runsc restore: exit status 1")
    assert "2 restores in a row failed" in read_quarantine(settings)["k1"], "persisted for `thaw ls`"
    entries = q.mark([{"key": "k1", "state": "ready", "reason": ""}, {"key": "k2", "state": "ready", "reason": ""}])
    assert [(e["key"], e["state"]) for e in entries] == [("k1", "quarantined"), ("k2", "ready")]
    assert entries[0]["reason"].startswith("2 restores in a row failed")
    images = FakeImages()
    assert q.evict("k1", images) and images.evicted == ["k1"]
    assert q.reason("k1") is None and read_quarantine(settings) == {}


@pytest.mark.parametrize("key", ["", "../etc", "a/b", "x" * 201])
def test_evict_refuses_what_is_no_key(settings, key):
    images = FakeImages()
    with pytest.raises(UserError, match="is not a valid key") as e:
        Quarantine(settings).evict(key, images)
    assert e.value.fields["field"] == "workload_key" and images.evicted == []
