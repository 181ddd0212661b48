"""The containerd door's container record (control/thawd/containers.py): every
transition of its table, the illegal ones refused, and the bookkeeping each verb
of thawd does on it (a pending decision ends once, a lease goes once)."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from control import config
from control.errors import InvalidTransition, UserError
from control.thawd import containers as cm
from control.thawd.containers import TRANSITIONS, Containers, RuntimeRef, State
from control.thawd.metrics import Metrics
from runsc_hooks import gate as gatemod

ALL: list[State | None] = [None, *State]


class FakeLease:
    streamed = False

    def __init__(self, name: str) -> None:
        self.name, self.released = name, 0

    def describe(self, holder: str) -> None:   # Restorable: who holds it (`thaw evict`)
        self.holder = holder

    def release(self) -> None:
        self.released += 1


@pytest.fixture
def box(tmp_path, monkeypatch):
    (tmp_path / "empty.toml").write_text("")
    s = config.load(environ={"THAW_NODE_STATE_DIR": str(tmp_path / "state")}, config_file=tmp_path / "empty.toml")
    opened: list[str] = []
    monkeypatch.setattr(gatemod, "open", lambda name, reason="": opened.append(name) or 0)
    c = Containers(s, Metrics(), identify=None, identify_sandbox=None)
    c.opened = opened
    return c


def rt(cid: str = "c1") -> RuntimeRef:
    return RuntimeRef(cid, Path(f"/b/{cid}"), Path("/run/r"), ("--root=/run/r",))


def test_the_states_are_the_markers_words():
    """Twin: go/internal/standin/marker.go marker.Decision, plus thawd's own two."""
    assert {s.value for s in State} == {"preparing", "restore", "adopt", "restoring", "restored", "cold",
                                        "cold-fallback", "satisfied", "released"}
    assert set(TRANSITIONS) == set(ALL), "every state has a row"
    assert TRANSITIONS[State.RELEASED] == frozenset(), "released is the end"


@pytest.mark.parametrize("current, wanted", list(itertools.product(ALL, list(State))))
def test_every_transition_is_allowed_or_refused_by_the_table(current, wanted):
    if wanted in TRANSITIONS[current]:
        cm.check_transition("c1", current, wanted)
    else:
        with pytest.raises(InvalidTransition) as e:
            cm.check_transition("c1", current, wanted)
        assert e.value.fields["current"] == (current.value if current else "absent")
        assert e.value.fields["wanted"] == wanted.value


@pytest.mark.parametrize("current, wanted", [(c, w) for c, w in itertools.product(ALL, list(State))
                                              if w not in TRANSITIONS[c]])
def test_an_illegal_move_of_a_record_fails_loudly_and_changes_nothing(box, current, wanted):
    r = rt()
    if current is not None:
        box._map[r.k] = cm.Container(r, state=current, key="k")
    with pytest.raises(InvalidTransition):
        box.move(r, wanted)
    assert box.state_of(r) == current


def test_restore_path_create_restore_start_restored_delete(box):
    r, lease = rt(), FakeLease("img")
    box.begin(r, "null,pipe,pipe")
    assert box.state_of(r) == State.PREPARING and box.stdio_of(r) == "null,pipe,pipe"
    assert box.claim(r, lease)
    box.decide(r, State.RESTORE, "k", gate="g1")
    assert box.get(r).pending and box.lease_of(r) is lease
    assert box.start_restore(r) == ("k", "g1")
    assert box.state_of(r) == State.RESTORING and not box.get(r).pending
    assert box.start_restore(r) == ("k", None), "the gate is handed over once"
    box.restored(r)
    assert box.state_of(r) == State.RESTORED
    c = box.release(r)
    assert c.state == State.RELEASED and box.get(r) is None and lease.released == 1
    assert box.release(r) is None and lease.released == 1, "released once"
    assert box.opened == [], "nothing pending ended unrestored"


def test_a_decision_released_before_its_restore_ends_abandoned_and_opens_its_gate(box):
    r, lease = rt(), FakeLease("img")
    box.begin(r)
    box.claim(r, lease)
    box.decide(r, State.RESTORE, "k", gate="g1")
    box.release(r, "the stand-in was killed")
    assert box.opened == ["g1"] and lease.released == 1
    assert box.metrics.counters().get("thaw_restores_abandoned_total") == 1


def test_a_new_create_of_the_same_id_ends_the_pending_decision_once(box):
    r = rt()
    box.begin(r)
    box.decide(r, State.ADOPT, "k", adopted="thaw-parked-1", image=FakeLease("parked"))
    box.begin(r)
    assert box.state_of(r) == State.PREPARING and box.opened == []
    assert box.metrics.counters().get("thaw_restores_abandoned_total") == 1


def test_a_second_create_while_restoring_is_refused(box):
    r = rt()
    box.begin(r)
    box.decide(r, State.RESTORE, "k")
    box.start_restore(r)
    with pytest.raises(UserError):
        box.begin(r)
    assert box.state_of(r) == State.RESTORING


def test_one_lease_is_claimed_by_one_container(box):
    a, b, lease = rt("a"), rt("b"), FakeLease("img")
    box.begin(a)
    box.begin(b)
    assert box.claim(a, lease) and not box.claim(b, lease)
    assert box.holds(lease) and box.lease_of(b) is None
    other = FakeLease("other")
    assert box.claim(a, other) and lease.released == 1, "the one it held before goes"


def test_a_failed_restore_keeps_the_record_and_drops_its_image(box):
    r, lease = rt(), FakeLease("img")
    box.begin(r)
    box.claim(r, lease)
    box.decide(r, State.RESTORE, "k", gate="g1")
    box.end(r, "RESTORE_FAILED", "create for restore failed")
    assert box.state_of(r) == State.COLD_FALLBACK and box.opened == ["g1"], "a restore never tried opens its gate"
    box.drop_image(r)
    assert lease.released == 1 and box.get(r) is not None and box.lease_of(r) is None


def test_a_cold_decision_keeps_what_it_leased_until_delete(box):
    r, lease = rt(), FakeLease("img")
    box.begin(r)
    box.claim(r, lease)
    box.decide(r, State.COLD, "k", reason="spec-mismatch")
    assert box.lease_of(r) is lease and lease.released == 0
    box.end(r, "COLD_STARTED", "")
    assert box.state_of(r) == State.COLD
    box.release(r)
    assert lease.released == 1


def test_an_outcome_that_does_not_fit_the_record_changes_nothing(box):
    r = rt()
    box.begin(r)
    box.decide(r, State.RESTORE, "k")
    box.start_restore(r)
    box.restored(r)
    box.end(r, "COLD_STARTED", "a late report")
    assert box.state_of(r) == State.RESTORED


def test_an_adoption_a_previous_thawd_made_is_released_with_its_container(box):
    r = rt("c1")
    box.recover_adoption(r, "thaw-parked-7")
    assert box.adopted(r) == "thaw-parked-7" and box.state_of(r) == State.RESTORED
    assert box.release(r).adopted == "thaw-parked-7"


def test_a_claimed_or_adopted_image_says_which_container_holds_it(box):
    """`thaw evict` names who holds what it could not evict (issue 33): the lease says so."""
    c = box
    lease = FakeLease("a")
    assert c.claim(rt("c1"), lease)
    assert lease.holder == "container c1"
    parked = FakeLease("p")
    c.begin(rt("c2"))
    c.decide(rt("c2"), State.ADOPT, "ctr-a.w", adopted="park-1", image=parked)
    assert parked.holder == "container c2 (adopted parked sandbox park-1)"


def test_every_state_change_passes_the_table(box, monkeypatch):
    """No verb sets a record's state behind the table's back: begin, decide, start,
    restored, end, and the settle (ABANDONED) and release a delete does all move the
    record through check_transition, so an illegal one would fail loudly there."""
    seen: list[tuple[str, str]] = []
    check = cm.check_transition

    def spy(cid, current, wanted):
        seen.append((current.value if current else "absent", wanted.value))
        check(cid, current, wanted)
    monkeypatch.setattr(cm, "check_transition", spy)
    r = rt()
    box.begin(r)
    box.claim(r, FakeLease("img"))
    box.decide(r, State.RESTORE, "k", gate="g1")
    box.release(r, "deleted before its start")
    assert seen == [("absent", "preparing"), ("preparing", "restore"), ("restore", "preparing"),
                    ("preparing", "released")], "settle, then release, each through the table"
    seen.clear()
    r2 = rt("c2")
    box.begin(r2)
    box.decide(r2, State.RESTORE, "k")
    box.start_restore(r2)
    box.restored(r2)
    box.end(r2, "RESTORE_FAILED", "the stand-in died")
    box.release(r2)
    assert seen == [("absent", "preparing"), ("preparing", "restore"), ("restore", "restoring"),
                    ("restoring", "restored"), ("restored", "cold-fallback"), ("cold-fallback", "released")]


def test_a_record_whose_state_allows_no_release_fails_loudly_at_its_delete(box):
    """release moves through the table too: a record already RELEASED (a bug: it should
    have left the map) is refused, not silently released twice."""
    r = rt()
    box._map[r.k] = cm.Container(r, state=State.RELEASED, key="k")
    with pytest.raises(InvalidTransition):
        box.release(r)
    assert box.get(r) is not None


def test_a_handle_takes_the_address_given_when_its_namespace_shows_none(tmp_path):
    """A pod's address was read at its sandbox's create, before runsc took its network
    namespace's interface over (control/thawd/podrecord.py Pod.address): probes reach it."""
    (tmp_path / "empty.toml").write_text("")
    s = config.load(environ={"THAW_NODE_STATE_DIR": str(tmp_path / "state")}, config_file=tmp_path / "empty.toml")
    c = Containers(s, Metrics(), identify=None, identify_sandbox=None)
    rt = RuntimeRef.validate("c1", str(tmp_path), "/run/r", [])
    spec = {"linux": {"namespaces": [{"type": "network"}]}}
    assert c.handle(rt, spec).address is None
    assert c.handle(rt, spec, address="10.218.4.7").address == "10.218.4.7"
