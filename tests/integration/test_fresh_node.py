"""A node from nothing: `thaw provision` into the real paths (inside a private
mount namespace, see fresh_node.py), then containerd and thawd as the node
would start them, and a container that restores. The issue-7 "done when"."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import BUILD, require

SCRIPT = Path(__file__).with_name("fresh_node.py")


def _kill_leftovers(work: Path) -> None:
    pids = work / "pids"
    if pids.exists():
        for line in pids.read_text().split():
            try:
                os.killpg(int(line), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_fresh_node_provisions_and_restores(weed, name):
    require(shutil.which("unshare") is not None, "unshare (util-linux)")
    for b in ("containerd", "ctr", "containerd-shim-runsc-v1", "runsc", "thaw-runsc", "thaw-runsc-hooks",
              "thaw-chunk", "thaw-fetch", "thaw-gofer", "thaw-ctrinfo", "busybox"):
        require((BUILD / b).is_file(), f"{b} built in {BUILD} (make setup)")
    work = Path(f"/tmp/thaw-it/{name}")
    _kill_leftovers(work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    creds = weed.credentials.write_aws_file(work / "aws-credentials")
    bucket = name.replace("_", "-")[:60]
    try:
        p = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, str(SCRIPT),
                            str(work), weed.endpoint, bucket, str(creds)],
                           capture_output=True, text=True, timeout=900)
        assert p.stdout.strip(), p.stderr[-4000:]
        report = json.loads(p.stdout.strip().splitlines()[-1])
        assert p.returncode == 0, (report.get("error"), report.get("cleanup_error"), p.stderr[-4000:])
        steps = {s["step"]: s for s in report["steps"]}

        prov = steps["provision"]["actions"]
        assert prov["install runsc"] == "create" and prov["install thaw-runsc"] == "create"
        assert prov["install thaw-chunk"] == "create" and prov["install thaw-fetch"] == "create"
        assert prov["install thaw-ctrinfo"] == "create" and prov["install thaw-gofer"] == "create"
        assert prov["thawd unit"] == "create"
        assert steps["provision again"]["rc"] == 0 and steps["provision again"]["changed"] == []
        assert steps["unit"]["exists"] and steps["unit"]["enabled"]
        cfg = steps["unit"]["config"]
        assert 'path = "/opt/thaw/bin/runsc"' in cfg and 'chunker = "/opt/thaw/bin/thaw-chunk"' in cfg
        assert 'fetcher = "/opt/thaw/bin/thaw-fetch"' in cfg and 'info = "/opt/thaw/bin/thaw-ctrinfo"' in cfg
        assert 'gofer = "/opt/thaw/bin/thaw-gofer"' in cfg   # store.stream is on by default: a miss streams
        assert weed.endpoint in cfg
        assert 'socket = "/run/thaw/fresh-node/thawd.sock"' in cfg and "fresh-node-standin.log" in cfg
        assert steps["containerd"]["handler"]

        first, second = steps["first start"], steps["second start"]
        assert second["boot"] == first["boot"], "the second start is restored: same boot id"
        # The restored loop goes on from the checkpoint's count, which may be below what the
        # first container showed: thawd checkpoints once /tmp/ready exists, and the first
        # read of /tmp/state can come later (it did under load: 2 after 3). A cold start has
        # another boot id, so the boot is the proof; the count only has to have gone on.
        assert second["counter"] >= 1
        decisions = steps["stand-in decisions"]["decisions"]
        assert [d["decision"] for d in decisions if d["id"] == "first"][0] == "cold"
        assert [d["decision"] for d in decisions if d["id"] == "second"][0] == "restore"
        assert steps["doctor"]["rc"] == 0, steps["doctor"]
    finally:
        _kill_leftovers(work)
        shutil.rmtree(work, ignore_errors=True)
