"""The CLI door of the lifecycle against real runsc, netns and SeaweedFS
(issue 12): sandboxes whose ids are prefixes of each other, a workload's log
and exit status, a checkpoint that fails on a full file system, and an image
made by `thaw run -- CMD` restored on a second node (second state dir, runsc
root, cache) after a push and a pull. The GPU branches are in
tests/functional/test_cli_sandboxes.py (fake NVML/CDI) and bench/gpu/lifecycle.py
(the H200)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from control.lifecycle.image_meta import IMAGE_META
from runsc_hooks import network as netmod
from runsc_hooks import spec as specmod

from tests.integration.conftest import (THAW, cli_env, leftovers, purge, settings_for, thaw, thaw_env,
                                        thaw_json)

PORT = 8080
# The workload: an HTTP server in the host's own python3 (a system path, so
# the image needs nothing of this node: `thaw run -- CMD` binds /usr read-only).
# It prints to stdout, holds MB of random memory (what a checkpoint must
# carry) and answers GET with its boot id (a restored process keeps it) and a
# request counter.
SERVER = r"""
import http.server, json, os, socketserver, sys
NAME, PORT, MB = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
BOOT = os.urandom(8).hex()
blob = bytearray(os.urandom(MB << 20))
n = 0
print(f"server {NAME} boot {BOOT} on {PORT}", flush=True)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global n
        n += 1
        body = json.dumps({"name": NAME, "boot": BOOT, "n": n}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        print(f"request {n} {self.path}", flush=True)
    def log_message(self, *a):
        pass
class S(http.server.HTTPServer):
    def server_bind(self):
        socketserver.TCPServer.server_bind(self)   # no getfqdn: no resolver in the sandbox
S(("0.0.0.0", PORT), H).serve_forever()
"""
PYTHON = "/usr/bin/python3"


def run_server(env: dict, sid: str, mb: int = 4, *extra: str) -> str:
    """`thaw run` the server as `sid`; its address once it answers."""
    p = thaw("run", "--id", sid, "--json", "--probe", f"http:{PORT}/health", *extra, "--",
             PYTHON, "-c", SERVER, sid, str(PORT), str(mb), env=env)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    ask(out["address"], timeout_s=60)
    return out["address"]


def ask(host: str, timeout_s: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://{host}:{PORT}/x", timeout=2) as r:
                return json.loads(r.read())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def ps(env: dict) -> dict[str, dict]:
    code, rows = thaw_json("ps", env=env)
    assert code == 0
    return {r["id"]: r for r in rows}


def logs(env: dict, sid: str, *args: str) -> str:
    p = thaw("logs", sid, *args, env=env)
    assert p.returncode == 0, p.stderr
    return p.stdout


def wait_until(cond, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}")


# -- exact ids ----------------------------------------------------------------------

def test_ids_that_are_prefixes_of_each_other(base, name, weed):
    """`web` and `web-2` side by side: every command addresses exactly one,
    and neither sandbox-gc nor thaw serve's start-up recovery touches them."""
    env = thaw_env(base)
    s = settings_for(base)
    web, web2 = name, f"{name}-2"
    host = run_server(env, web)
    host2 = run_server(env, web2)
    a, b = ask(host), ask(host2)
    assert (a["name"], b["name"]) == (web, web2)

    p = thaw("checkpoint", web, "--out", str(base / "img"), "--leave-running", env=env)
    assert p.returncode == 0, p.stderr
    assert ask(host)["boot"] == a["boot"] and ask(host2)["boot"] == b["boot"]
    for sid in (web, web2):
        assert thaw("health", sid, env=env).returncode == 0
        assert f"server {sid} boot" in logs(env, sid)
    assert f"server {web2}" not in logs(env, web) and f"server {web} " not in logs(env, web2)

    p = thaw("sandbox-gc", "--orphans", "--prefix", name, "--json", env=env)
    assert p.returncode == 0 and json.loads(p.stdout) == [], p.stdout + p.stderr
    # thaw serve runs the same recovery first thing: start one, wait for its socket.
    store = cli_env(_settings(weed, name, base))
    serve_env = {**env, **{k: v for k, v in store.items() if k.startswith("THAW_STORE")},
                 "THAW_THAWD_SOCKET": str(base / "thawd.sock"), "THAW_THAWD_METRICS_ADDR": ""}
    proc = subprocess.Popen([str(THAW), "-v", "serve"], env=serve_env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: (base / "thawd.sock").exists() or proc.poll() is not None, 60, "thawd's socket")
        assert proc.poll() is None, proc.stderr.read()
    finally:
        proc.terminate()
        err = proc.communicate(timeout=30)[1]
    assert "recovered sandbox leftovers" not in err, err
    rows = ps(env)
    assert {k: r["state"] for k, r in rows.items()} == {web: "running", web2: "running"}
    assert netmod.sandbox_leftovers(web) and netmod.sandbox_leftovers(web2)   # their networks are intact
    assert ask(host)["boot"] == a["boot"] and ask(host2)["boot"] == b["boot"]

    p = thaw("delete", web, "--force", env=env)
    assert p.returncode == 0, p.stderr
    assert leftovers(s, [web]) == {}
    assert set(ps(env)) == {web2} and ask(host2)["boot"] == b["boot"]
    assert thaw("delete", web2, "--force", env=env).returncode == 0
    assert leftovers(s, [web, web2]) == {}


def _settings(weed, name, base):
    from tests.integration.conftest import make_settings
    return make_settings(weed, name, base / "cache")


# -- logs and exit status ---------------------------------------------------------

def test_log_exit_status_and_health_of_a_workload_that_exits(base, name):
    env = {**thaw_env(base), "THAW_NODE_LOG_MAX_BYTES": "64k"}
    s = settings_for(base)
    crash, chatty = f"{name}-x", f"{name}-c"
    # It exits within node.run_grace_s: `thaw run` fails with its last lines, not "running".
    p = thaw("run", "--id", crash, "--no-network", "--", "/bin/sh", "-c",
             "echo to-stdout; echo to-stderr >&2; sleep 1; exit 7", env=env)
    assert p.returncode == 1, (p.stdout, p.stderr)
    err = p.stderr.splitlines()
    assert err[-3:-1] == ["  | to-stdout", "  | to-stderr"], err
    assert err[-1].startswith(f"thaw: error: sandbox '{crash}': the workload exited ") and "(exit status 7)" in err[-1]
    # A workload that prints forever: its log stays within 2 x node.log_max_bytes.
    p = thaw("run", "--id", chatty, "--no-network", "--", "/bin/sh", "-c",
             "i=0; while :; do i=$((i+1)); echo line $i; done", env=env)
    assert p.returncode == 0, p.stderr
    rows = wait_until(lambda: (r := ps(env)) and r[crash]["state"] == "stopped" and r, 30, "the exit")
    assert (rows[crash]["exit_status"], rows[crash]["exit"]) == (7, "exit status 7")
    assert rows[chatty]["state"] == "running"
    assert logs(env, crash) == "to-stdout\nto-stderr\n"
    t0 = time.monotonic()
    p = thaw("health", crash, env=env)
    assert p.returncode == 1 and time.monotonic() - t0 < 5
    assert p.stdout.strip() == f"{crash}: NOT READY: the workload exited (exit status 7); " \
                               f"`thaw logs {crash}` has its output"
    time.sleep(2)
    d = s.log_dir / "sandboxes" / chatty
    sizes = [(d / f).stat().st_size for f in ("workload.log", "workload.log.1")]
    assert max(sizes) <= 64 << 10 and sizes[1] > 60 << 10, sizes
    last = logs(env, chatty, "--tail", "3").splitlines()   # the third may be half-written
    assert len(last) == 3 and int(last[1].split()[1]) == int(last[0].split()[1]) + 1
    p = thaw("delete", chatty, "--force", env=env)
    assert p.returncode == 0 and thaw("delete", crash, env=env).returncode == 0
    assert leftovers(s, [crash, chatty]) == {}


def test_a_command_sandbox_finds_the_callers_path_writes_home_and_keeps_its_log_across_a_restore(base, name):
    """First contact (issue 31): a bare command found on the caller's PATH (a --bind
    directory), a writable HOME, and `thaw logs` of the restored sandbox: the log it
    was checkpointed with, then what the restored process prints (its count goes on)."""
    tools = base / "tools"
    tools.mkdir()
    hello = tools / "thaw-it-hello"
    hello.write_text('#!/bin/sh\necho "path=$PATH"\nmkdir -p "$HOME/.cache/x" && echo "home-ok $HOME"\n'
                     'i=0; while :; do i=$((i+1)); echo "tick $i"; sleep 0.2; done\n')
    hello.chmod(0o755)
    env = {**thaw_env(base), "PATH": f"{tools}:{os.environ['PATH']}"}
    s = settings_for(base)
    sid, sid2 = name, f"{name}-r"

    def ticks(text: str) -> list[int]:
        return [int(line.split()[1]) for line in text.splitlines() if line.startswith("tick ")]

    p = thaw("run", "--id", sid, "--no-network", "--bind", str(tools), "--", "thaw-it-hello", env=env)
    assert p.returncode == 0, p.stderr
    cold = wait_until(lambda: (n := ticks(logs(env, sid))) and n[-1] >= 5 and logs(env, sid), 30, "ticks")
    first = cold.splitlines()
    assert first[0].startswith(f"path={tools}:") and first[1] == "home-ok /root", first[:2]
    p = thaw("checkpoint", sid, "--out", str(base / "img"), env=env)
    assert p.returncode == 0, p.stderr
    p = thaw("restore", str(base / "img"), "--id", sid2, env=env)
    assert p.returncode == 0, p.stderr
    saved = (base / "img" / "workload.log").read_text()
    last = ticks(saved)[-1]
    text = wait_until(lambda: (n := ticks(logs(env, sid2))) and n[-1] >= last + 5 and logs(env, sid2), 30,
                      "the restored ticks")
    assert text.startswith(saved), "the checkpointed log comes first"
    after = ticks(text[len(saved):])
    # The restored process goes on from its memory: no new "tick 1". The log is
    # copied just after the save (keep_log): the lines around that moment may come
    # again, or a few still in the monitor's pipe be missing.
    assert after[0] > 1 and abs(after[0] - 1 - last) <= 5, (last, after[:3])
    assert after == list(range(after[0], after[0] + len(after)))
    assert thaw("delete", sid2, "--force", env=env).returncode == 0
    assert leftovers(s, [sid, sid2]) == {}


# -- a checkpoint that fails ------------------------------------------------------

@pytest.fixture
def full_fs(base):
    """A 4 MiB tmpfs: any real checkpoint's pages overflow it (ENOSPC)."""
    d = base / "small"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "thaw-it-small", str(d)], check=True)
    yield d
    subprocess.run(["umount", "-l", str(d)], check=False)


def test_a_checkpoint_that_fills_the_disk_keeps_the_workload(base, name, full_fs):
    env = thaw_env(base)
    host = run_server(env, name, 16)
    before = ask(host)
    p = thaw("checkpoint", name, "--out", str(full_fs / "img"), env=env)
    assert p.returncode == 4, p.stdout + p.stderr   # no room (CheckpointNoSpace), not only "failed" (73)
    errors = [x for x in p.stderr.splitlines() if not x.startswith("  checkpoint ")]
    assert len(errors) == 1 and errors[0].startswith(f"thaw: error: checkpoint of {name} failed: "), p.stderr
    assert "no space left" in errors[0].lower() and \
        errors[0].endswith("(the workload is still running; no image was kept)"), errors[0]
    assert os.listdir(full_fs) == []                      # no partial image
    after = ask(host)
    assert after["boot"] == before["boot"] and after["n"] == before["n"] + 1   # same process, serving
    assert ps(env)[name]["state"] == "running"
    assert thaw("health", name, env=env).returncode == 0  # its gate is open again
    # Room again: the same sandbox checkpoints.
    p = thaw("checkpoint", name, "--out", str(base / "img"), env=env)
    assert p.returncode == 0, p.stderr
    assert leftovers(settings_for(base), [name]) == {}


# -- a portable image ---------------------------------------------------------------

def test_image_of_a_command_restores_on_a_second_node(base, name, settings):
    """Node A runs, checkpoints and pushes; node B (its own state dir, runsc
    root, cache) pulls and restores, and starts it cold with --cold-fallback."""
    store = {k: v for k, v in cli_env(settings).items() if k.startswith("THAW_STORE")}
    env_a = {**thaw_env(base / "a"), **store}
    env_b = {**thaw_env(base / "b"), **store}
    src, restored, cold = f"{name}-a", f"{name}-b", f"{name}-c"
    host = run_server(env_a, src, 8)
    first = ask(host)
    p = thaw("checkpoint", src, "--out", str(base / "img"), env=env_a)
    assert p.returncode == 0, p.stderr
    assert json.loads((base / "img" / IMAGE_META).read_text())["rootfs"] == {"layout": "host"}
    code, pushed = thaw_json("push", str(base / "img"), "--key", f"user-root.{name}", env=env_a)
    assert code == 0 and pushed["published"], pushed
    shutil.rmtree(base / "a" / "state" / "rootfs", ignore_errors=True)   # nothing of node A is needed

    code, pulled = thaw_json("pull", f"user-root.{name}", env=env_b)
    assert code == 0 and not pulled["hit"], pulled
    entry = Path(pulled["path"])
    assert entry.is_relative_to(base / "b" / "cache")
    code, out = thaw_json("restore", str(entry), "--id", restored, env=env_b)
    assert code == 0 and out["mode"] == "restored", out
    again = ask(host)
    # The saved process goes on: its counter counts the restore's health probe and this request.
    assert again["boot"] == first["boot"] and again["n"] == first["n"] + 2
    wait_until(lambda: "request" in logs(env_b, restored), 10, "the restored workload's output in its log")
    assert set(ps(env_b)) == {restored} and ps(env_a) == {}
    assert thaw("delete", restored, "--force", env=env_b).returncode == 0

    # --cold-fallback on node B: a restore whose health check cannot pass starts the workload cold.
    code, out = thaw_json("restore", str(entry), "--id", cold, "--cold-fallback", "--probe",
                          f"http:{PORT}/x~never-in-the-answer", env={**env_b, "THAW_THAWD_HEALTH_TIMEOUT_S": "3"})
    assert code == 0 and out["mode"] == "cold" and "UnhealthyRestore" in out["fallback_reason"], out
    fresh = ask(out["address"], timeout_s=60)
    assert fresh["boot"] != first["boot"] and fresh["n"] == 1
    assert thaw("delete", cold, "--force", env=env_b).returncode == 0
    for b in ("a", "b"):
        assert leftovers(settings_for(base / b), [src, restored, cold]) == {}


def test_a_bundle_image_names_what_is_node_local(base, name, settings):
    """An image whose rootfs is a --bundle directory: push refuses it (naming
    the path) unless told; a node without that directory refuses to restore
    it (and to start it cold), naming it, before runsc runs."""
    store = {k: v for k, v in cli_env(settings).items() if k.startswith("THAW_STORE")}
    env_a = {**thaw_env(base / "a"), **store}
    env_b = {**thaw_env(base / "b"), **store}
    bundle = base / "bundle"
    rootfs = specmod.prepare_host_rootfs(bundle / "rootfs")
    sp = specmod.command_spec(["/bin/sh", "-c", "while :; do sleep 1; done"], rootfs="rootfs",
                              extra_mounts=specmod.host_layout())
    specmod.Bundle(bundle).write(sp)
    src = f"{name}-a"
    p = thaw("run", "--id", src, "--no-network", "--bundle", str(bundle), env=env_a)
    assert p.returncode == 0, p.stderr
    p = thaw("checkpoint", src, "--out", str(base / "img"), env=env_a)
    assert p.returncode == 0, p.stderr
    p = thaw("push", str(base / "img"), "--key", f"user-root.{name}", env=env_a)
    assert p.returncode == 2 and f"depends on this node: root filesystem {rootfs}" in p.stderr, p.stderr
    code, pushed = thaw_json("push", str(base / "img"), "--key", f"user-root.{name}", "--allow-node-local", env=env_a)
    assert code == 0 and pushed["published"]
    shutil.rmtree(bundle)                                 # node B does not have it
    code, pulled = thaw_json("pull", f"user-root.{name}", env=env_b)
    assert code == 0
    for extra in ([], ["--cold-fallback"]):
        p = thaw("restore", pulled["path"], "--id", f"{name}-b", *extra, env=env_b)
        assert p.returncode == 2, p.stdout + p.stderr
        assert f"checkpoint image {pulled['path']}: its root filesystem {rootfs} is not on this node" \
            in p.stderr, p.stderr
    assert ps(env_b) == {}
    for b in ("a", "b"):
        assert leftovers(settings_for(base / b), [src, f"{name}-b"]) == {}


@pytest.fixture(autouse=True)
def _purge_second_nodes(base, name):
    """Node B's runsc root is not the base fixture's: purge it too."""
    yield
    from runsc_hooks.runsc import remove_root
    for b in ("a", "b"):
        if (base / b).exists():
            purge(settings_for(base / b), name)
            remove_root(settings_for(base / b).runsc_root)
