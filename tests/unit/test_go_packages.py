"""The Go packages' own unit tests (`go test ./...`), so that the README's one
test command runs every one of them: go/internal/fetch's (the one fetch engine
against an in-process HTTP server: the retry policy, errors, O_DIRECT placement,
checks) and thaw-fetch's (its CLI protocol), the
stand-in's (argv parsing, gRPC status -> thaw error kind, how it reads thaw's configuration),
thaw-s3proxy's (its faults and throttle against an in-process upstream), thaw-relay's and
go/internal/relay's (a parked sandbox's stdio relay over real pipes and Unix sockets), and any added later."""
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
    for pkg in ("internal/fetch", "cmd/thaw-fetch", "cmd/thaw-ctrinfo", "cmd/thaw-s3proxy", "cmd/thaw-relay",
                "internal/ociimage", "internal/standin", "internal/runscargv", "internal/stream", "internal/progress", "internal/relay"):
        assert f"thaw.dev/thaw/go/{pkg}" in ran, (pkg, r.stdout[-2000:])


def test_thaw_runsc_imports_no_grpc_and_no_toml():
    """thaw-runsc runs on every runsc call the shim makes: Go runs every
    imported package's initializers first, so it must not pull in what the
    stand-in's hooks use (gRPC, the TOML reader of go/internal/standin/config.go)."""
    go = shutil.which("go")
    assert go
    r = subprocess.run([go, "list", "-deps", "./cmd/thaw-runsc"], cwd=REPO / "go", capture_output=True, text=True,
                       timeout=300, env={**os.environ, "CGO_ENABLED": "0"})
    assert r.returncode == 0, r.stderr
    deps = r.stdout.split()
    assert "thaw.dev/thaw/go/internal/runscargv" in deps
    heavy = [d for d in deps if d.startswith(("google.golang.org/grpc", "github.com/pelletier/",
                                               "github.com/BurntSushi/", "thaw.dev/thaw/go/internal/standin"))]
    assert heavy == []
