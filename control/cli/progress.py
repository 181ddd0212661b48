"""Progress display for long steps: one line per step on stderr.

On a terminal the line updates in place with the elapsed time; elsewhere (CI,
pipes) each step prints once when it ends, so logs stay readable. A step that
fails prints nothing: the error's one line (control/cli/common.py) says it.
"""
from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator


class Progress:
    def __init__(self, enabled: bool = True, stream=None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and self.stream.isatty()

    @contextmanager
    def step(self, label: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        t0 = time.monotonic()
        stop = threading.Event()
        ticker = None
        if self.tty:
            def tick() -> None:
                while not stop.wait(0.1):
                    self.stream.write(f"\r  {label} ... {time.monotonic() - t0:5.1f}s")
                    self.stream.flush()
            ticker = threading.Thread(target=tick, daemon=True)
            ticker.start()
        ok = False
        try:
            yield
            ok = True
        finally:
            stop.set()
            if ticker:
                ticker.join()
            if ok:
                self.stream.write(f"{chr(13) if self.tty else ''}  {label} ... done ({time.monotonic() - t0:.2f}s)\n")
            elif self.tty:
                self.stream.write("\r\033[K")  # the error's one line says what failed
            self.stream.flush()
