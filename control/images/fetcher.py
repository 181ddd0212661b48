"""The Go fetch engine (go/internal/fetch), driven from Python: a pull's fill
(`thaw-fetch`, control/images/transfer.py) and a stream (`thaw-gofer stream`,
control/images/stream.py) each run it as one child process that speaks the
same protocol:

  - the plan, one JSON object, on its stdin (then closed); it may hold chunk
    keys, so it goes nowhere else: no argv, no file, no log;
  - on its stdout, one JSON object a line: {"done": BYTES} as bytes are
    written (a running total: the progress bar), other lines the helper's
    own ({"listening": ...} from a stream), and last {"stats": ...} or
    {"error": {"kind": "integrity"|"store"|"io", ...}} (go/internal/fetch
    Error);
  - exit 0, 1 after an error line, 2 for a plan it cannot execute (why on
    stderr).

`run` is that protocol, once: the error line becomes the same IntegrityError
or StoreError a pull has always raised, whichever helper sent it. The helper
dies with the thread that waits for it (both set PDEATHSIG), and is killed
if that thread is interrupted, so nothing goes on writing into a partial
entry its caller is about to remove.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

from control import metrics
from control.errors import IntegrityError, PreconditionError, StoreError, ThawError

Progress = Callable[[int], None]   # called with the bytes written since the last call


def require(binary: Path, name: str, setting: str, env: str) -> Path:
    """`binary` (helper `name`) if it is a file, else a PreconditionError naming
    the setting that points at it."""
    if not binary.is_file():
        raise PreconditionError(f"{name} not found at {binary}: run `make build`, or set {setting} ({env})",
                                path=str(binary))
    return binary


def run(argv: list[str], plan: dict, store, *, progress: Progress | None = None,
        on_message: Callable[[dict], None] | None = None) -> dict:
    """Run the helper `argv` on `plan`; its last line (the one with "stats") on
    success. `on_message` sees every line but the "done" ones as it comes (the
    last line too, also on failure). Raises IntegrityError, StoreError (naming
    `store`'s object and endpoint) or ThawError."""
    env = dict(os.environ)
    if env.get("AWS_CA_BUNDLE") and not env.get("SSL_CERT_FILE"):
        env["SSL_CERT_FILE"] = env["AWS_CA_BUNDLE"]   # boto3's CA bundle, for Go's TLS
    result: dict = {}
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env)
        try:
            try:
                proc.stdin.write(json.dumps(plan, separators=(",", ":")).encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass   # it refused the plan: its exit status and stderr say why
            done = 0
            for line in proc.stdout:
                msg = json.loads(line)
                if "done" in msg:
                    if progress and msg["done"] > done:
                        progress(msg["done"] - done)
                    done = msg["done"]
                    continue
                result = msg
                if on_message is not None:
                    on_message(msg)
            rc = proc.wait()
        finally:
            if proc.poll() is None:   # interrupted: stop its GETs and writes before the caller removes them
                proc.kill()
                proc.wait()
            proc.stdout.close()
        err.seek(0)
        stderr = err.read().decode(errors="replace").strip()
    if "stats" in result and "error" not in result and rc == 0:
        return result
    e = result.get("error")
    if e and e.get("kind") == "integrity":
        raise IntegrityError("store", e.get("chunk", ""), e["detail"])
    if e and e.get("kind") == "store":
        metrics.inc("thaw_store_errors_total", op="get")
        raise StoreError("get", f"{store.uri(e.get('object', ''))} bytes {e.get('offset')}+{e.get('length')}",
                         e["detail"], store.endpoint)
    if e:
        raise ThawError(f"writing {e.get('object', '')} at offset {e.get('offset')}: {e['detail']}")
    name = " ".join([Path(argv[0]).name, *argv[1:]])
    raise ThawError(f"{name} failed (exit {rc}): {stderr[-2000:] or 'no message'}")
