"""Logs whose facts are fields (issue 33 item 3): a log system filters thawd's JSON
lines by key, tenant, container, decision, reason or duration instead of parsing
the message.

How a call site passes fields: `extra=fields(...)` on any logging call,

    log.info("restored %s", cid, extra=fields(container=cid, key=key, decision="restored",
                                                duration_s=secs))

or a logger that carries some for every line (`bound(log, container=cid)`).
Field names are free, but these mean one thing everywhere: key (workload key),
tenant, container (runsc/containerd id), decision, reason, duration_s
(seconds), workload, path, pid. None values are left out.

JsonFormatter writes one JSON object a line: time, level, logger, msg, the
fields, and exc (a traceback) when there is one. TextFormatter (the CLI's -v)
appends the fields as key=value. `configure` sets either on the root logger
at the level thaw's -v flags ask for.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_RESERVED = ("time", "level", "logger", "msg", "exc")
# thaw's own loggers: -vv makes these debug, and leaves boto's, urllib3's and grpc's alone.
OWN_LOGGERS = ("thaw", "thawd", "control", "runsc_hooks", "nvproxy")


def fields(**kw: Any) -> dict:
    """The `extra=` of a logging call that carries `kw` as fields (None values dropped)."""
    return {"fields": {k: v for k, v in kw.items() if v is not None}}


class _Bound(logging.LoggerAdapter):
    def process(self, msg, kwargs):
        extra = kwargs.setdefault("extra", {})
        extra["fields"] = {**self.extra, **extra.get("fields", {})}
        return msg, kwargs


def bound(logger: logging.Logger, **kw: Any) -> logging.LoggerAdapter:
    """`logger` with `kw` as fields on every line (a call's own fields win)."""
    return _Bound(logger, {k: v for k, v in kw.items() if v is not None})


def record_fields(record: logging.LogRecord) -> dict:
    f = getattr(record, "fields", None)
    return dict(f) if isinstance(f, dict) else {}


def _plain(v: Any) -> Any:
    return v if isinstance(v, (str, int, float, bool)) or v is None else str(v)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, msg, then the record's fields."""

    def format(self, record: logging.LogRecord) -> str:
        # Microseconds (RFC 3339 allows any fraction): the flood benchmark's containerd door
        # times "gate ... opened" from this field, and answers come within a few ms of it.
        d: dict[str, Any] = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                             + f".{int(record.created % 1 * 1e6):06d}Z",
                             "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage()}
        for k, v in record_fields(record).items():
            d[f"field_{k}" if k in _RESERVED else k] = _plain(v)
        if record.exc_info:
            d["exc"] = self.formatException(record.exc_info)
        return json.dumps(d)


class TextFormatter(logging.Formatter):
    """The CLI's lines on stderr: time level logger: message key=value ..."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = " ".join(f"{k}={json.dumps(_plain(v)) if isinstance(v, str) and ' ' in v else _plain(v)}"
                         for k, v in record_fields(record).items())
        if not extra:
            return line
        head, nl, tail = line.partition("\n")   # a traceback stays below the first line
        return f"{head} {extra}{nl}{tail}"


def level_of(verbose: int, daemon: bool = False) -> int:
    """-v count -> the level of thaw's loggers: a command says warnings, -v info, -vv debug;
    a daemon (`thaw serve`) says info by default."""
    if verbose >= 2:
        return logging.DEBUG
    return logging.INFO if verbose == 1 or daemon else logging.WARNING


def configure(verbose: int, *, json_lines: bool = False, daemon: bool = False, stream=None) -> None:
    """The root logger: one handler on stderr (JSON lines or text), thaw's loggers at
    level_of(verbose), everyone else's at that level but never below INFO (their
    debug output is the wire's; `-vvv` lets it through)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    level = level_of(verbose, daemon)
    root.setLevel(level if verbose >= 3 else max(level, logging.INFO))
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(level)
    # Libraries' warnings (Python's warnings module) go through this handler too, and
    # only with -v: they are for whoever maintains the environment, not a second line
    # beside a command's one-line answer. Seen 2026-12-05: Debian's pyOpenSSL, which
    # boto3's stack imports when it is on the path, warns against cryptography 51
    # ("DSA is deprecated") at every command that touches the store.
    logging.captureWarnings(True)
    logging.getLogger("py.warnings").setLevel(logging.WARNING if verbose >= 1 else logging.ERROR)
