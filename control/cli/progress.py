"""Progress on stderr: `Progress` times long steps (one line per step), `Bar`
shows bytes moved (push, pull).

On a terminal the line updates in place; elsewhere (CI, pipes) each step
prints once when it ends, so logs stay readable. A step that fails prints
nothing: the error's one line (control/cli/common.py) says it.
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


class Bar:
    """One line on stderr: label, percent, bytes done / total, bytes/s. Thread-safe."""

    def __init__(self, label: str, enabled: bool) -> None:
        self.label, self.enabled = label, enabled
        self.total = 0
        self.done = 0
        self.t0 = time.monotonic()
        self._last = 0.0
        self._lock = threading.Lock()

    def set_total(self, n: int) -> None:
        self.total = n
        self.t0 = time.monotonic()

    def __call__(self, n: int) -> None:
        with self._lock:
            self.done += n
            now = time.monotonic()
            if self.enabled and now - self._last >= 0.1:
                self._last = now
                self._draw("\r")

    def _draw(self, lead: str, end: str = "") -> None:
        dt = max(time.monotonic() - self.t0, 1e-6)
        pct = 100.0 * self.done / self.total if self.total else 100.0
        width = 24
        fill = int(width * min(pct, 100) / 100)
        sys.stderr.write(f"{lead}{self.label} [{'#' * fill}{'.' * (width - fill)}] {pct:5.1f}% "
                         f"{size(self.done)}/{size(self.total)} {size(self.done / dt)}/s{end}")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw("\r", "\n")


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)
