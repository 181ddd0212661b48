"""Parked sandboxes under containerd (park.enabled; control/thawd/parking.py,
docs/parking.md): real containerd + gVisor's shim + thaw's stand-in + runsc +
thawd + SeaweedFS + thaw-relay + containerd's snapshotter. A container of a
workload this node checkpointed adopts a sandbox thawd restored ahead of
demand; everything the shim does with it afterwards (exec, state, kill,
delete, its stdout) reaches that sandbox. CPU only here: the GPU part (the
CUDA state parked and woken) runs on the H200 (bench/gpu/node.sh --park)."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from control.dev.containerd import NAMESPACE
from control.dev.testbed import ANNOTATIONS, IMAGE, Stack
from control.thawd import parked as pd
from control.thawd import parking as pk

from tests.conftest import BUILD, require


@pytest.fixture
def ps(name, runsc_bin, request):
    require((BUILD / "thaw-runsc").is_file(), "the stand-in built at build/thaw-runsc")
    require((BUILD / "thaw-relay").is_file(), "build/thaw-relay (make setup)")
    require((BUILD / "busybox").is_file(), "build/busybox (make setup)")
    base = Path(f"/tmp/thaw-it/{name}")
    subprocess.run(["rm", "-rf", str(base)])
    for d in _parked_cgroups():       # an earlier run's: rmdir takes only empty cgroups
        subprocess.run(["rmdir", str(d)], capture_output=True)
    env = {"THAW_PARK_ENABLED": "true", **getattr(request, "param", {})}
    s = Stack(base, name, extra_env=env)
    try:
        yield s.start()
    finally:
        s.stop()
        leaked = _sandboxes_under(base)
        for pid in leaked:
            subprocess.run(["kill", "-9", str(pid)], capture_output=True)
        _unmount_under(base)
        subprocess.run(["rm", "-rf", str(base)])
    # thawd's stop removes what it parked, also when containerd went first and took the runsc
    # root with it (control/dev/containerd.py stop): a parked sandbox left running holds memory.
    assert leaked == [], f"sandbox processes left running after the stack stopped: {leaked}"
    # Nor their cgroups: runsc's delete removes those it made, thawd those of a sandbox
    # runsc no longer knew (containerd's stop takes the runsc root with it).
    cgroups = _parked_cgroups()
    for d in cgroups:
        subprocess.run(["rmdir", str(d)], capture_output=True)
    assert cgroups == [], f"parked sandboxes' cgroups left after the stack stopped: {cgroups}"


def _parked_cgroups() -> list[Path]:
    return sorted(p for p in Path("/sys/fs/cgroup").glob(f"*/{NAMESPACE}/{pd.ID_PREFIX}*") if p.is_dir())


def _sandboxes_under(base: Path) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if d.name.isdigit() and Path(argv[0].decode(errors="replace")).name in ("runsc-sandbox", "runsc-gofer") \
                and any(str(base).encode() in a for a in argv):
            out.append(int(d.name))
    return out


def _unmount_under(base: Path) -> None:
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
              if line.split()[1].startswith(str(base))]
    for m in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", m], capture_output=True)


def parked_dir(s: Stack) -> Path:
    return s.base / "state" / "thawd" / pd.PARKED_DIR


def records(s: Stack) -> list[dict]:
    d = parked_dir(s)
    out = []
    for r in sorted(d.glob(f"*/{pd.RECORD}")) if d.is_dir() else []:
        try:
            out.append(json.loads(r.read_text()))
        except ValueError:
            pass
    return out


def wait_parked(s: Stack, n: int = 1, timeout_s: float = 90) -> list[dict]:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        recs = [r for r in records(s) if r["state"] == pd.PARKED]
        if len(recs) >= n:
            return recs
        time.sleep(0.2)
    raise AssertionError(f"no {n} parked sandbox(es) within {timeout_s}s: {records(s)}; thawd log:\n"
                         f"{(s.base / 'thawd.log').read_text()[-3000:]}")


def runsc_list(s: Stack) -> list[str]:
    root = s.ctrd.runsc_root / "thaw"
    p = subprocess.run([str(BUILD / "runsc"), f"--root={root}", "list", "-quiet"], capture_output=True, text=True)
    return p.stdout.split()


def snapshots(s: Stack) -> str:
    return s.ctrd.ctr("snapshots", "ls", check=False).stdout


def seed(s: Stack) -> str:
    """A cold container, checkpointed and published; then a sandbox parked. Its boot id."""
    s.ctrd.run(IMAGE, "seed", ANNOTATIONS)
    boot, _ = s.state("seed")
    s.wait_published()
    wait_parked(s)
    s.ctrd.remove("seed")
    return boot


def test_next_container_adopts_the_parked_sandbox(ps):
    boot = seed(ps)
    [rec] = wait_parked(ps)
    assert rec["pid"] > 0 and rec["host_bytes"] > 0 and rec["cuda_pids"] == []
    assert rec["stdio"] == "null,null,null" and rec["relay_pid"] == 0, "--null-io: /dev/null, no relay"
    assert rec["id"] in runsc_list(ps)
    assert rec["id"] in snapshots(ps), "its root filesystem is a snapshot of containerd's"

    ps.ctrd.run(IMAGE, "web", ANNOTATIONS)
    got, i = ps.state("web")          # ctr task exec: runsc exec through the alias
    assert got == boot, "the container must be the parked sandbox, with the checkpointed memory"
    d = [x for x in ps.decisions() if x["id"] == "web"]
    assert [x["decision"] for x in d] == ["adopt", "restored"], d
    assert Path(ps.ctrd.runsc_root / "thaw" / (pd.ALIAS_PREFIX + "web")).readlink() == Path(rec["id"])
    assert "web" not in runsc_list(ps), "no sandbox of the container's own id: it is the parked one"
    tasks = ps.ctrd.ctr("task", "ls").stdout
    assert any(line.split()[0] == "web" and "RUNNING" in line for line in tasks.splitlines()[1:]), tasks
    c = ps.stats()["counters"]
    assert c.get("thaw_adoptions_total") == 1 and c.get("thaw_restores_total") == 1, c
    assert c.get('thaw_parks_total{result="parked"}', 0) >= 1, c
    # The adoption parks the next one.
    nxt = wait_parked(ps)
    assert [r["id"] for r in nxt] != [rec["id"]]

    # The shim's kill and delete reach the adopted sandbox; what it held goes with it.
    ps.ctrd.remove("web")
    assert rec["id"] not in runsc_list(ps)
    assert not (ps.ctrd.runsc_root / "thaw" / (pd.ALIAS_PREFIX + "web")).is_symlink()
    assert not (parked_dir(ps) / rec["id"]).exists()
    assert rec["id"] not in snapshots(ps)
    assert all(e["leases"] <= 1 for e in ps.stats()["entries"]), "only the new parked sandbox holds a lease"


def attached(s: Stack, cid: str) -> subprocess.Popen:
    """`ctr run` without -d: the shim gives the container pipes to ctr's FIFOs, and
    ctr prints the container's stdout (the workload ticks: TICK=1)."""
    argv = [str(s.ctrd.build / "ctr"), "-a", str(s.ctrd.socket), "-n", "thaw", "run", "--runtime",
            "io.containerd.runsc.v1", "--runtime-config-path", str(s.ctrd.runsc_toml),
            "--annotation", "io.kubernetes.cri.container-type=sandbox",
            "--annotation", f"io.kubernetes.cri.sandbox-id={cid}"]
    for k, v in ANNOTATIONS.items():
        argv += ["--annotation", f"{k}={v}"]
    argv += ["--env", "TICK=1", IMAGE, cid]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            env=s.ctrd.env())


def detach(p: subprocess.Popen) -> None:
    """An attached ctr's end: it returns when its container is deleted."""
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(10)
    for f in (p.stdout, p.stderr):
        if f is not None:
            f.close()


def test_adopted_container_stdout_reaches_containerd(ps):
    """A workload checkpointed with pipes as its stdio is parked with pipes to a relay;
    the adopter's stdout (ctr attached: the shim's pipes to its FIFOs) then gets the
    parked sandbox's output, and its stdio kinds are recorded with the park."""
    seed = attached(ps, "seed")
    try:
        boot, _ = ps.state("seed")
        ps.wait_published()
        [rec] = wait_parked(ps)
        assert rec["stdio"] == "pipe,pipe,pipe" and rec["relay_pid"] > 0, rec
    finally:
        ps.ctrd.remove("seed")
        detach(seed)
    ctr = attached(ps, "talk")
    try:
        got, _ = ps.state("talk")
        assert got == boot
        d = [x["decision"] for x in ps.decisions() if x["id"] == "talk"]
        assert d == ["adopt", "restored"], d
        try:
            line = _read_line(ctr, 30)
        except AssertionError as e:
            ctr.kill()
            raise AssertionError(f"{e}; ctr exited {ctr.wait(10)}: {ctr.stderr.read()[-2000:]!r}") from None
        assert line.startswith(f"tick {boot} "), line
    finally:
        ps.ctrd.remove("talk")
        detach(ctr)


def test_other_stdio_restores_instead_of_adopting(ps):
    """Parked with /dev/null (the seed ran with --null-io), not adopted by an attached
    container: its writes to a pipe would fail (docs/parking.md, stdio kinds)."""
    boot = seed(ps)
    ctr = attached(ps, "loud")
    try:
        assert ps.state("loud")[0] == boot
        d = [x["decision"] for x in ps.decisions() if x["id"] == "loud"]
        assert d == ["restore", "restored"], d
    finally:
        ps.ctrd.remove("loud")
        detach(ctr)


def _read_line(p: subprocess.Popen, timeout_s: float) -> str:
    import select
    end = time.monotonic() + timeout_s
    buf = b""
    while time.monotonic() < end:
        r, _, _ = select.select([p.stdout], [], [], 0.5)
        if r:
            chunk = os.read(p.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
            for line in buf.decode(errors="replace").splitlines():
                if line.startswith("tick "):
                    return line
    raise AssertionError(f"no tick line from the adopted container within {timeout_s}s: {buf[-500:]!r}")


def test_another_spec_restores_instead_of_adopting(ps):
    boot = seed(ps)
    [rec] = wait_parked(ps)
    ps.ctrd.run(IMAGE, "other", ANNOTATIONS, env={"EXTRA": "1"})   # same key, another spec
    got, _ = ps.state("other")
    assert got == boot
    d = [x["decision"] for x in ps.decisions() if x["id"] == "other"]
    assert d == ["restore", "restored"], d
    assert [r["id"] for r in records(ps) if r["state"] == pd.PARKED] == [rec["id"]], "the parked one stays"
    ps.ctrd.remove("other")


def test_thawd_stop_removes_parked_sandboxes_and_spares_adopted_ones(ps):
    boot = seed(ps)
    ps.ctrd.run(IMAGE, "kept", ANNOTATIONS)
    assert ps.state("kept")[0] == boot
    [adopted] = [r for r in records(ps) if r["state"] == pd.ADOPTED]
    [spare] = wait_parked(ps)
    ps.stop_thawd()
    assert spare["id"] not in runsc_list(ps), "a parked sandbox nobody adopted goes with thawd"
    assert not (parked_dir(ps) / spare["id"]).exists()
    assert spare["id"] not in snapshots(ps)
    assert adopted["id"] in runsc_list(ps), "an adopted one is its container's"
    ps.start_thawd()
    assert ps.state("kept")[0] == boot
    ps.ctrd.remove("kept")      # delete reaches the restarted thawd, which releases it
    assert adopted["id"] not in runsc_list(ps)
    assert not (parked_dir(ps) / adopted["id"]).exists()
    assert adopted["id"] not in snapshots(ps)


@pytest.mark.parametrize("ps", [{"THAW_PARK_MEMORY_BUDGET_BYTES": "1m"}], indirect=True)
def test_a_park_over_the_budget_is_not_made(ps):
    ps.ctrd.run(IMAGE, "seed", ANNOTATIONS)
    ps.state("seed")
    ps.wait_published()
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if ps.stats()["counters"].get('thaw_parks_total{result="no-budget"}'):
            break
        time.sleep(0.3)
    else:
        raise AssertionError(f"no no-budget park: {ps.stats()['counters']}")
    assert records(ps) == [] and [i for i in runsc_list(ps) if i.startswith(pd.ID_PREFIX)] == []
    ps.ctrd.run(IMAGE, "next", ANNOTATIONS)
    assert [x["decision"] for x in ps.decisions() if x["id"] == "next"] == ["restore", "restored"]
    ps.ctrd.remove("next")
    ps.ctrd.remove("seed")
