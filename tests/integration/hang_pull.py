"""Runs one pull that stops dead at a chosen point, for the kill -9 tests.

    hang_pull.py SETTINGS_JSON KEY MODE MARKER
MODE download: after the first chunk is written, one worker hangs (the
                pull never finishes the download);
     install:  after the filled entry was renamed into entries/, before the
                index row that makes it servable is written.
The marker file appears at that point; the test then sends SIGKILL.
"""
import json
import sys
import time
from pathlib import Path

from control.node import compat

from control import config

from control.images import image as images
from control.images.cache import Cache
from control.images.store import Store

overrides, key, mode, marker = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
settings = config.load(overrides=overrides, environ={})
node = compat.node_tuple(settings)


def hang() -> None:
    marker.write_text("hanging\n")
    while True:
        time.sleep(60)


progress = None
if mode == "download":
    progress = lambda n: hang()  # noqa: E731
elif mode == "install":
    Cache._commit_locked = lambda self, *a, **k: hang()
else:
    raise SystemExit(f"unknown mode {mode}")
images.pull(images.open_cache(settings), Store(settings).for_tenant(key.split(".")[0]), key, node,
            workers=settings.store_workers,
            progress=progress)
raise SystemExit("the pull finished; it should have hung")
