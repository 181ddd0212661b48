"""thaw-gofer's own cost of serving an image in verify mode (issue 30), without runsc: the
loader's sweep (256 KiB reads, 8 at once) over 256 MiB of random bytes in the page cache, plain
preads against each chunk checked (its BLAKE3, once) as reads touch it. Go's benchmark
(go/internal/stream/verify_test.go BenchmarkServePlain, BenchmarkServeVerified), run `--count`
times alternating, CPU seconds per GB from the process's rusage.

    flock /tmp/thaw-heavy.lock .venv/bin/python bench/gofer_serve.py [--count 5] [--out bench/results/gofer-serve-DATE.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import time
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^Benchmark(Serve\w+)-\d+\s+\d+\s+(\d+) ns/op\s+([\d.]+) MB/s")


def one(name: str, binary: Path) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run([str(binary), "-test.run", "^$", "-test.bench", f"^Benchmark{name}$", "-test.benchtime", "10x"],
                       capture_output=True, text=True, timeout=600, cwd=REPO / "go" / "internal" / "stream")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    m = next((LINE.match(x) for x in p.stdout.splitlines() if LINE.match(x)), None)
    if p.returncode != 0 or m is None:
        raise RuntimeError(f"{name}: {p.stdout[-1000:]} {p.stderr[-1000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"bench": m.group(1), "ns_per_op": int(m.group(2)), "mb_s": float(m.group(3)), "process_cpu_s": round(cpu, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=5)
    ap.add_argument("--out", type=Path, default=REPO / "bench/results" / f"gofer-serve-{date.today().isoformat()}.json")
    a = ap.parse_args()
    binary = Path("/tmp/thaw-gofer-serve.test")
    subprocess.run(["go", "test", "-c", "-o", str(binary), "./internal/stream"], cwd=REPO / "go", check=True)
    result: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "method": __doc__,
                    "machine": {"host": platform.node(), "cpus": os.cpu_count(), "loadavg_at_start": os.getloadavg()},
                    "runs": []}
    for i in range(a.count):
        for name in (("ServePlain", "ServeVerified") if i % 2 == 0 else ("ServeVerified", "ServePlain")):
            r = one(name, binary)
            result["runs"].append(r)
            print(json.dumps(r), flush=True)
    summary = {}
    for name in ("ServePlain", "ServeVerified"):
        xs = [r["mb_s"] for r in result["runs"] if r["bench"] == name]
        summary[name] = {"median_mb_s": statistics.median(xs), "min_mb_s": min(xs), "max_mb_s": max(xs), "n": len(xs)}
    # Each run is the test binary's setup (256 MiB of random bytes, hashed once to write the
    # manifest: the same in both) plus 10 serves of 256 MiB: the difference is the checks'.
    cpu = {name: statistics.median(r["process_cpu_s"] for r in result["runs"] if r["bench"] == name)
           for name in summary}
    summary["verify_cpu_s_per_gb"] = round((cpu["ServeVerified"] - cpu["ServePlain"]) / (10 * 256 / 1024), 3)
    result["summary"] = summary
    result["machine"]["loadavg_at_end"] = os.getloadavg()
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    binary.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
