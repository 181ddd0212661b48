"""Parked sandboxes' rules (control/thawd/parking.py): which container may adopt
which parked sandbox, the budget, idle expiry, the flags a park runs with.
The runsc, containerd and relay parts run for real in
tests/integration/test_parking.py; here only the bookkeeping: Parking with its
parts (settings, the container records, metrics; no image source, no worker
pool) and records that never had a sandbox."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

from control import config
from control.thawd import parked as pd
from control.thawd import parking as pk
from control.thawd.containers import Containers, RuntimeRef
from control.thawd.metrics import Metrics

SPEC = {
    "ociVersion": "1.0.2",
    "process": {"args": ["/app/run.sh"], "env": ["A=1"], "cwd": "/", "terminal": False},
    "root": {"path": "rootfs"},
    "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
    "linux": {"cgroupsPath": "/thaw/c1", "namespaces": [{"type": "pid"}, {"type": "network"}]},
    "annotations": {"thaw.dev/workload": "counter"},
}


def parking(tmp: Path, **env: str) -> pk.Parking:
    """Parking and the parts it is given: settings, the container records, metrics."""
    (tmp / "empty.toml").write_text("")
    s = config.load(environ={"THAW_NODE_STATE_DIR": str(tmp / "state"), "THAW_PARK_ENABLED": "true", **env},
                    config_file=tmp / "empty.toml")
    metrics = Metrics()
    return pk.Parking(s, tmp / "state" / "thawd", Containers(s, metrics, None, None), images=None, metrics=metrics,
                      pool=None)


def rt(cid: str, root: str = "/run/ctrd/runsc/thaw", flags=("--root=/run/ctrd/runsc/thaw", "--platform=systrap")):
    return RuntimeRef(cid, Path(f"/b/{cid}"), Path(root), tuple(flags) + (f"--log=/b/{cid}/log.json",))


def created(p: pk.Parking, cid: str, stdio: str = "null,null,null", **kw) -> RuntimeRef:
    """A container whose create told thawd its stdio (PrepareRestoreRequest.stdio)."""
    r = rt(cid, **kw)
    p.containers.begin(r, stdio)
    return r


def take(p: pk.Parking, r: RuntimeRef, spec: dict, key: str) -> pd.Parked | None:
    """What prepare.py asks: a parked sandbox for `r`, with the stdio its record holds."""
    return p.take(r, spec, key, p.containers.stdio_of(r))


def parked(p: pk.Parking, pid: str, key: str = "k", spec=SPEC, state=pd.PARKED, host=100, created=1.0,
           flags=("--root=/run/ctrd/runsc/thaw", "--platform=systrap", "--log=/b/c0/log.json")) -> pd.Parked:
    import os
    rec = pd.Parked(pid, key, "/run/ctrd/runsc/thaw", list(flags), f"/nonexistent/{pid}", pd.fingerprint(spec),
                    state=state, host_bytes=host, created=created, pid=os.getpid())   # a live "sandbox"
    p._parked[pid] = rec
    return rec


def test_fingerprint_ignores_only_what_thaw_makes_for_the_parked_sandbox():
    other = copy.deepcopy(SPEC)
    other["root"]["path"] = "/var/lib/thaw/thawd/parked/x/rootfs"
    other["linux"]["cgroupsPath"] = "/thaw/thaw-parked-x"
    assert pd.fingerprint(other) == pd.fingerprint(SPEC)
    for change in (lambda s: s["process"]["env"].append("B=2"), lambda s: s["mounts"].append(
            {"destination": "/data", "type": "bind", "source": "/srv/data"}),
            lambda s: s["annotations"].update({"x": "y"}), lambda s: s["linux"].update(
            {"resources": {"memory": {"limit": 1 << 30}}})):
        s = copy.deepcopy(SPEC)
        change(s)
        assert pd.fingerprint(s) != pd.fingerprint(SPEC)


def test_parkable():
    assert pd.parkable(SPEC) == ""
    joins = copy.deepcopy(SPEC)
    joins["linux"]["namespaces"][1]["path"] = "/var/run/netns/x"
    assert "network namespace" in pd.parkable(joins)
    tty = copy.deepcopy(SPEC)
    tty["process"]["terminal"] = True
    assert "terminal" in pd.parkable(tty)


def test_flags_less_and_with_the_per_container_logs(tmp_path):
    flags = ["--root=/r", "--log=/b/c1/log.json", "--log-format=json", "--panic-log=/l/c1/panic",
             "--platform=systrap", "--log", "/b/c1/other.json"]
    assert pd.shared_flags(flags) == ["--root=/r", "--log-format=json", "--platform=systrap"]
    out = pd.park_flags(flags, tmp_path)
    assert out == ["--root=/r", "--platform=systrap", f"--log={tmp_path / pd.RUNSC_LOG}", "--log-format=json",
                   f"--panic-log={tmp_path / 'panic.log'}"]


@pytest.mark.parametrize("path,want", [
    ("/thaw/c1", "/thaw/thaw-parked-1"),
    ("/c1", "/thaw-parked-1"),
    ("system.slice:cri-containerd:c1", "system.slice:cri-containerd:thaw-parked-1"),
    ("", ""),
])
def test_cgroups_path_is_beside_the_templates(path, want):
    assert pd.cgroups_path(path, "thaw-parked-1") == want


def test_take_matches_key_root_flags_and_spec(tmp_path):
    p = parking(tmp_path)
    parked(p, "thaw-parked-a")
    other_env = copy.deepcopy(SPEC)
    other_env["process"]["env"] = ["A=2"]
    assert take(p, created(p, "x"), other_env, "k") is None, "another spec: a plain restore"
    assert take(p, created(p, "x"), SPEC, "other-key") is None
    assert take(p, created(p, "x", root="/run/ctrd/runsc/other"), SPEC, "k") is None
    assert take(p, created(p, "x", flags=("--root=/run/ctrd/runsc/thaw", "--platform=ptrace")), SPEC, "k") is None
    assert take(p, created(p, "x", stdio="null,pipe,pipe"), SPEC, "k") is None, "another kind of stdio"
    assert not any(q.adopted_by for q in p._parked.values())
    assert take(p, rt("unknown"), SPEC, "k") is None, "a container whose stdio thawd was not told"
    # Another --log (the adopter's own bundle) is fine, and so is another order of the flags (the
    # shim renders runsc.toml's from a Go map).
    got = take(p, created(p, "x", flags=("--platform=systrap", "--root=/run/ctrd/runsc/thaw")), SPEC, "k")
    assert got is not None and got.id == "thaw-parked-a" and got.state == pd.ADOPTING and got.adopted_by == "x"
    assert take(p, created(p, "y"), SPEC, "k") is None, "a parked sandbox is adopted once"


def test_the_gauges_count_parking_and_parked_sandboxes_and_their_host_memory(tmp_path):
    """thaw_parked_sandboxes and thaw_parked_host_bytes: what a park holds (measured, or
    its estimate while it parks); an adopted one is the container's, no longer counted."""
    p = parking(tmp_path)
    parked(p, "p-a", key="k", host=400 << 20)
    parked(p, "p-b", key="other", host=300 << 20)
    parking_now = parked(p, "p-c", key="other", state=pd.PARKING, host=0)
    parking_now.estimate_bytes = 50 << 20
    parked(p, "p-d", key="k", state=pd.ADOPTED, host=900 << 20)
    assert take(p, created(p, "x"), SPEC, "k").id == "p-a"        # adopting: the gauges move
    v = {ln.split()[0]: float(ln.split()[1]) for ln in p.metrics.render().splitlines() if ln.startswith("thaw_parked")}
    assert v["thaw_parked_host_bytes"] == (300 + 50) << 20 and v["thaw_parked_sandboxes"] == 2


def test_stdio_kinds_are_checked(tmp_path):
    c = parking(tmp_path).containers
    c.begin(rt("a"), "pipe,pipe,pipe")
    c.begin(rt("b"), "pipe,bogus,pipe")
    c.begin(rt("c"), "")
    assert c.stdio_of(rt("a")) == "pipe,pipe,pipe"
    assert c.stdio_of(rt("b")) == "other,other,other", "what the stand-in said is not trusted blindly"
    assert c.stdio_of(rt("c")) == ""


def test_take_refuses_what_cannot_be_parked_and_when_off(tmp_path):
    p = parking(tmp_path)
    parked(p, "thaw-parked-a")
    joins = copy.deepcopy(SPEC)
    joins["linux"]["namespaces"][1]["path"] = "/var/run/netns/x"
    assert take(p, created(p, "x"), joins, "k") is None
    off = parking(tmp_path, THAW_PARK_ENABLED="false")
    parked(off, "thaw-parked-b")
    assert take(off, created(off, "x"), SPEC, "k") is None


def test_budget_removes_less_recently_started_keys_first(tmp_path, monkeypatch):
    p = parking(tmp_path, THAW_PARK_MEMORY_BUDGET_BYTES="1000m")
    destroyed = []
    monkeypatch.setattr(p, "_destroy", lambda rec, why, relay=None: (destroyed.append(rec.id),
                                                                      p._parked.pop(rec.id)))
    for key, when in (("old", 10.0), ("mid", 20.0), ("new", 30.0)):
        p._templates[key] = pd.Template(key, "/r", [], SPEC, "thaw", "overlayfs", "sha256:x", last_demand=when)
    parked(p, "p-old", key="old", host=400 << 20)
    parked(p, "p-mid", key="mid", host=400 << 20)
    assert p._make_room(p._templates["new"], 300 << 20) is True
    assert destroyed == ["p-old"]
    # A park of the least recently started key never pushes out a more recent one.
    assert p._make_room(p._templates["old"], 900 << 20) is False
    assert destroyed == ["p-old"]


def test_adopted_sandboxes_do_not_count_against_the_budget(tmp_path):
    p = parking(tmp_path, THAW_PARK_MEMORY_BUDGET_BYTES="1000m")
    p._templates["k"] = pd.Template("k", "/r", [], SPEC, "thaw", "overlayfs", "sha256:x", last_demand=1.0)
    parked(p, "p-adopted", state=pd.ADOPTED, host=900 << 20)
    assert p._make_room(p._templates["k"], 900 << 20) is True


def test_expire_removes_only_idle_parked_sandboxes(tmp_path, monkeypatch):
    p = parking(tmp_path, THAW_PARK_IDLE_S="100")
    destroyed = []
    monkeypatch.setattr(p, "_destroy", lambda rec, why, relay=None: destroyed.append(rec.id))
    p._templates["k"] = pd.Template("k", "/r", [], SPEC, "thaw", "overlayfs", "sha256:x", last_demand=1000.0)
    parked(p, "p-fresh", created=1050.0)
    parked(p, "p-adopted", state=pd.ADOPTED, created=0.0)
    assert p.expire(now=1090.0) == []
    assert p.expire(now=1200.0) == ["p-fresh"]
    assert destroyed == ["p-fresh"]


def test_recover_removes_unadopted_records_and_keeps_adopted_ones(tmp_path, monkeypatch):
    p = parking(tmp_path)
    root = tmp_path / "root"
    root.mkdir()
    for pid, state, adopter in (("p-left", pd.PARKED, ""), ("p-live", pd.ADOPTED, "c1"), ("p-gone", pd.ADOPTED, "c2")):
        rec = pd.Parked(pid, "k", str(root), [], str(p.dir / pid), "fp", state=state, adopted_by=adopter)
        Path(rec.dir).mkdir(parents=True)
        p._save(rec)
    (p.dir / "p-junk").mkdir()          # no record at all
    (root / (pd.ALIAS_PREFIX + "c1")).symlink_to("p-live")
    destroyed = []
    monkeypatch.setattr(p, "_destroy", lambda rec, why, relay=None: destroyed.append(rec.id))
    p.recover()
    assert sorted(destroyed) == ["p-gone", "p-left"]
    assert not (p.dir / "p-junk").exists()
    assert p.get(p.containers.adopted(RuntimeRef("c1", Path("/b"), root, ()))).id == "p-live"


def test_host_memory_of_this_process_has_no_memfd():
    import os
    m = pd.host_memory(os.getpid())
    assert m["processes"] >= 1 and m["memfd_bytes"] == 0 and m["rss_kb"] > 0


def test_fingerprint_names_which_kind_of_network_not_which_namespace():
    lo_a, lo_b = copy.deepcopy(SPEC), copy.deepcopy(SPEC)
    lo_a["linux"]["namespaces"][1]["path"] = "/var/run/netns/gpu-node-a"
    lo_b["linux"]["namespaces"][1]["path"] = "/var/run/netns/thawpark-1"
    assert pd.fingerprint(lo_a) == pd.fingerprint(lo_b), "two loopback-only namespaces are one network"
    assert pd.fingerprint(lo_a) != pd.fingerprint(SPEC), "loopback-only is not a new, empty namespace"


def test_sandbox_processes_runsc_no_longer_knows_are_killed_by_root_and_id():
    """A parked sandbox whose runsc state is gone (its root removed) still runs:
    _destroy kills its processes by name, and only those of that root and id."""
    import subprocess
    import sys
    import time

    def fake(root: str, cid: str) -> subprocess.Popen:
        return subprocess.Popen(["bash", "-c", f'exec -a runsc-sandbox {sys.executable} -c "import time; '
                                 f'time.sleep(60)" --root={root} {cid}'])
    mine, other_root, other_id = fake("/r/thaw", "thaw-parked-x"), fake("/r/other", "thaw-parked-x"), \
        fake("/r/thaw", "thaw-parked-y")
    try:
        time.sleep(0.5)     # exec'd: its command line is the fake one
        assert pd._kill_sandbox_processes("/r/thaw", "thaw-parked-x") == [mine.pid]
        assert mine.wait(10) == -9
        assert other_root.poll() is None and other_id.poll() is None
    finally:
        for p in (mine, other_root, other_id):
            p.kill()
            p.wait(10)


def test_a_parked_sandbox_whose_process_is_gone_is_removed_not_adopted(tmp_path, monkeypatch):
    p = parking(tmp_path)
    dead = parked(p, "thaw-parked-dead", created=0.5)
    dead.pid = 2 ** 22 + 12345        # beyond pid_max's default: no such process
    live = parked(p, "thaw-parked-live", created=1.0)
    destroyed = []
    monkeypatch.setattr(p, "_destroy", lambda rec, why, relay=None: (destroyed.append(rec.id),
                                                                      p._parked.pop(rec.id)))
    assert take(p, created(p, "x"), SPEC, "k") is live
    assert destroyed == ["thaw-parked-dead"]

