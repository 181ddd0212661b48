"""Pod tables (control/thawd/podtables.py): which version's table a pod picks, on the
node and from the store, and what a table from the store must prove. The store
is a fake of the three calls podtables makes (tests/integration/test_cri_nodes.py
runs them against SeaweedFS)."""
from __future__ import annotations

import json

import pytest

from control.images import keys as keysmod
from control.thawd import podtables as pt

LOOKUP = "k8s-team.web.0123456789"
CONTAINERS = {"app": {"key": "k8s-team.web.abc", "spec": {"args": "x"}, "gpus": 1}}


class FakeStore:
    """The tenant's store view, as much of it as podtables uses."""

    def __init__(self, manifest_key: bytes | None = None, tenant_key: bytes | None = None) -> None:
        self.objects: dict[str, bytes] = {}
        self.manifest_key, self.tenant_key, self.tenant = manifest_key, tenant_key, "k8s-team"
        self.times: dict[str, float] = {}

    def pod_table_name(self, lookup: str, key: str) -> str:
        return f"tenants/k8s-team/pods/{lookup}/{key}.json"

    def put_pod_table(self, lookup: str, key: str, body: bytes) -> None:
        self.objects[key] = body
        self.times[key] = len(self.times)

    def get_pod_table(self, lookup: str, key: str, max_bytes: int) -> bytes | None:
        body = self.objects.get(key)
        return None if body is None else body[:max_bytes + 1]

    def list_pod_tables(self, lookup: str, limit: int) -> list[tuple[str, float]]:
        return sorted(((k, t) for k, t in self.times.items()), key=lambda kt: -kt[1])[:limit]


@pytest.mark.parametrize("name, hint", [
    ("web-5d4f8c7b9-x2x7q", "web-5d4f8c7b9"),      # a Deployment's pod: its ReplicaSet, one version
    ("web-5d4f8c7b9-xaxaq", "web-5d4f8c7b9-xaxaq"),  # vowels: no generated suffix
    ("web-0", "web-0"),                            # a StatefulSet's: its own name
    ("", "")])
def test_the_hint_is_the_pods_name_less_what_kubernetes_generated(name, hint):
    ann = {"io.kubernetes.cri.sandbox-name": name} if name else {}
    assert pt.hint_of({"annotations": ann}) == hint


def test_two_versions_keep_two_tables_and_each_pod_picks_its_own(tmp_path):
    tables = pt.PodTables(tmp_path)
    v1 = tables.put(LOOKUP, f"{LOOKUP}-v1", CONTAINERS, "web-aaa")
    v2 = tables.put(LOOKUP, f"{LOOKUP}-v2", CONTAINERS, "web-bbb")
    assert tables.pick(LOOKUP, "web-aaa") == (v1, "node")
    assert tables.pick(LOOKUP, "web-bbb") == (v2, "node")
    assert tables.pick(LOOKUP, "web-new")[0].key == v2.key, "a version with no table of its own: the newest"


def test_a_refused_table_is_picked_no_more_for_that_version(tmp_path):
    tables = pt.PodTables(tmp_path)
    tables.put(LOOKUP, f"{LOOKUP}-v1", CONTAINERS, "web-aaa")
    tables.refuse(LOOKUP, f"{LOOKUP}-v1", "web-bbb")
    assert tables.pick(LOOKUP, "web-bbb") == (None, "")
    assert tables.pick(LOOKUP, "web-aaa")[0].key == f"{LOOKUP}-v1", "its own version still picks it"
    tables.put(LOOKUP, f"{LOOKUP}-v2", CONTAINERS, "web-bbb")
    assert tables.pick(LOOKUP, "web-bbb")[0].key == f"{LOOKUP}-v2"


def test_a_node_without_tables_picks_from_the_store_and_keeps_it(tmp_path):
    store = FakeStore(manifest_key=b"m" * 32, tenant_key=b"t" * 32)
    a = pt.PodTables(tmp_path / "a", lambda lookup: store)
    a.publish(a.put(LOOKUP, f"{LOOKUP}-v1", CONTAINERS, "web-aaa"))
    body = store.objects[f"{LOOKUP}-v1"]
    assert body.startswith(keysmod.SEALED_POD_TABLE_MAGIC) and b"k8s-team.web.abc" not in body, "sealed"
    b = pt.PodTables(tmp_path / "b", lambda lookup: store)
    t, source = b.pick(LOOKUP, "web-aaa")
    assert source == "store" and t.containers == CONTAINERS
    assert b.pick(LOOKUP, "web-aaa")[1] == "node", "kept on the node"


def test_a_table_from_the_store_must_open_and_verify(tmp_path, caplog):
    signed = FakeStore(manifest_key=b"m" * 32)
    pt.PodTables(tmp_path / "a", lambda lookup: signed).publish(
        pt.Table(LOOKUP, f"{LOOKUP}-v1", CONTAINERS, ["web-aaa"], 1.0))
    doc = json.loads(signed.objects[f"{LOOKUP}-v1"])
    doc["containers"]["app"]["key"] = "k8s-team.other.abc"          # altered after signing
    signed.objects[f"{LOOKUP}-v1"] = json.dumps(doc).encode()
    assert pt.PodTables(tmp_path / "b", lambda lookup: signed).pick(LOOKUP, "web-aaa") == (None, "")
    assert "integrity tag does not verify" in caplog.text
    plain = FakeStore(tenant_key=b"t" * 32)                          # an encrypting tenant, a plaintext table
    plain.objects[f"{LOOKUP}-v1"] = json.dumps(pt.Table(LOOKUP, f"{LOOKUP}-v1", CONTAINERS).to_dict()).encode()
    plain.times[f"{LOOKUP}-v1"] = 1.0
    assert pt.PodTables(tmp_path / "c", lambda lookup: plain).pick(LOOKUP, "") == (None, "")
    assert "it is not sealed" in caplog.text


@pytest.mark.parametrize("doc, why", [
    ({"schema": "thaw.manifest"}, "not a thaw.pod-table"),
    ({**pt.Table(LOOKUP, "k8s-team.other.0123456789-x", CONTAINERS).to_dict(), "key": "k8s-team.other.0123456789-x"},
     "written for"),
    ({**pt.Table(LOOKUP, f"{LOOKUP}-v1", {}).to_dict()}, "containers must map"),
])
def test_a_table_that_is_not_one_is_refused_naming_what(doc, why):
    with pytest.raises(pt.TableError) as e:
        pt.parse(json.dumps(doc).encode(), "here", LOOKUP, f"{LOOKUP}-v1")
    assert why in e.value.message


def test_a_deeply_nested_or_huge_table_is_refused_in_one_line():
    with pytest.raises(pt.TableError) as e:
        pt.parse(b"[" * 50_000 + b"]" * 50_000, "here", LOOKUP, f"{LOOKUP}-v1")
    assert "larger than" in e.value.message or "not JSON" in e.value.message
    with pytest.raises(pt.TableError):
        pt.parse(b"[" * 20_000 + b"]" * 20_000, "here", LOOKUP, f"{LOOKUP}-v1")
