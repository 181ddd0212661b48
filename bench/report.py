"""What every benchmark here does with its numbers: a headline is the median
of its runs with their spread (README, "Results"), and the result is printed
and written as one JSON document (bench/results/)."""
from __future__ import annotations

import json
import statistics
from pathlib import Path


def spread(xs: list[float], digits: int = 3, runs: bool = False) -> dict:
    """Median, min, max and n of `xs` (seconds), rounded; `runs`: every value too."""
    out = {"median_s": round(statistics.median(xs), digits), "min_s": round(min(xs), digits),
           "max_s": round(max(xs), digits), "n": len(xs)}
    if runs:
        out["runs_s"] = [round(x, digits) for x in xs]
    return out


def emit(result: dict, out: Path | None) -> int:
    """Print the result and write it to `out` when given; the exit status of a finished run."""
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        out.write_text(text + "\n")
    return 0
