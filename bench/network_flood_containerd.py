"""The flood benchmark through the containerd door (`bench/network_flood.py --door containerd`).

The same epoll HTTP server, flood, measurements and table as the CLI door
(bench/network_flood.py), through real containerd + gVisor's shim + thaw's
stand-in + thawd + SeaweedFS (control/dev/testbed.py Stack). Each mode is a
node of its own (a Stack: its thawd runs with that mode's settings, which are
node-wide), and the modes' cycles are taken in turn as in the CLI door.

The image: a seed container of the workload starts cold (annotation
thaw.dev/ready=http:8080/health); thawd checkpoints it once automatically and
publishes the image. Every cycle then starts a NEW container of the workload
with plain `ctr run --with-ns network:<netns>` into a namespace thaw plumbed
(runsc_hooks/network.py `plumb`, the node port published to it), while the
flood runs; the stand-in asks thawd, which restores it from the cached image.
The container it replaces (the seed, then the previous cycle's) is removed
first: in mode "on" the new one takes its address.

Each cycle: open keep-alive connections to the current container, start the
flood, remove the current container and its namespace, plumb the new one,
`ctr run` the new container, then measure
- answer: time from "ready" to the first HTTP 200 on a new connection through
  the published port. "Ready" (on) is the time stamp of thawd's log line
  "gate NAME opened (restored and healthy)": the bench follows thawd's log
  every millisecond and starts asking once it sees the line, so the time to
  see it is inside the answer time. Off: `ctr run` returning (the stand-in's
  start, which waits for thawd's Restore);
- the fate of the connections that were open to the replaced container (no
  connection is open at a checkpoint in this door: the image was saved once);
- same process: the restored server's boot id is the seed's (the image's);
- runsc restore and health check seconds from thawd's outcome line, packets
  the gate held off from its "opened" line.

Mitigations on = thawd's gate and health check (the product) + the new
container's namespace gets the checkpoint's address. Off = config
thawd.gate=false and thawd.health_check=false (diagnostic keys) + a
different address per cycle.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from bench import network_flood as nf
from control.dev import ocibuild
from control.dev.testbed import BUILD, Stack
from runsc_hooks import network as netmod
from runsc_hooks import spec as specmod

IMAGE = "thaw.dev/bench/flood:1"
WORKLOAD_NAME = "flood"
ANNOTATIONS = {"thaw.dev/workload": WORKLOAD_NAME, "thaw.dev/ready": f"http:{nf.SANDBOX_PORT}/health"}
LOG_POLL_S = 0.001             # how often the bench reads thawd's log for the gate line
SLOTS_PER_MODE = 256           # /30 slots of the subnet each mode's node may use
OUTCOME_WAIT_S = 5.0            # thawd's outcome line after `ctr run` returned, at most
READY_DEADLINE_S = 150.0       # ctr run and the gate line, at most (thawd's Restore deadline is below this)
_GATE_OPENED = re.compile(r"^gate (\S+) opened \(restored and healthy\); it dropped (\d+) packets")
# control/thawd/service.py Thawd.restore's outcome line.
_OUTCOME = re.compile(r"^outcome (\S+) key=\S* RESTORED ([\d.]+)s \(runsc ([\d.]+)s, health (?:([\d.]+)s:|off)")


def image_files() -> dict[str, ocibuild.File]:
    """An empty root holding the host's usr-merged links (/lib -> usr/lib, ...), as
    runsc_hooks/spec.py prepare_host_rootfs makes for the CLI door; the host layout's
    bind mounts (`ctr run --mount`) fill it."""
    files = {d: ocibuild.File(link=os.readlink(d)) for d in specmod.HOST_SYSTEM_DIRS if os.path.islink(d)}
    files["/tmp"] = ocibuild.File(directory=True, mode=0o1777)
    return files


def _wall_to_monotonic(stamp: str, wall0: float, mono0: float) -> float:
    """thawd's log time (RFC 3339, UTC, microseconds) on this process's monotonic clock,
    given one reading of both clocks (wall0, mono0) taken moments before."""
    return mono0 + (datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() - wall0)


class LogFollower:
    """thawd's JSON log from a byte offset on; lines as dicts."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self.partial = b""

    def read(self) -> list[dict]:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        out = []
        for ln in lines:
            if ln.startswith(b"{"):
                try:
                    out.append(json.loads(ln))
                except ValueError:
                    pass
        return out


@dataclass
class Node:
    """One mode's thaw node: a Stack whose thawd runs with the mode's settings."""
    base: Path
    name: str
    mode: str                    # "on" | "off"
    node_port: int
    subnet: str
    first_slot: int              # the seed's /30 of the subnet, the checkpoint's address
    slots: int = SLOTS_PER_MODE  # this node's slots: first_slot .. first_slot + slots - 1
    stack: Stack = field(init=False)
    image: dict = field(default_factory=dict)
    cur: str = ""                # the container serving now
    cur_net: str = ""            # its network namespace (thaw-<cur_net>)
    cur_ip: str = ""
    image_ip: str = ""
    image_boot: str | None = None
    n: int = 0                   # containers started after the seed
    last: nf.Cycle | None = None

    def __post_init__(self) -> None:
        env = {"THAW_NETWORK_SUBNET": self.subnet, "THAW_THAWD_HEALTH_TIMEOUT_S": "10",
               "THAW_THAWD_HEALTH_ATTEMPT_TIMEOUT_S": "0.5"}
        if self.mode == "off":
            env.update({"THAW_THAWD_GATE": "false", "THAW_THAWD_HEALTH_CHECK": "false"})
        self.stack = Stack(self.base / self.mode, f"{self.name}-{self.mode}", extra_env=env)

    @property
    def log(self) -> Path:
        return self.stack.base / "thawd.log"

    def _plumb(self, net: str, slot: int) -> str:
        host_ip, ip, plen = netmod.slot_addresses(self.subnet, slot)
        netmod.plumb(net, host_ip, ip, plen, subnet=self.subnet, ports=(netmod.Port(self.node_port, nf.SANDBOX_PORT),))
        return ip

    def _run(self, cid: str, net: str) -> None:
        self.stack.ctrd.run(IMAGE, cid, ANNOTATIONS, netns=str(netmod.NETNS_DIR / netmod.netns_name(net)),
                            mounts=nf.server_mounts())

    def start(self) -> "Node":
        """The stack, the workload's image, and the seed: cold, then checkpointed by thawd."""
        s = self.stack.start()
        ocibuild.build(s.base / "flood.tar", IMAGE, image_files(), nf.SERVER_ARGV,
                       env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", **nf.SERVER_ENV})
        s.ctrd.import_image(s.base / "flood.tar")
        # One id per mode: the modes' containerds run side by side, and runsc puts a
        # container in the cgroup /<namespace>/<id> (ctr's cgroups path) of the host, so
        # two seeds of one id shared a cgroup, and runsc, finding it made, never removed it.
        self.cur, self.cur_net = f"{self.mode}-seed", f"{self.name}-{self.mode}-seed"
        self.cur_ip = self.image_ip = self._plumb(self.cur_net, self.first_slot)
        self._run(self.cur, self.cur_net)
        if nf.first_answer_ms("127.0.0.1", self.node_port, time.monotonic(), nf.COLD_DEADLINE_S) is None:
            raise RuntimeError(f"the seed of {self.mode} never answered on 127.0.0.1:{self.node_port}")
        self.image = s.wait_published()
        self.image_boot = nf._boot_id(self.node_port)
        decisions = [d["decision"] for d in s.decisions() if d["id"] == self.cur]
        if decisions[-1:] != ["started-cold"]:
            raise RuntimeError(f"the seed of {self.mode} should start cold: {decisions}")
        return self

    def _slot(self) -> tuple[int, bool]:
        """The new container's slot: the checkpoint's (on) or another one (off); and whether it changed."""
        if self.mode == "on":
            return self.first_slot, False
        return self.first_slot + 1 + self.n % (self.slots - 1), True

    def cycle(self, i: int, flood: nf.FloodConfig) -> nf.Cycle:
        c = nf.Cycle(self.mode, i)
        s, port = self.stack, self.node_port
        self.n += 1
        # Zero-padded: runsc at the pin resolves ids by prefix (issue 12 item 5).
        cid, net = f"{self.mode}{self.n:04d}", f"{self.name}-{self.mode}-{self.n:04d}"
        try:
            socks = nf.open_connections(port, nf.OPEN_CONNS)
        except (OSError, RuntimeError) as e:
            if self.last is not None and self.last.answered:
                # The last restore answered, then stopped serving: a failure of that restore.
                self.last.late_failure = f"{type(e).__name__}: {e}"
                self.last.diagnosis = nf.diagnose_address(self.cur_ip, s.settings().network_probe_mark)
            socks = []
        fl = nf.Flooder(("127.0.0.1", port), (self.cur_ip, nf.SANDBOX_PORT), flood, self.subnet, seed=self.n).start()
        t_flood = time.monotonic()
        try:
            time.sleep(0.3)  # the server is under load when it is replaced
            s.ctrd.remove(self.cur)
            netmod.unplumb(self.cur_net)
            slot, _ = self._slot()
            ip = self._plumb(net, slot)
            self.cur, self.cur_net, self.cur_ip = cid, net, ip
            c.address_changed = ip != self.image_ip
            self._restore(c, cid, net)
            c.open_conns = nf.fate_of(socks, nf.OPEN_CONN_BOUND_S) if socks else []
        finally:
            c.flood = fl.stop()
            c.flood_s = round(time.monotonic() - t_flood, 3)
        c.loadavg_1m = round(os.getloadavg()[0], 2)
        if c.answered:
            c.same_process = nf._boot_id(port) == self.image_boot
        else:
            c.error = c.error or f"no answer within {nf.ANSWER_DEADLINE_S:g}s of ready"
        self.last = c
        return c

    def _restore(self, c: nf.Cycle, cid: str, net: str) -> None:
        """`ctr run` the new container; ready, answer, and thawd's split of the restore."""
        follow = LogFollower(self.log)
        done: dict = {}

        def run() -> None:
            try:
                self._run(cid, net)
            except Exception as e:  # noqa: BLE001 - a failed start is a result of the cycle
                done["error"] = f"{type(e).__name__}: {e}"
            done["t"] = time.monotonic()

        wall0, mono0 = time.time(), time.monotonic()
        t0 = mono0
        th = threading.Thread(target=run, daemon=True)
        th.start()
        lines: list[dict] = []
        ready = seen = None
        if self.mode == "on":
            end = t0 + READY_DEADLINE_S
            while ready is None and time.monotonic() < end:
                finished = not th.is_alive()   # before reading: a line written before ctr returned is read
                new = follow.read()
                lines += new
                for r in new:
                    m = _GATE_OPENED.match(r.get("msg", ""))
                    if m and m.group(1) == net:
                        ready = _wall_to_monotonic(r["time"], wall0, mono0)
                        c.gate_dropped = int(m.group(2))
                        seen = time.monotonic()
                if finished:
                    break
                time.sleep(LOG_POLL_S)
        else:
            th.join(READY_DEADLINE_S)
            ready = done.get("t")
        if ready is not None:
            c.restore_s = ready - t0
            a = nf.first_answer("127.0.0.1", self.node_port, ready, nf.ANSWER_DEADLINE_S)
            c.answered = a is not None
            if a:
                c.answer_ms = a.pop("ms")
                c.answer_detail = {k: round(v, 2) for k, v in a.items()}
                if seen is not None:  # how long after the gate's time stamp the bench read the line
                    c.answer_detail["gate_line_seen_ms"] = round((seen - ready) * 1000, 2)
        th.join(READY_DEADLINE_S)
        # thawd logs the outcome once the stand-in has exited having committed the restore
        # (service.py _confirm), which may be just after `ctr run` returned: wait for it a while.
        end = time.monotonic() + OUTCOME_WAIT_S
        while True:
            lines += follow.read()
            outcome = next((m for r in lines if (m := _OUTCOME.match(r.get("msg", ""))) and m.group(1) == cid), None)
            if outcome or time.monotonic() > end:
                break
            time.sleep(0.01)
        if outcome:
            c.runsc_restore_s = float(outcome.group(3))
            c.health_s = float(outcome.group(4)) if outcome.group(4) else None
        decisions = [d["decision"] for d in self.stack.decisions() if d["id"] == cid]
        if "error" in done:
            c.error = done["error"]
        elif decisions != ["restore", "restored"]:
            # A cold start is no restore: it does not count as answering.
            why = [f"{d['decision']}: {d['reason']}" for d in self.stack.decisions() if d["id"] == cid]
            c.error = "not restored: " + "; ".join(why)
            c.answered, c.answer_ms = False, None
        elif ready is None:
            c.error = "restored, but thawd logged no gate opening"

    def close(self, logs: Path | None = None) -> None:
        """Stop the node; with `logs`, keep thawd's, the stand-in's and containerd's logs there first."""
        if logs is not None:
            d = logs / self.mode
            d.mkdir(parents=True, exist_ok=True)
            for f in (self.log, self.stack.base / "ctrd" / "standin.log", self.stack.base / "ctrd" / "containerd.log"):
                if f.exists():
                    shutil.copy2(f, d / f.name)
        try:
            self.stack.stop()
        finally:
            netmod.cleanup_leftovers(set(), prefix=f"{self.name}-{self.mode}-")


def footer(result: dict) -> str:
    env = result["environment"]
    mib = "/".join(f"{v['bytes'] / 2**20:.0f}" for v in result.get("images", {}).values())
    return (f"Measured {result['date']} on {env['machine']} ({env['cpus']} CPUs, kernel {env['kernel']}), "
            f"runsc `{env['runsc_version']}`, containerd + gVisor's shim + thaw's stand-in + thawd + SeaweedFS "
            f"(`bench/network_flood.py --door containerd`). One image per mode, saved once by thawd's automatic "
            f"checkpoint of a cold seed container ({mib} MiB); every cycle starts a new "
            f"container with `ctr run` that restores from it (cache hit). No connection is open at a checkpoint "
            f"in this door: the {OPEN_CONNS_TEXT} row counts the {result['open_connections_per_cycle']} "
            f"connections that were open to the container each cycle replaced (removed before the new one "
            f"starts). \"Ready\" is thawd's log line opening the gate after the health check (on) or `ctr run` "
            f"returning (off: thawd.gate and thawd.health_check false); restore to ready is from `ctr run` "
            f"(containerd, shim, stand-in, thawd, runsc). Data: `bench/results/{Path(result['out']).name}`.")


OPEN_CONNS_TEXT = "\"connections open to the replaced container\""


def run(a: argparse.Namespace, result: dict) -> None:
    """All profiles, the modes' cycles in turn, into `result` (bench/network_flood.py main)."""
    if not (BUILD / "thaw-runsc").is_file():
        raise SystemExit("network_flood --door containerd: build/thaw-runsc is missing (make setup)")
    name = "bench-fc"
    modes = a.modes.split(",")
    shutil.rmtree(a.base, ignore_errors=True)
    netmod.cleanup_leftovers(set(), prefix=name)
    nodes = {m: Node(a.base, name, m, a.node_port + k, a.subnet, k * SLOTS_PER_MODE) for k, m in enumerate(modes)}
    result["environment"].update({
        "runsc_version": subprocess.run([str(BUILD / "runsc"), "--version"], capture_output=True,
                                        text=True).stdout.split("\n")[0].removeprefix("runsc version ").strip(),
        "platform": "systrap", "door": "containerd"})
    try:
        t0 = time.monotonic()
        for node in nodes.values():
            node.start()
        result["images"] = {m: {**n.image, "seed_boot_id": n.image_boot, "address": n.image_ip}
                            for m, n in nodes.items()}
        result["setup_seconds"] = round(time.monotonic() - t0, 1)
        for prof in a.profiles.split(","):
            flood = nf.PROFILES[prof]
            t0 = time.monotonic()
            by_mode: dict[str, list[nf.Cycle]] = {m: [] for m in modes}
            for i in range(a.cycles):
                for m in modes:
                    c = nodes[m].cycle(i, flood)
                    by_mode[m].append(c)
                    nf.progress(prof, c)
            result["profiles"][prof] = nf.profile_result(flood, time.monotonic() - t0, by_mode)
            print(json.dumps({prof: {m: v["summary"] for m, v in result["profiles"][prof]["modes"].items()}},
                             indent=2), flush=True)
    finally:
        for node in nodes.values():
            node.close(getattr(a, "logs", None))
        netmod.remove_subnet_route(a.subnet)
        shutil.rmtree(a.base, ignore_errors=True)
