"""control/lifecycle/profiles.py: profile env and hooks against a stand-in workload on loopback."""
from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest

from control.lifecycle import profiles
from control.errors import HookError, NotFound, SpecError
from runsc_hooks import probe
from runsc_hooks import spec as specmod

LOOPBACK = probe.Target(address="127.0.0.1")  # the stand-in workload's address


class Workload:
    """A loopback HTTP server that records requests; answers by path."""

    def __init__(self, answers: dict[str, tuple[int, str]] | None = None, delay_s: float = 0.0):
        self.requests: list[tuple[str, str]] = []
        self.bodies: list[bytes] = []
        answers = answers or {}
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                n = int(self.headers.get("Content-Length") or 0)
                outer.bodies.append(self.rfile.read(n))
                outer.requests.append((self.command, self.path))
                time.sleep(delay_s)
                status, body = answers.get(self.path, (200, "ok"))
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            do_GET = do_POST = _answer

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_vllm_profile_sleeps_before_checkpoint_and_wakes_after_restore():
    with Workload() as w:
        p = profiles.get("vllm").with_port(w.port)
        pre = profiles.run_hooks(p, "pre_checkpoint", LOOPBACK)
        post = profiles.run_hooks(p, "post_restore", LOOPBACK)
    assert w.requests == [("POST", "/sleep?level=1"), ("POST", "/wake_up")]
    assert pre[0]["status"] == 200 and pre[0]["output"] == "ok" and pre[0]["seconds"] >= 0
    assert post[0]["hook"] == f"POST :{w.port}/wake_up"


def test_vllm_env():
    env = profiles.get("vllm").env
    assert env["VLLM_HOST_IP"] == "127.0.0.1"
    assert env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert env["VLLM_RPC_BASE_PATH"] == "/tmp"


def test_pytorch_profile_releases_cached_memory_before_checkpoint():
    with Workload() as w:
        p = profiles.get("pytorch").with_port(w.port)
        profiles.run_hooks(p, "pre_checkpoint", LOOPBACK)
        assert profiles.run_hooks(p, "post_restore", LOOPBACK) == []
    assert w.requests == [("POST", "/thaw/pre-checkpoint")]


def test_pytorch_offload_moves_the_weights_out_before_and_back_after():
    with Workload() as w:
        p = profiles.get("pytorch-offload").with_port(w.port)
        pre = profiles.run_hooks(p, "pre_checkpoint", LOOPBACK)
        post = profiles.run_hooks(p, "post_restore", LOOPBACK)
    # The release first (cached blocks, compile workers), then the weights; back after the restore.
    assert w.requests == [("POST", "/thaw/pre-checkpoint"), ("POST", "/thaw/offload-weights"),
                          ("POST", "/thaw/restore-weights")]
    assert [r["status"] for r in pre + post] == [200, 200, 200]


def test_a_workload_without_the_offload_route_fails_the_checkpoint_not_a_restore():
    # An image whose weights did not leave the GPU must not be published as an offload image.
    with Workload({"/thaw/offload-weights": (404, '{"error": "no route"}')}) as w:
        with pytest.raises(HookError, match="HTTP 404"):
            profiles.run_hooks(profiles.get("pytorch-offload").with_port(w.port), "pre_checkpoint", LOOPBACK)


@pytest.mark.parametrize("name", ["pytorch", "pytorch-offload"])
def test_pytorch_profiles_keep_torch_compile_workers_from_starting(name, tmp_path):
    sp = specmod.command_spec(["/bin/true"], rootfs=str(tmp_path), env={"TORCHINDUCTOR_COMPILE_THREADS": "16"})
    env = profiles.apply_env(sp, profiles.get(name))["process"]["env"]
    assert [e for e in env if e.startswith("TORCHINDUCTOR_COMPILE_THREADS=")] == ["TORCHINDUCTOR_COMPILE_THREADS=1"]


def test_http_error_is_a_hook_error_with_the_body():
    with Workload({"/sleep?level=1": (500, "sleep mode is not enabled")}) as w:
        with pytest.raises(HookError) as ei:
            profiles.run_hooks(profiles.get("vllm").with_port(w.port), "pre_checkpoint", LOOPBACK)
    assert "HTTP 500" in str(ei.value) and "sleep mode is not enabled" in str(ei.value)
    assert ei.value.hook.startswith("vllm/pre_checkpoint[0]")


def test_no_listener_is_a_hook_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]   # bound, not listening: connection refused
        with pytest.raises(HookError, match="no answer from http://127.0.0.1:.*/wake_up"):
            profiles.run_hooks(profiles.get("vllm").with_port(port), "post_restore", LOOPBACK)


def test_slow_workload_times_out():
    slow = profiles.Profile("slow", pre_checkpoint=(profiles.HttpHook("/x", timeout_s=0.2),))
    with Workload(delay_s=1.0) as w:
        with pytest.raises(HookError, match="timed out"):
            profiles.run_hooks(slow.with_port(w.port), "pre_checkpoint", LOOPBACK)


def test_exec_hooks_stop_at_the_first_failure():
    ran = []

    def fake_exec(argv, timeout_s):
        ran.append(list(argv))
        return (0, "flushed\n") if argv[0] == "sync" else (3, "boom")

    p = profiles.Profile("x", post_restore=(profiles.ExecHook(("sync",)), profiles.ExecHook(("false",)),
                                            profiles.ExecHook(("never",))))
    with pytest.raises(HookError, match=r"x/post_restore\[1\] exec false failed: exit 3: boom"):
        profiles.run_hooks(p, "post_restore", probe.Target(exec=fake_exec))
    assert ran == [["sync"], ["false"]]
    with pytest.raises(HookError, match="no way to run a command"):
        profiles.run_hooks(p, "post_restore", LOOPBACK)


def test_apply_env_replaces_same_names(tmp_path):
    sp = specmod.command_spec(["/bin/true"], rootfs=str(tmp_path), env={"VLLM_HOST_IP": "10.0.0.2", "A": "1"})
    out = profiles.apply_env(sp, profiles.get("vllm"))
    env = out["process"]["env"]
    assert [e for e in env if e.startswith("VLLM_HOST_IP=")] == ["VLLM_HOST_IP=127.0.0.1"]
    assert "A=1" in env and "VLLM_HOST_IP=10.0.0.2" in sp["process"]["env"]


def test_for_spec_reads_annotations(tmp_path):
    sp = specmod.command_spec(["/bin/true"], rootfs=str(tmp_path))
    assert profiles.for_spec(sp).name == "none"
    sp["annotations"].update({profiles.PROFILE_ANNOTATION: "vllm", profiles.PORT_ANNOTATION: "9000"})
    p = profiles.for_spec(sp)
    assert (p.name, p.pre_checkpoint[0].port, p.post_restore[0].port) == ("vllm", 9000, 9000)
    sp["annotations"][profiles.PORT_ANNOTATION] = "http"
    with pytest.raises(SpecError, match="not a TCP port"):
        profiles.for_spec(sp)
    sp["annotations"][profiles.PROFILE_ANNOTATION] = "tensorflow"
    with pytest.raises(NotFound, match="known: jax, none, pytorch, pytorch-offload, vllm"):
        profiles.for_spec(sp)


def test_unknown_phase():
    with pytest.raises(ValueError):
        profiles.get("none").hooks("post_checkpoint")


def _local_exec(argv, timeout_s):
    """Stands in for `runsc exec`: runs the argv here (python3 resolved to this interpreter)."""
    import subprocess
    import sys
    argv = [sys.executable if argv[0] == "python3" else argv[0], *argv[1:]]
    # As Runsc.exec's output comes: bytes decoded as UTF-8, newlines as they are.
    p = subprocess.run(argv, capture_output=True, timeout=timeout_s)
    return p.returncode, (p.stdout + p.stderr).decode(errors="replace")


def test_http_hooks_via_exec_send_the_request_from_inside():
    with Workload({"/sleep?level=1": (200, "asleep")}) as w:
        p = profiles.get("vllm").with_port(w.port)
        recs = profiles.run_hooks(p, "pre_checkpoint", probe.Target(exec=_local_exec))
    assert w.requests == [("POST", "/sleep?level=1")]  # no address: reached from "inside", via loopback
    assert recs[0]["status"] == 200 and "asleep" in recs[0]["output"]


def test_http_hooks_send_method_and_body_both_ways():
    hook = profiles.HttpHook("/thaw/offload-weights?mode=alloc", body='{"n": 1}')
    p = profiles.Profile("b", pre_checkpoint=(hook,), post_restore=(profiles.HttpHook("/state", method="GET"),))
    for target in (LOOPBACK, probe.Target(exec=_local_exec)):
        with Workload() as w:
            profiles.run_hooks(p.with_port(w.port), "pre_checkpoint", target)
            profiles.run_hooks(p.with_port(w.port), "post_restore", target)
        assert w.requests == [("POST", "/thaw/offload-weights?mode=alloc"), ("GET", "/state")]
        assert w.bodies == [b'{"n": 1}', b""]


def test_http_hook_via_exec_error_is_a_hook_error():
    with Workload({"/thaw/pre-checkpoint": (503, "busy")}) as w:
        p = profiles.get("pytorch").with_port(w.port)
        with pytest.raises(HookError, match=r"HTTP 503 from http://127.0.0.1:\d+/thaw/pre-checkpoint "
                                            r"\(inside the sandbox\): busy"):
            profiles.run_hooks(p, "pre_checkpoint", probe.Target(exec=_local_exec))
    with pytest.raises(HookError, match="no network address and no way to exec"):
        profiles.run_hooks(profiles.get("pytorch"), "pre_checkpoint", probe.Target())


def test_jax_profile_turns_off_xla_preallocation_and_has_no_hooks():
    """XLA reserves 75 % of the GPU at its first use by default, and the CUDA checkpoint
    saves every reserved byte (issue 32): the profile keeps it to what the workload used."""
    p = profiles.get("jax")
    assert p.env == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    assert p.hooks("pre_checkpoint") == () and p.hooks("post_restore") == ()
    spec = profiles.apply_env({"process": {"env": ["XLA_PYTHON_CLIENT_PREALLOCATE=true", "A=1"]}}, p)
    assert spec["process"]["env"] == ["A=1", "XLA_PYTHON_CLIENT_PREALLOCATE=false"]
