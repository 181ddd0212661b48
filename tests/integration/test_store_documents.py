"""Documents from the store are read bounded (issue 30): real SeaweedFS, the real `thaw` CLI.

A manifest larger than the cap is refused after the cap, not after a whole download (the
issue's 1.6 GB manifest peaked at 3.3 GB); a deeply nested one is one line naming it (it
was exit 70, RecursionError); `thaw ls` lists the rest of the tenant's images beside it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from control.images.manifest import MAX_MANIFEST_BYTES
from control.images.store import Store
from control.node.compat import node_tuple
from tests.integration.conftest import THAW, cli_env

TENANT = "user-root"


def put(settings, key: str, body: bytes) -> str:
    """Write `body` as KEY's manifest for this node's tuple (no manifest key configured)."""
    store = Store(settings).for_tenant(TENANT)
    th = node_tuple(settings).hash()
    name = store.manifest_name(key, th)
    store.client.put_object(Bucket=store.bucket, Key=name, Body=body)
    return name


# Runs one command as its only child and reports that child's peak RSS (KiB) last on stderr.
_RSS = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
        "print('MAXRSS', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
        "sys.exit(p.returncode)")


def thaw_rss(settings, *args: str) -> tuple[int, str, str, int]:
    """(exit status, stdout, stderr, peak RSS in MB) of one `thaw` process."""
    r = subprocess.run([sys.executable, "-c", _RSS, str(THAW), *args], env=cli_env(settings), capture_output=True,
                       text=True, stdin=subprocess.DEVNULL, timeout=300)
    err, _, last = r.stderr.rstrip("\n").rpartition("\n")
    assert last.startswith("MAXRSS "), r.stderr[-2000:]
    return r.returncode, r.stdout, err, int(last.split()[1]) // 1024


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("thaw: error: ")]


def test_a_manifest_over_the_cap_is_refused_without_reading_it_whole(settings, name):
    key = f"{TENANT}.{name}"
    big = b'{"schema": "thaw.manifest", "pad": "' + b"x" * (MAX_MANIFEST_BYTES + (16 << 20)) + b'"}'
    obj = put(settings, key, big)
    rc, _, err, rss_mb = thaw_rss(settings, "pull", key)
    assert rc == 2, (rc, err[-2000:])
    [line] = error_lines(err)
    assert obj in line and "at most" in line and len(line) < 600, line
    # The document is 80 MB; a read that stopped at the cap holds at most 64 MB of it.
    assert rss_mb < 64 + 200, f"peak RSS {rss_mb} MB: the manifest was read past its cap"


def test_a_deeply_nested_manifest_is_one_line_and_ls_lists_the_rest(settings, name, tmp_path):
    good = f"{TENANT}.{name}-good"
    image = tmp_path / "img"
    image.mkdir()
    (image / "checkpoint.img").write_bytes(os.urandom(300_000))
    (image / "pages.img").write_bytes(os.urandom(1_000_000))
    r = subprocess.run([str(THAW), "push", str(image), "--key", good, "--no-cache"], env=cli_env(settings),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    bad = f"{TENANT}.{name}-deep"
    obj = put(settings, bad, b"[" * 100_000 + b"]" * 100_000)
    rc, _, err, _ = thaw_rss(settings, "pull", bad)
    assert rc == 2, (rc, err[-2000:])
    [line] = error_lines(err)
    assert obj in line and "nested too deeply" in line and "RecursionError" not in err, err[-2000:]

    rc, out, err, _ = thaw_rss(settings, "ls", "--json")
    assert rc == 0, err[-2000:]
    remote = {row["key"]: row for row in json.loads(out)["remote"]}
    assert remote[good]["valid"] and remote[good]["match"], remote[good]
    assert remote[bad]["valid"] is False and "nested too deeply" in remote[bad]["reasons"][0]
    assert f"skipping manifest {obj}" in err, err[-2000:]


def test_push_publishes_the_tuple_the_image_was_made_with(settings, name, tmp_path):
    """Issue 30: `thaw push` published an image under the pushing node's tuple. An image whose
    thaw.json records another node's (here: another machine type) is published under that one,
    with a warning, and this node's pull says why it cannot restore it (exit 3, the field)."""
    import dataclasses
    node = node_tuple(settings)
    theirs = dataclasses.replace(node, machine_type=f"other-{name}")
    image = tmp_path / "img"
    image.mkdir()
    (image / "checkpoint.img").write_bytes(os.urandom(200_000))
    (image / "pages.img").write_bytes(os.urandom(500_000))
    (image / "thaw.json").write_text(json.dumps({"door": "thawd", "tuple": theirs.to_dict()}))
    key = f"{TENANT}.{name}"
    r = subprocess.run([str(THAW), "push", str(image), "--key", key, "--no-cache", "--json"], env=cli_env(settings),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tuple_hash"] == theirs.hash() != node.hash()
    assert "made on another node" in r.stderr and "machine_type" in r.stderr, r.stderr
    store = Store(settings).for_tenant(TENANT)
    assert store.get_manifest(key, theirs.hash()) is not None and store.get_manifest(key, node.hash()) is None
    rc, _, err, _ = thaw_rss(settings, "pull", key)
    assert rc == 3 and f"machine_type: image has 'other-{name}'" in err, err[-2000:]
