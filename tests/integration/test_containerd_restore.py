"""Transparent restore under containerd: real containerd + gVisor's shim +
thaw's stand-in + runsc + thawd + SeaweedFS. Containers are started with
plain `ctr run`; nothing in how they start knows about thaw."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from control import config as configmod
from control import ocibuild
from control.containerd import PrivateContainerd
from control.seaweed import Seaweed

from tests.conftest import BUILD, require
from tests.integration.conftest import THAW

IMAGE = "thaw.dev/test/counter:1"
# A workload with a costly warm-up whose state lives in memory: a random boot
# id chosen at start and a counter ticking every 100 ms. A restored container
# keeps the boot id and continues the counter; a cold one gets a new boot id.
COUNTER = b"""#!/bin/sh
boot=$(cat /proc/sys/kernel/random/uuid)
n=0; while [ $n -lt ${WARMUP:-30000} ]; do n=$((n+1)); done
echo $boot > /tmp/boot
touch /tmp/ready
i=0
while true; do i=$((i+1)); echo "$boot $i" > /tmp/state; sleep 0.1; done
"""
ANNOTATIONS = {"thaw.dev/workload": "counter", "thaw.dev/ready": "file:/tmp/ready"}


class Stack:
    """SeaweedFS + thawd + a private containerd, all under one base directory."""

    def __init__(self, base: Path, name: str, extra_env: dict[str, str] | None = None) -> None:
        self.base, self.name = base, name
        self.extra_env = extra_env or {}
        self.weed = Seaweed(base / "weed")
        self.thawd: subprocess.Popen | None = None

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("THAW_", "AWS_"))}
        env.update({
            "THAW_NODE_STATE_DIR": str(self.base / "state"), "THAW_NODE_LOG_DIR": str(self.base / "log"),
            "THAW_CACHE_DIR": str(self.base / "cache"), "THAW_THAWD_SOCKET": str(self.base / "thawd" / "thawd.sock"),
            "THAW_THAWD_METRICS_ADDR": "", "THAW_RUNSC_PATH": str(BUILD / "runsc"),
            "THAW_RUNSC_ROOT": str(self.base / "thaw-runsc-root"),
            "THAW_STORE_ENDPOINT": self.weed.endpoint, "THAW_STORE_BUCKET": self.name,
            "THAW_STORE_CREDENTIALS_FILE": str(self.base / "aws-credentials"),
            "THAW_PACK_CHUNKER": str(BUILD / "thaw-chunk"), "THAW_THAWD_HEALTH_TIMEOUT_S": "20",
            **self.extra_env,
        })
        return env

    def settings(self) -> configmod.Settings:
        (self.base / "empty.toml").write_text("")
        return configmod.load(environ=self.env(), config_file=self.base / "empty.toml")

    def start(self) -> "Stack":
        self.base.mkdir(parents=True, exist_ok=True)
        self.weed.start()
        self.weed.credentials.write_aws_file(self.base / "aws-credentials")
        self.start_thawd()
        self.ctrd = PrivateContainerd(self.base / "ctrd", BUILD, self.settings()).start()
        ocibuild.build(self.base / "image.tar", IMAGE, ocibuild.busybox_files(
            BUILD / "busybox", {"/app/run.sh": ocibuild.File(COUNTER, 0o755)}), ["/app/run.sh"])
        self.ctrd.import_image(self.base / "image.tar")
        return self

    def start_thawd(self) -> None:
        self.thawd_log = open(self.base / "thawd.log", "ab")
        self.thawd = subprocess.Popen([str(THAW), "serve"], env=self.env(), stdout=self.thawd_log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        sock = self.base / "thawd" / "thawd.sock"
        end = time.monotonic() + 60
        while not sock.exists():
            if self.thawd.poll() is not None or time.monotonic() > end:
                pytest.fail(f"thawd did not start: {(self.base / 'thawd.log').read_text()[-2000:]}")
            time.sleep(0.1)

    def stop_thawd(self) -> None:
        if self.thawd and self.thawd.poll() is None:
            self.thawd.send_signal(signal.SIGTERM)
            self.thawd.wait(20)
        self.thawd = None
        if getattr(self, "thawd_log", None):
            self.thawd_log.close()
            self.thawd_log = None

    def stop(self) -> None:
        if hasattr(self, "ctrd"):
            self.ctrd.stop()
        self.stop_thawd()
        self.weed.stop()

    def thaw(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(THAW), *args], env=self.env(), capture_output=True, text=True, timeout=60)

    def stats(self) -> dict:
        p = self.thaw("stats", "--json")
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    def decisions(self) -> list[dict]:
        p = self.ctrd.base / "standin.log"
        return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []

    def state(self, cid: str, timeout_s: float = 60) -> tuple[str, int]:
        """(boot id, counter) read from inside the container."""
        end = time.monotonic() + timeout_s
        while True:
            p = self.ctrd.exec(cid, "cat", "/tmp/state", check=False)
            if p.returncode == 0 and len(p.stdout.split()) == 2:
                boot, i = p.stdout.split()
                return boot, int(i)
            if time.monotonic() > end:
                pytest.fail(f"{cid} never reported state: {p.stderr[-500:]}")
            time.sleep(0.1)

    def wait_published(self, timeout_s: float = 120) -> dict:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            entries = [e for e in self.stats()["entries"] if e["state"] == "ready"]
            if entries:
                return entries[0]
            time.sleep(0.5)
        pytest.fail(f"no image was published; thawd log: {(self.base / 'thawd.log').read_text()[-3000:]}")


@pytest.fixture
def cs(name, runsc_bin):
    require((BUILD / "thaw-runsc").is_file(), "the stand-in built at build/thaw-runsc")
    require((BUILD / "busybox").is_file(), "build/busybox (make setup)")
    base = Path(f"/tmp/thaw-it/{name}")
    s = Stack(base, name)
    try:
        yield s.start()
    finally:
        s.stop()
        subprocess.run(["rm", "-rf", str(base)])


def test_cold_then_published_then_restored(cs):
    cs.ctrd.run(IMAGE, "first", ANNOTATIONS)
    boot1, _ = cs.state("first")
    entry = cs.wait_published()
    assert entry["key"].startswith("default.counter.")
    saved_boot, saved_i = cs.state("first")
    assert saved_boot == boot1  # --leave-running: the cold container keeps serving
    cs.ctrd.remove("first")

    cs.ctrd.run(IMAGE, "second", ANNOTATIONS)
    boot2, i2 = cs.state("second")
    assert boot2 == boot1, "the second container must come up restored, with the first one's memory"
    assert i2 > 1
    d = [x for x in cs.decisions() if x["id"] == "second"]
    assert [x["decision"] for x in d] == ["restore", "restored"], d
    counters = cs.stats()["counters"]
    assert counters.get("thaw_restores_total") == 1 and counters.get("thaw_cold_starts_total") == 1
    cs.ctrd.remove("second")
    assert cs.stats()["entries"][0]["leases"] == 0  # delete released the lease


def test_thawd_down_means_cold_start(cs):
    cs.ctrd.run(IMAGE, "warm", ANNOTATIONS)
    boot1, _ = cs.state("warm")
    cs.wait_published()
    cs.ctrd.remove("warm")
    cs.stop_thawd()
    cs.ctrd.run(IMAGE, "cold", ANNOTATIONS)
    boot2, _ = cs.state("cold")
    assert boot2 != boot1
    d = [x for x in cs.decisions() if x["id"] == "cold"]
    assert d[0]["decision"] == "cold" and "thawd-unavailable" in d[0]["reason"]
    cs.ctrd.remove("cold")


def test_not_opted_in_is_plain_runsc(cs):
    cs.ctrd.run(IMAGE, "plain")
    cs.state("plain")
    assert [x for x in cs.decisions() if x["id"] == "plain"] == []
    cs.ctrd.remove("plain")


def test_corrupt_cached_image_is_refetched(cs):
    cs.ctrd.run(IMAGE, "src", ANNOTATIONS)
    boot1, _ = cs.state("src")
    cs.wait_published()
    cs.ctrd.remove("src")
    entry_dir = next((cs.base / "cache" / "entries").iterdir())
    pages = entry_dir / "pages.img"
    with open(pages, "r+b") as f:
        f.seek(pages.stat().st_size // 2)
        f.write(b"\xff" * 4096)
    cs.ctrd.run(IMAGE, "again", ANNOTATIONS)
    boot2, _ = cs.state("again")
    assert boot2 == boot1, "a corrupt cache entry is refetched from the store, then restored"
    assert cs.stats()["counters"].get("thaw_cache_misses_total", 0) >= 1
    cs.ctrd.remove("again")


def test_two_at_once_restore_with_one_download(cs):
    cs.ctrd.run(IMAGE, "seed", ANNOTATIONS)
    boot1, _ = cs.state("seed")
    cs.wait_published()
    cs.ctrd.remove("seed")
    assert cs.thaw("evict", next(e["key"] for e in cs.stats()["entries"])).returncode == 0
    with __import__("concurrent.futures").futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda c: cs.ctrd.run(IMAGE, c, ANNOTATIONS), ["a", "b"]))
    assert cs.state("a")[0] == boot1 and cs.state("b")[0] == boot1
    c = cs.stats()["counters"]
    assert c.get("thaw_restores_total") == 2
    assert c.get("thaw_cache_misses_total", 0) == 1, c  # one fetch served both
    for cid in ("a", "b"):
        cs.ctrd.remove(cid)


def test_pass_through_matches_runsc(cs):
    cs.ctrd.run(IMAGE, "pt", ANNOTATIONS)
    cs.state("pt")
    root = str(cs.ctrd.runsc_root / "thaw")
    for args in (["state", "pt"], ["list", "--format=json"], ["ps", "--format=json", "pt"]):
        a = subprocess.run([str(BUILD / "thaw-runsc"), f"--root={root}", *args], capture_output=True, text=True,
                           env={"THAW_REAL_RUNSC": str(BUILD / "runsc"), "PATH": "/usr/bin:/bin"})
        b = subprocess.run([str(BUILD / "runsc"), f"--root={root}", *args], capture_output=True, text=True)
        assert (a.returncode, a.stdout) == (b.returncode, b.stdout), args
    cs.ctrd.remove("pt")


def test_failed_restores_fall_back_cold_and_quarantine(name, runsc_bin):
    base = Path(f"/tmp/thaw-it/{name}")
    s = Stack(base, name, extra_env={"THAW_THAWD_QUARANTINE_AFTER": "1"})
    try:
        s.start()
        s.ctrd.run(IMAGE, "seed", ANNOTATIONS)
        boot1, _ = s.state("seed")
        key = s.wait_published()["key"]
        s.ctrd.remove("seed")
        # Damage the cached image so that only runsc notices: same size and mtime.
        ckpt = next((base / "cache" / "entries").iterdir()) / "checkpoint.img"
        st = ckpt.stat()
        with open(ckpt, "r+b") as f:
            f.write(b"\0" * 4096)
        os.utime(ckpt, ns=(st.st_atime_ns, st.st_mtime_ns))

        s.ctrd.run(IMAGE, "victim", ANNOTATIONS)
        boot2, _ = s.state("victim")
        assert boot2 != boot1, "the failed restore must end in a working cold container"
        d = [x["decision"] for x in s.decisions() if x["id"] == "victim"]
        assert d == ["restore", "restore-failed", "started-cold-after-failed-restore"], d
        entry = next(e for e in s.stats()["entries"] if e["key"] == key)
        assert entry["state"] == "quarantined" and "restores in a row failed" in entry["reason"]
        s.ctrd.remove("victim")

        s.ctrd.run(IMAGE, "after", ANNOTATIONS)
        s.state("after")
        d = [x for x in s.decisions() if x["id"] == "after"]
        assert d[0]["decision"] == "cold" and d[0]["reason"].startswith("quarantined"), d
        s.ctrd.remove("after")
    finally:
        s.stop()
        subprocess.run(["rm", "-rf", str(base)])
