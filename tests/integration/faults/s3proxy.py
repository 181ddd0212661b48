"""Drives thaw-s3proxy (go/cmd/thaw-s3proxy), the fault proxy that fault tests
and bench/faults_store.py put in front of a real S3 endpoint (SeaweedFS).
Its control API is in docs/s3proxy.md."""
from __future__ import annotations

import json
import select
import subprocess
import time
import urllib.request
from pathlib import Path


class S3Proxy:
    """One thaw-s3proxy process in front of `upstream`; clients use `endpoint`."""

    def __init__(self, binary: Path, upstream: str, log: Path) -> None:
        self.binary, self.upstream, self.log = Path(binary), upstream, Path(log)
        self.proc: subprocess.Popen | None = None
        self.endpoint = ""
        self.control = ""

    def start(self, timeout_s: float = 10.0) -> "S3Proxy":
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen([str(self.binary), "-upstream", self.upstream], stdout=subprocess.PIPE,
                                         stderr=err, stdin=subprocess.DEVNULL)
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            self.stop()
            raise RuntimeError(f"thaw-s3proxy printed no address in {timeout_s} s: {self.log.read_text()[-2000:]}")
        ready_msg = json.loads(line)
        self.endpoint, self.control = ready_msg["endpoint"], ready_msg["control"]
        return self

    def _call(self, method: str, path: str, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.control + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def add(self, **fault) -> int:
        """Add a fault (kind=error|refuse|reset|stall|throttle|corrupt, ...); its id."""
        return self._call("POST", "/faults", fault)["id"]

    def faults(self) -> list[dict]:
        return self._call("GET", "/faults")

    def fault(self, fid: int) -> dict:
        return next(f for f in self.faults() if f["id"] == fid)

    def remove(self, fid: int) -> None:
        self._call("DELETE", f"/faults/{fid}")

    def clear(self) -> None:
        self._call("DELETE", "/faults")

    def stats(self) -> dict:
        return self._call("GET", "/stats")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.proc = None

    def wait_inactive(self, fid: int, timeout_s: float) -> dict:
        """Wait until fault `fid`'s window has ended; the fault."""
        deadline = time.monotonic() + timeout_s
        while True:
            f = self.fault(fid)
            if not f["active"] and f.get("opened") or time.monotonic() > deadline:
                return f
            time.sleep(0.1)

    def __enter__(self) -> "S3Proxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
