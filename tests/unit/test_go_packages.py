"""The Go packages' own unit tests (`go test ./...`), so that the README's one
test command runs every one of them: thaw-fetch's (the fetch engine against an
in-process HTTP server: retries, errors, O_DIRECT placement, checks), the
stand-in's (argv parsing, gRPC status -> thaw error kind), and any added later."""
from __future__ import annotations

import os
import shutil
import subprocess

from tests.conftest import REPO


def test_go_unit_tests_pass():
    go = shutil.which("go")
    assert go, "go not on PATH: the Go toolchain builds thaw (ci/build-go.sh) and runs these tests"
    r = subprocess.run([go, "test", "-count=1", "./..."], cwd=REPO / "go", capture_output=True,
                       text=True, timeout=600, env={**os.environ, "CGO_ENABLED": "0"})
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    ran = {line.split()[1] for line in r.stdout.splitlines() if line.startswith("ok ")}
    # The packages whose tests guard the product: a rename that drops one from ./... fails here.
    for pkg in ("cmd/thaw-fetch", "cmd/thaw-ctrinfo", "internal/standin", "internal/runscargv"):
        assert f"thaw.dev/thaw/go/{pkg}" in ran, (pkg, r.stdout[-2000:])
