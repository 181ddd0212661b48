"""control/dev/podwatch.py: a watch's events folded into when each pod appeared,
was bound, became Ready and went (the times bench/cluster.py reports)."""
from __future__ import annotations

from control.dev.podwatch import all_gone, fold, is_ready, ready_count


def pod(uid: str, node: str = "", ready: str | None = None, since: str = "", deleting: bool = False,
        restarts: int = 0) -> dict:
    meta = {"name": f"p-{uid}", "uid": uid, "creationTimestamp": "2026-12-04T18:00:00Z"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-04T18:01:00Z"
    status: dict = {"phase": "Running" if node else "Pending",
                    "containerStatuses": [{"restartCount": restarts}]}
    if ready is not None:
        status["conditions"] = [{"type": "PodScheduled", "status": "True"},
                                {"type": "Ready", "status": ready, "lastTransitionTime": since}]
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}, "status": status}


def test_a_pod_is_timed_from_its_first_event_to_its_first_ready():
    ps: dict = {}
    fold(ps, "ADDED", pod("1"), 10.0)
    fold(ps, "MODIFIED", pod("1", node="n-a", ready="False"), 10.2)
    fold(ps, "MODIFIED", pod("1", node="n-a", ready="True", since="2026-12-04T18:00:03Z"), 13.5)
    fold(ps, "MODIFIED", pod("1", node="n-a", ready="False"), 14.0)
    fold(ps, "MODIFIED", pod("1", node="n-a", ready="True", since="2026-12-04T18:00:09Z", restarts=1), 19.0)
    p = ps["1"]
    assert (p.first_seen, p.bound_seen, p.ready_seen) == (10.0, 10.2, 13.5)
    assert p.node == "n-a" and p.ready_transition == "2026-12-04T18:00:03Z" and p.restarts == 1
    assert p.created == "2026-12-04T18:00:00Z" and p.phase == "Running"
    assert ready_count(ps) == 1 and not all_gone(ps)


def test_a_deleted_pod_no_longer_counts_and_is_gone_only_at_its_deleted_event():
    ps: dict = {}
    fold(ps, "ADDED", pod("1", node="n-a", ready="True"), 1.0)
    fold(ps, "ADDED", pod("2", node="n-b"), 1.1)
    assert ready_count(ps) == 1
    fold(ps, "MODIFIED", pod("1", node="n-a", ready="True", deleting=True), 5.0)
    assert ready_count(ps) == 0 and ps["1"].deleted_seen == 5.0 and not all_gone(ps)
    fold(ps, "DELETED", pod("1", node="n-a", deleting=True), 6.0)
    fold(ps, "DELETED", pod("2", node="n-b"), 6.5)
    assert ps["1"].gone_seen == 6.0 and ps["2"].deleted_seen == 6.5 and all_gone(ps)


def test_an_object_without_a_uid_is_ignored_and_readiness_needs_the_ready_condition():
    ps: dict = {}
    fold(ps, "ADDED", {"metadata": {"name": "x"}}, 1.0)
    assert ps == {}
    assert is_ready(pod("1")) == (False, "")
    assert is_ready(pod("1", ready="True", since="t")) == (True, "t")
    assert is_ready({"status": {"conditions": [{"type": "ContainersReady", "status": "True"}]}}) == (False, "")
