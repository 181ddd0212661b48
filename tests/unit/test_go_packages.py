"""The Go packages' own unit tests (`go test`), so that the README's one test
command runs them too. thaw-fetch's test the fetch engine against an
in-process HTTP server (retries, errors, O_DIRECT placement, checks)."""
from __future__ import annotations

import os
import shutil
import subprocess

from tests.conftest import REPO


def test_go_unit_tests_pass():
    go = shutil.which("go")
    assert go, "go not on PATH: the Go toolchain builds thaw (ci/build-go.sh) and runs these tests"
    r = subprocess.run([go, "test", "-count=1", "./cmd/thaw-fetch/"], cwd=REPO / "go", capture_output=True,
                       text=True, timeout=600, env={**os.environ, "CGO_ENABLED": "0"})
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "ok" in r.stdout


def test_go_image_writer_tests_pass():
    """go/internal/ociimage (thaw-image, the DaemonSet image's writer): layout,
    digests, reproducibility and bad specs, against archives it writes."""
    go = shutil.which("go")
    assert go, "go not on PATH"
    r = subprocess.run([go, "test", "-count=1", "./internal/ociimage/"], cwd=REPO / "go", capture_output=True,
                       text=True, timeout=600, env={**os.environ, "CGO_ENABLED": "0"})
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "ok" in r.stdout
