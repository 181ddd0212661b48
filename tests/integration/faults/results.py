"""Fault injection tests share this: measured counts go to $THAW_FAULTS_OUT (a
directory) as faults-<test>-<date>.json when it is set; bench/results/ holds
the committed ones."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path


def write_results(name: str, data: dict) -> Path | None:
    """Write the counts of one fault test as JSON under $THAW_FAULTS_OUT; the path, or None when unset."""
    out = os.environ.get("THAW_FAULTS_OUT")
    if not out:
        return None
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"faults-{name}-{time.strftime('%Y-%m-%d')}.json"
    p.write_text(json.dumps({"measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": os.uname().nodename,
                             "cpus": os.cpu_count(), **data}, indent=2, sort_keys=True) + "\n")
    return p
