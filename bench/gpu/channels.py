"""How bench/gpu/models.py talks to bench/gpu/server.py inside the sandbox.

FileChannel: request files in a spool directory bind-mounted into the sandbox
(no network needed; runsc --network=none). HttpChannel: HTTP to the server's
port through the sandbox's network namespace (runsc --network=sandbox); its
pre-checkpoint, offload-weights and restore-weights requests go through the
hooks of control/lifecycle/profiles.py's pytorch and pytorch-offload profiles.
Both stop waiting early when `abort()` names a reason (the server died).
"""
from __future__ import annotations

import json
import shutil
import socket
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Callable

from control.lifecycle import profiles
from runsc_hooks import probe as probemod

SERVER_PORT = 8000   # twin: bench/gpu/server.py --port default
NONCE = "nonce"      # twin: bench/gpu/server.py NONCE


class ChannelTimeout(Exception):
    pass


# abort() -> a reason to stop waiting (the server died), or None; polled about once a second.
Abort = Callable[[], "str | None"] | None


class _Checker:
    def __init__(self, abort, every_s: float = 1.0) -> None:
        self.abort, self.every_s, self.next = abort, every_s, time.monotonic() + every_s

    def __call__(self, op: str) -> None:
        if self.abort is None or time.monotonic() < self.next:
            return
        self.next = time.monotonic() + self.every_s
        why = self.abort()
        if why:
            raise ChannelTimeout(f"gave up waiting for {op}: {why}")


class FileChannel:
    """Requests as files in the bind-mounted spool directory (server.py serve_spool)."""

    def __init__(self, spool: Path) -> None:
        self.spool = spool

    def reset(self) -> None:
        """Empty the spool, keeping the directory itself: a restored sandbox's
        gofer finds its dentries by walking names again and shares inodes by
        (device, inode number) (gVisor pkg/sentry/fsimpl/gofer restoreFile), so a
        directory deleted and made again under it changes inode number under a
        checkpointed image. Suspected, not proven, in the one restored server of
        the 2026-11-30 H200 node run whose listdir of the spool failed with
        EBADF (docs/gvisor-notes.md, last section)."""
        self.spool.mkdir(parents=True, exist_ok=True)
        for p in self.spool.iterdir():
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)

    def request(self, op: str, timeout_s: float, abort: Abort = None, **args) -> dict:
        """The server's answer to `op`, with `spool_nonce_sent`: the value this request
        wrote into the spool's NONCE file just before it, which the server reads back per
        request into `spool_nonce` (server.py serve_spool). Equal, they prove that the
        process that answered sees this spool directory at this moment: where each
        sandbox has a directory of its own (bench/gpu/node.py park rounds), which
        sandbox answered."""
        rid = uuid.uuid4().hex[:12]
        nonce = f"{self.spool.name}:{rid}"
        tmp = self.spool / f"{rid}.tmp"
        tmp.write_text(nonce)
        tmp.rename(self.spool / NONCE)
        tmp.write_text(json.dumps({"op": op, **args}))
        tmp.rename(self.spool / f"{rid}.req")
        resp = self.spool / f"{rid}.resp"
        deadline = time.monotonic() + timeout_s
        check = _Checker(abort)
        while time.monotonic() < deadline:
            try:
                return {**json.loads(resp.read_text()), "spool_nonce_sent": nonce}
            except FileNotFoundError:
                check(op)
                time.sleep(0.001)
        raise ChannelTimeout(f"no answer to {op} within {timeout_s:g} s")


class HttpChannel:
    """HTTP to the server inside the sandbox's network namespace."""

    ROUTES = {"health": ("GET", "/health"), "gpu": ("GET", "/gpu"), "generate": ("POST", "/generate"),
              "pre-checkpoint": ("POST", "/thaw/pre-checkpoint")}

    def __init__(self, host: str, port: int = SERVER_PORT) -> None:
        self.host, self.port = host, port

    def reset(self) -> None:
        pass

    def hook(self, op: str, **args) -> dict:
        """The profiles' hooks, as thaw runs them (control/lifecycle/profiles.py): the pytorch
        profile's pre-checkpoint hook, the pytorch-offload profile's offload (its last
        pre-checkpoint hook; `mode` other than the default goes in the query) and its
        post-restore hook. A hook that fails raises HookError."""
        if op == "pre-checkpoint":
            hooks = profiles.get("pytorch").pre_checkpoint
        elif op == "offload-weights":
            [h] = [h for h in profiles.get("pytorch-offload").pre_checkpoint if h.path.startswith("/thaw/offload")]
            if args.get("mode"):
                h = profiles.HttpHook(f"{h.path}?mode={args['mode']}", h.method, h.port, h.body, h.timeout_s)
            hooks = (h,)
        else:
            hooks = profiles.get("pytorch-offload").post_restore
        prof = profiles.Profile(f"bench-{op}", pre_checkpoint=tuple(hooks)).with_port(self.port)
        rec = profiles.run_hooks(prof, "pre_checkpoint", probemod.Target(address=self.host))
        return json.loads(rec[-1]["output"])

    def request(self, op: str, timeout_s: float, abort: Abort = None, **args) -> dict:
        if op in ("pre-checkpoint", "offload-weights", "restore-weights"):
            return self.hook(op, **args)
        method, path = self.ROUTES[op]
        deadline = time.monotonic() + timeout_s
        last = ""
        check = _Checker(abort)
        # Wait for the listener with short connects first: a SYN sent before
        # the sandbox's netstack is up is lost, and the kernel's SYN
        # retransmission (1 s, 3 s, ...) would then be measured, not the restore.
        while time.monotonic() < deadline:
            try:
                socket.create_connection((self.host, self.port), timeout=0.05).close()
                break
            except OSError as e:
                last = str(e)
                check(op)
                time.sleep(0.002)
        while time.monotonic() < deadline:
            req = urllib.request.Request(f"http://{self.host}:{self.port}{path}", method=method,
                                         data=b"{}" if method == "POST" else None)
            try:
                with urllib.request.urlopen(req, timeout=max(0.1, min(60.0, deadline - time.monotonic()))) as r:
                    return json.loads(r.read())
            except (urllib.error.URLError, OSError) as e:   # not listening yet / network not up yet
                last = str(getattr(e, "reason", e))
                check(op)
                time.sleep(0.005)
        raise ChannelTimeout(f"no answer to {op} within {timeout_s:g} s (last: {last})")
