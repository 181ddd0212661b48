"""What bench/gpu/models.py reads from runsc's debug logs: the CUDA toggle
times and the timing tables (gVisor pkg/timing) of a restore."""
from __future__ import annotations

import re
from pathlib import Path

_GO_DURATION = re.compile(r"([0-9.]+)(ns|us|µs|ms|s|m|h)")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_CUDA_TOOK = re.compile(r"cuda-checkpoint on (\d+) processes took \[([^\]]+)\]")
_ROW = re.compile(r"^\[(\d\d):(\d\d):(\d\d\.\d+)\](.*)$")
_LABEL = re.compile(r"╭─ ([^\t]+?)\s*(?:\t|$)|├─ ([^:\t]+):|╰─ END")


def go_duration(s: str) -> float:
    """Go's time.Duration.String() ("1.5s", "850.2ms", "1m2.5s") in seconds."""
    parts = _GO_DURATION.findall(s.strip())
    if not parts or "".join(a + b for a, b in parts) != s.strip():
        raise ValueError(f"not a Go duration: {s!r}")
    return sum(float(n) * _GO_UNITS[u] for n, u in parts)


def cuda_toggles(log_text: str) -> list[dict]:
    """Every "cuda-checkpoint on N processes took [D]" line (gVisor state_cuda.go)."""
    return [{"processes": int(n), "seconds": round(go_duration(d), 4)} for n, d in _CUDA_TOOK.findall(log_text)]


def timelines(log_text: str, name: str = "Restore") -> list[list[dict]]:
    """The "---- <name> timing information ----" tables runsc logs (pkg/timing),
    as rows {at_s, since_prev_s, events}; at_s counts from the first row, which is
    the start of the runsc command the timer is rooted at."""
    out: list[list[dict]] = []
    rows: list[dict] | None = None
    t_first = t_prev = 0.0
    for line in log_text.splitlines():
        if f"---- {name} timing information ----" in line:
            rows = []
            continue
        if rows is None:
            continue
        if f"---- End of {name} timing information ----" in line:
            out.append(rows)
            rows = None
            continue
        m = _ROW.match(line.strip())
        if not m:
            continue
        t = int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3])
        if not rows:
            t_first = t_prev = t
        events = []
        for lm in _LABEL.finditer(m[4]):
            events.append(lm[1] and f"start {lm[1].strip()}" or lm[2] and lm[2].strip() or "end")
        rows.append({"at_s": round(t - t_first, 6), "since_prev_s": round(t - t_prev, 6), "events": events})
        t_prev = t
    return out


def huge_pages_line(log_text: str) -> str | None:
    """runsc's boot log says whether the memory file uses huge pages (runsc/boot/loader.go createMemoryFile)."""
    m = re.findall(r"(?:Enabling|Disabling) application huge pages[^\n]*", log_text)
    return m[-1].strip() if m else None


def args_line(log_text: str) -> str | None:
    """The argv runsc logged for its command (runsc/cli/cli.go: "Args: [...]")."""
    m = re.search(r"Args: (\[.*\])", log_text)
    return m.group(1) if m else None


def page_loader_line(log_text: str) -> str | None:
    """thaw's runsc logs which background page loader a restore got (ci/patch-runsc-loader.py)."""
    m = re.findall(r"thaw: background page loader: [^\n]*", log_text)
    return m[-1].strip() if m else None


def read_logs(logdir: Path, cid: str) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(logdir.glob(f"{cid}.*")) if p.is_file())
