"""How long an HTTP probe of a sandbox without an address takes, side by side:
the in-sandbox client thaw used before 2026-12-02 (urllib under a plain
`python3 -c`) against runsc_hooks/probe.py's (plain sockets under
`python3 -I -S -c`), each through `runsc exec` into the same sandbox, in
alternation. That path is every tcp/http/gpu probe and HTTP hook of a container
under containerd whose network thaw does not know (`ctr run` without CNI, the
parked sandboxes: docs/parking.md); on the H200 node its health probe took
0.279 s for one attempt (bench/results/gpu-node-2026-12-01-park.json).

The sandbox: Debian + python3 (the DaemonSet image's base layer,
build/image/base.tar from ci/build-image.sh) running `python3 -m http.server`
on its own loopback, systrap, in a network namespace with only its loopback up.

    .venv/bin/python bench/probe_exec.py --runsc build/runsc --out bench/results/probe-exec-DATE.json
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.probe_sandbox import sh  # noqa: E402
from bench.report import emit, spread  # noqa: E402
from runsc_hooks import netns as netnsmod  # noqa: E402
from runsc_hooks import probe  # noqa: E402
from runsc_hooks import spec as specmod  # noqa: E402
from runsc_hooks.runsc import remove_root  # noqa: E402

PORT = 8000
NETNS = "probe-exec"       # not thaw-<...>: that prefix is for namespaces thaw plumbs
# The in-sandbox client of runsc_hooks/probe.py before 2026-12-02, verbatim.
BEFORE = (
    "import sys,urllib.request as u,urllib.error as e\n"
    "m,url,b,t=sys.argv[1:5]\n"
    "q=u.Request(url,data=(b.encode() if b or m in ('POST','PUT','PATCH') else None),method=m)\n"
    "try:\n r=u.urlopen(q,timeout=float(t)); s=r.status; o=r.read(1<<20)\n"
    "except e.HTTPError as x:\n s=x.code; o=x.read(1<<20)\n"
    "sys.stdout.write(str(s)+chr(10)+o.decode('utf-8','replace'))"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runsc", default="build/runsc")
    ap.add_argument("--base", default="build/image/base.tar", help="a root filesystem with python3 (tar)")
    ap.add_argument("--work", default="/var/tmp/thaw-probe-exec")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()

    work = Path(a.work)
    rootfs, bundle, root = work / "rootfs", work / "bundle", work / "runsc-root"
    cid = "probe-exec"
    g = [a.runsc, f"--root={root}", "--platform=systrap", "--overlay2=none"]
    subprocess.run([*g, "delete", "--force", cid], capture_output=True)
    if root.exists():
        remove_root(root)
    shutil.rmtree(work, ignore_errors=True)
    for d in (rootfs, bundle, root):
        d.mkdir(parents=True)
    with tarfile.open(a.base) as t:
        t.extractall(rootfs, filter="fully_trusted")
    sh(a.runsc, "spec", "--bundle", str(bundle))
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["terminal"] = False
    spec["process"]["args"] = ["/bin/sh", "-c", f"exec python3 -m http.server {PORT} --bind 127.0.0.1 "
                               "--directory /etc >/var/server.log 2>&1"]
    spec["root"] = {"path": str(rootfs), "readonly": False}
    # A namespace with only its loopback up, as `ctr run` callers without CNI
    # make (bench/gpu/node.py): runsc's netstack takes the interfaces it finds.
    netnsmod.remove(NETNS)
    spec = specmod.with_netns(spec, netnsmod.create_loopback(NETNS))
    (bundle / "config.json").write_text(json.dumps(spec, indent=2))

    def exec_(argv: list[str], timeout_s: float) -> tuple[int, str]:
        p = subprocess.run([*g, "exec", cid, *argv], capture_output=True, timeout=timeout_s)
        return p.returncode, (p.stdout + p.stderr).decode(errors="replace")

    target = probe.Target(exec=exec_)
    url = f"http://127.0.0.1:{PORT}/hostname"
    before: list[float] = []
    after: list[float] = []
    floor: list[float] = []   # `runsc exec` of a process that does nothing: what no client can save
    answers = set()
    try:
        sh(*g, "run", "--bundle", str(bundle), "--detach", cid, timeout=120)
        deadline = time.monotonic() + 60
        while True:
            try:
                probe.http_request(target, PORT, "/hostname", 2)
                break
            except probe.ProbeFailed:
                if time.monotonic() > deadline:
                    log = rootfs / "var" / "server.log"
                    print(log.read_text() if log.exists() else "no server log", file=sys.stderr)
                    raise
                time.sleep(0.2)
        for _ in range(a.rounds):
            t0 = time.monotonic()
            rc, out = exec_(["python3", "-c", BEFORE, "GET", url, "", "2"], 5)
            before.append(time.monotonic() - t0)
            assert rc == 0 and out.startswith("200\n"), out[-300:]
            answers.add(("before", out.partition("\n")[2]))
            t0 = time.monotonic()
            status, body = probe.http_request(target, PORT, "/hostname", 2)
            after.append(time.monotonic() - t0)
            assert status == 200, status
            answers.add(("after", body.decode()))
            t0 = time.monotonic()
            rc, out = exec_(["/bin/true"], 5)
            floor.append(time.monotonic() - t0)
            assert rc == 0, out[-300:]
    finally:
        subprocess.run([*g, "delete", "--force", cid], capture_output=True)
        remove_root(root)
        shutil.rmtree(work, ignore_errors=True)
        netnsmod.remove(NETNS)
    same = len({body for _, body in answers}) == 1
    result = {
        "bench": "probe-exec", "date": time.strftime("%Y-%m-%d"), "machine": "this VM (2 cores), systrap, no GPU",
        "runsc": a.runsc, "rounds": a.rounds, "identical_answers": same,
        "before_urllib_s": spread(before, runs=True), "after_sockets_s": spread(after, runs=True),
        "exec_true_s": spread(floor, runs=True),
        "after_vs_before": round(spread(after)["median_s"] / spread(before)["median_s"], 3),
    }
    if not same:
        print("probe_exec: the two clients read different answers", file=sys.stderr)
        emit(result, a.out)
        return 1
    return emit(result, a.out)


if __name__ == "__main__":
    sys.exit(main())
