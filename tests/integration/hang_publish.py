"""Runs one checkpoint publish that stops dead at a chosen point, for the kill -9 tests.

    hang_publish.py SETTINGS_JSON IMAGE_DIR KEY MODE MARKER
The image in IMAGE_DIR is written into a staged cache partial (as `runsc
checkpoint` writes it for thawd: images.staged), then images.publish_staged runs:
MODE upload:  after the first pack was sent, the upload hangs (no manifest yet);
     install: after the published image was renamed into entries/, before the
              index row that makes it servable is written.
The marker file appears at that point; the test then sends SIGKILL.
"""
import json
import shutil
import sys
import time
from pathlib import Path

from control import config
from control.images import image as images
from control.images.cache import Cache
from control.images.store import Store
from control.lifecycle.tenant import store_tenant
from control.node import compat

overrides, src, key, mode, marker = json.loads(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4], \
    Path(sys.argv[5])
settings = config.load(overrides=overrides, environ={})
node = compat.node_tuple(settings)


def hang(*_a, **_k) -> None:
    marker.write_text("hanging\n")
    while True:
        time.sleep(60)


progress = None
if mode == "upload":
    progress = hang
elif mode == "install":
    Cache._commit_locked = hang
else:
    raise SystemExit(f"unknown mode {mode}")
cache = images.open_cache(settings)
with images.staged(cache, key, node) as st:
    for f in src.iterdir():
        shutil.copyfile(f, st.path / f.name)
    images.publish_staged(cache, Store(settings).for_tenant(store_tenant(key)), st, chunker=settings.pack_chunker,
                          avg_chunk=settings.pack_avg_chunk_bytes, workers=settings.store_workers, progress=progress)
raise SystemExit("the publish finished; it should have hung")
