"""Shared test plumbing.

Tiers by directory: tests/unit (fakes only), tests/functional (real processes
and sockets, fake runsc), tests/integration (real runsc, netns, S3). An
integration test whose precondition is missing FAILS: it never skips.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BUILD = Path(os.environ.get("THAW_BUILD_DIR", REPO / "build"))


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = Path(str(item.fspath)).relative_to(REPO / "tests").parts[0]
        if tier in ("unit", "functional", "integration"):
            item.add_marker(getattr(pytest.mark, tier))


def test_name(request) -> str:
    """A short name for what a test creates: derived from the test id, valid as
    a container id, netns name and S3 key component."""
    name = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")
    return ("t-" + name)[:40].rstrip("-")


@pytest.fixture
def name(request) -> str:
    return test_name(request)


def require(cond: bool, what: str) -> None:
    """Integration preconditions: fail loudly, never skip."""
    if not cond:
        pytest.fail(f"integration precondition missing: {what} (run `make setup` as root)", pytrace=False)


@pytest.fixture(scope="session")
def runsc_bin() -> Path:
    p = BUILD / "runsc"
    require(p.is_file() and os.access(p, os.X_OK), f"runsc built at {p}")
    require(os.geteuid() == 0, "root")
    return p
