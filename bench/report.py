"""What every benchmark here does with its numbers: a headline is the median
of its runs with their spread (README, "Results"), and the result is printed
and written as one JSON document (bench/results/)."""
from __future__ import annotations

import json
import statistics
from pathlib import Path


def spread(xs: list[float], digits: int = 3, runs: bool = False, unit: str = "s") -> dict:
    """Median, min, max and n of `xs` (in `unit`, which names the keys: median_s,
    median_mb_s; "" for a plain ratio), rounded; `runs`: every value too."""
    u = f"_{unit}" if unit else ""
    out = {f"median{u}": round(statistics.median(xs), digits), f"min{u}": round(min(xs), digits),
           f"max{u}": round(max(xs), digits), "n": len(xs)}
    if runs:
        out[f"runs{u}"] = [round(x, digits) for x in xs]
    return out


def emit(result: dict, out: Path | None) -> int:
    """Print the result and write it to `out` when given; the exit status of a finished run."""
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        out.write_text(text + "\n")
    return 0
