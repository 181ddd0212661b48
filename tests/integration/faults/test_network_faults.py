"""Ports and addresses: a node port a host process already listens on, and one
image restored ten times at once. Real runsc, netns, veth, nftables and real
`thaw` processes racing for the same saved address.

Decision (docs/network.md, "Leases"): a restore keeps the address it was
saved with (restored listeners, routes and live connections depend on it),
so the address is leased to one sandbox at a time. While one restore of an
image lives, another restore of it is refused with an error naming the
sandbox that holds the address; it is not moved to a fresh address."""
from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import pytest

from bench import network_flood as flood
from control import config as configmod
from control.lifecycle.sandbox import Sandboxes
from runsc_hooks import network as netmod
from tests.integration.conftest import THAW, leftovers, run_all, settings_for, thaw_env
from tests.integration.faults.results import write_results

# Not TEST_SUBNET (10.214/20) nor test_network's (10.215/20).
FAULT_SUBNET = "10.216.0.0/20"
RESTORES = 10


def _settings(base: Path) -> configmod.Settings:
    return configmod.replace(settings_for(base), network_subnet=FAULT_SUBNET, thawd_health_timeout_s=20.0,
                             thawd_health_attempt_timeout_s=0.5)


def _env(base: Path) -> dict[str, str]:
    return {**thaw_env(base), "THAW_NETWORK_SUBNET": FAULT_SUBNET, "THAW_THAWD_HEALTH_TIMEOUT_S": "20",
            "THAW_THAWD_HEALTH_ATTEMPT_TIMEOUT_S": "0.5", "THAW_CONFIG": "/dev/null"}


def _port(name: str) -> int:
    return 30000 + sum(name.encode()) % 900


@pytest.fixture
def net(base, name):
    netmod.cleanup_leftovers(set(), prefix=name)
    yield base
    netmod.cleanup_leftovers(set(), prefix=name)
    netmod.remove_subnet_route(FAULT_SUBNET)


def _one_line(p: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("thaw: error: "), p.stderr
    return lines[0]


@pytest.mark.parametrize("bind", ["127.0.0.1", "0.0.0.0", "::"])
def test_a_node_port_a_host_process_listens_on_is_refused(net, name, bind):
    base, port = net, _port(name)
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as ls:
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((bind, port))
        ls.listen()
        sid = f"{name}-p"
        p = subprocess.run([str(THAW), "run", "--id", sid, "-p", f"{port}:{flood.SANDBOX_PORT}", "--",
                            "/bin/sleep", "600"], env=_env(base), capture_output=True, text=True, timeout=120)
        assert p.returncode == 2, p.stderr
        line = _one_line(p)
        assert f"node port {port} is in use by a host process listening on" in line and f":{port}" in line, line
        assert leftovers(_settings(base), [sid]) == {}
        # The host process still gets its traffic: nothing was DNATed away from it.
        ls.settimeout(5)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            conn, _ = ls.accept()
            conn.close()


def _routes_to(sandbox_ip: str) -> int:
    """Routes in the main table to the /30 of `sandbox_ip` (one per sandbox holding it)."""
    import ipaddress

    from pyroute2 import IPRoute
    dst = ipaddress.ip_network(f"{sandbox_ip}/30", strict=False)
    with IPRoute() as ipr:
        return sum(1 for r in ipr.get_routes(family=2, table=254)
                   if r["dst_len"] == 30 and r.get_attr("RTA_DST") == str(dst.network_address))


def test_one_image_restored_ten_times_at_once_gets_one_address(net, name):
    base, port = net, _port(name)
    s = _settings(base)
    sb = Sandboxes(s)
    src = f"{name}-src"
    sb.run(src, flood.server_spec(s, src), probes=(f"http:{flood.SANDBOX_PORT}/health",),
           ports=(netmod.Port(port, flood.SANDBOX_PORT),))
    assert flood.first_answer_ms("127.0.0.1", port, time.monotonic(), 60) is not None, "the server never answered"
    saved_ip = sb.address(src)
    img = base / "image"
    sb.checkpoint(src, img)           # the source goes: its address is the image's now
    ids = [f"{name}-{i}" for i in range(RESTORES)]
    out = run_all([[str(THAW), "restore", str(img), "--id", sid, "--json"] for sid in ids],
                  [_env(base)] * RESTORES, timeout=300)
    rows = []
    for sid, (rc, stdout, stderr) in zip(ids, out):
        row = {"id": sid, "rc": rc, "error": "; ".join(ln for ln in stderr.splitlines() if ln.startswith("thaw: error"))}
        if rc == 0:
            row["address"] = json.loads(stdout[:stdout.rindex("}") + 1])["address"]
        rows.append(row)
    winners = [r for r in rows if r["rc"] == 0]
    losers = [r for r in rows if r["rc"] != 0]
    routes = _routes_to(saved_ip)
    summary = {"restores": RESTORES, "restored": len(winners), "refused": len(losers),
               "winner_has_saved_address": bool(winners) and winners[0]["address"] == saved_ip,
               "refusals_naming_the_holder": sum(r["rc"] == 2 and "in use by sandbox" in r["error"] for r in losers),
               "host_routes_to_the_address": routes,
               "losers_left_something": {r["id"]: v for r in losers for v in [leftovers(s, [r["id"]])] if v}}
    write_results("concurrent-restores", {"summary": summary, "rows": rows, "saved_address": saved_ip})
    assert len(winners) == 1, rows
    assert winners[0]["address"] == saved_ip, rows
    winner = winners[0]["id"]
    for r in losers:
        assert r["rc"] == 2 and f"in use by sandbox '{winner}'" in r["error"] and saved_ip in r["error"], r
        assert len([ln for ln in out[ids.index(r["id"])][2].splitlines() if ln.strip()]) == 1, r
    assert summary["losers_left_something"] == {}
    assert routes == 1, "one host route to the saved address"
    assert flood.first_answer_ms("127.0.0.1", port, time.monotonic(), 30) is not None
    h = subprocess.run([str(THAW), "health", winner], env=_env(base), capture_output=True, text=True, timeout=60)
    assert h.returncode == 0, h.stderr
    # The lease goes with its sandbox: once it is deleted, the image restores again, same address.
    sb.delete(winner, force=True)
    again = sb.restore(img, f"{name}-again")
    assert again.sandbox_ip == saved_ip
    sb.delete(f"{name}-again", force=True)
    assert leftovers(s, [*ids, src, f"{name}-again"]) == {}
