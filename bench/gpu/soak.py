#!/usr/bin/env python3
"""A restore soak on one GPU node through containerd (issue 32 item 3): bench/gpu/node.py's
Node, a cold start thawd checkpoints and publishes, then N consecutive restores in laps
that mix every kind: `thaw evict` and a restore from the store, restores from the node
cache; thawd with store.stream on, `thaw evict` and a streamed restore, a cache restore;
thawd with park.enabled and Node.park_rounds' honest adoptions (template gone, a spool of
each sandbox's own, a nonce). Every container binds the workload's spool and share
directories and ends by SIGKILL of its task (Node.remove). One thawd config cannot do
all kinds: with store.stream on a restore after eviction streams (never pulls), and with
park.enabled every start makes thawd park a sandbox that the next start adopts instead
of restoring from the cache; so each lap restarts thawd twice per config change.

--profile pytorch-offload (node.py's option) runs all of it on the cooperative image: the
container asks for the profile with the annotation a user sets (thaw.dev/profile), thawd
checkpoints it behind the profile's pre-checkpoint hooks (the weights into page-locked host
memory) and runs its post-restore hook (the weights back) at every restore and every
adoption of a parked sandbox; each row says which profile and how long the hook took.

On a GPU, before the cold start and while no container holds the GPU, the driver's own
restore of the same model outside any sandbox (bench/gpu/native_cuda.py: plain, and with
the weights offloaded and copied back as the profile does) is soak.json's `native`, and
`parked_vs_native` sets the parked first answers beside it (issue 32 item 6: a parked
cooperative ~8B first answer within 1.5 s, measured with the native restore of the same run).

Every restore is a row in soak.json's `restores` (kind, model, profile, t, ok, reason): ok when
node.py's checks for it all passed (restored, not cold: the stand-in's decisions are
restore/restored or adopt/restored; the answer identical to the cold one's; the same
GPU). A failed restore is recorded and the soak goes on; --max-consecutive-failures
ends it. bench/gpu/soak_summary.py merges several runs of one build.

  bash bench/gpu/soak.sh [--model M] [--profile pytorch-offload] [--soak N] [--park-per-lap P] [--budget-s S]
  bash bench/gpu/soak.sh --cpu --work DIR --out DIR --soak 12
"""
from __future__ import annotations

import argparse
import hashlib
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
for p in (str(REPO), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import node as nodemod  # noqa: E402  (bench/gpu/node.py)
from node import Node, OutOfTime, Report  # noqa: E402
from soak_summary import per_kind  # noqa: E402

KINDS = ("store", "cache", "stream", "park")
NATIVE_S = 150          # the native restore's share of --budget-s (an ~8B model's load, two cycles)
MAX_EVIDENCE = 12       # failed restores whose logs soak.py keeps (each a few MiB at most)
COOPERATIVE_TARGET_S = 1.5   # issue 32 item 6: parked cooperative ~8B, ctr run to the first answer


PRODUCT = ("control", "runsc_hooks", "nvproxy")   # the Python that runs the node (go/ is in bin)


def tree_sha256(root: Path, files) -> str:
    """One digest of files' relative names and contents (order-independent of the walk)."""
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(str(f.relative_to(root)).encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def build_identity(bin_dir: Path) -> dict:
    """What makes two runs one build: the binaries the node runs (runsc and thaw's Go
    binaries, carried in bin/) and thaw's Python (control/, runsc_hooks/, nvproxy/), by
    content, so the soak's own scripts may change between sessions and a rebuild from the
    same sources still counts as the same build. The commit is informational (git here;
    node.sh's device copy has no .git, so THAW_SOAK_COMMIT names it there)."""
    runsc = bin_dir / "runsc"
    sha = hashlib.sha256(runsc.read_bytes()).hexdigest() if runsc.exists() else None
    bins = [f for f in bin_dir.glob("*") if f.is_file()] if bin_dir.is_dir() else []
    py = [f for d in PRODUCT for f in (REPO / d).rglob("*.py") if "__pycache__" not in f.parts]
    commit = os.environ.get("THAW_SOAK_COMMIT") or None
    if commit is None:
        p = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
        commit = (p.stdout.strip() or None) if p.returncode == 0 else None
    return {"runsc_sha256": sha, "bins_sha256": tree_sha256(bin_dir, bins) if bins else None,
            "product_sha256": tree_sha256(REPO, py) if py else None, "thaw_commit": commit}


class Soak:
    def __init__(self, o: nodemod.Options, node: Node, report: Report, n: int, park_per_lap: int,
                 max_fail: int) -> None:
        self.o, self.node, self.r, self.n = o, node, report, n
        self.park_per_lap, self.max_fail = park_per_lap, max_fail
        self.rows: list[dict] = report.data.setdefault("restores", [])
        self.k = 1          # the next container's round number (unique names: name_of)
        self.laps = 0       # laps done
        self.kept = 0       # failures whose logs were kept (Node.evidence)
        self.consecutive = 0

    def done(self) -> bool:
        return len(self.rows) >= self.n or self.consecutive >= self.max_fail

    def row(self, kind: str, rec: dict | None, failed: list[str], error: str | None) -> None:
        ok = rec is not None and not failed and error is None
        self.consecutive = 0 if ok else self.consecutive + 1
        cid = (rec or {}).get("container") or self.node.last_started
        evidence = None
        if not ok and cid and self.kept < MAX_EVIDENCE:
            self.kept += 1
            evidence = self.node.evidence(cid, f"{len(self.rows) + 1:03d}-{kind}-{cid}")
        back = (rec or {}).get("weights_back") or {}
        self.rows.append({"i": len(self.rows) + 1, "kind": kind, "model": self.o.model, "profile": self.o.profile,
                          "t": (rec or {}).get("first_answer_s"), "ok": ok,
                          "wake_cuda_s": (rec or {}).get("wake_cuda_s"), "weights_back_s": back.get("hook_s"),
                          "weights_copy_s": back.get("copy_s"),
                          "reason": None if ok else (error or "; ".join(failed))[:1000],
                          "container": (rec or {}).get("container"),
                          "decisions": [d.get("decision") for d in (rec or {}).get("decisions") or []],
                          "identical": (rec or {}).get("identical"), "evidence": evidence,
                          "at": round(time.time(), 3)})
        self.r.data["soak"] = per_kind(self.rows)
        self.r.data["parked_vs_native"] = parked_vs_native(self.rows, self.r.data.get("native"), self.o.profile)
        self.r.save()

    def native(self) -> None:
        """The driver's own checkpoint and restore of the same model, outside any sandbox,
        plain and with the weights offloaded and copied back as the pytorch-offload profile
        does (bench/gpu/native_cuda.py, mode register), in the same run as the soak: before
        the cold start, when no container holds the GPU. The weights are node.py's (the same
        directory, reused). A failure is recorded; the soak goes on."""
        import native_cuda  # noqa: E402  (bench/gpu/native_cuda.py)
        self.o.need("native driver restore", NATIVE_S)
        t0 = time.monotonic()
        python, _ = self.node.server_python()
        try:
            rec = native_cuda.one(self.o.model, str(self.o.bin / "thaw-cuda-checkpoint"), self.o.work,
                                  keep_weights=True, offload_mode="register", python=python, env=self.node.node_env())
        except Exception as e:  # noqa: BLE001 - evidence, not the end of the soak
            rec = {"model": self.o.model, "error": f"{type(e).__name__}: {e}"[:1000]}
        rec["wall_s"] = round(time.monotonic() - t0, 1)
        self.r.data["native"] = rec
        off = rec.get("offload") or {}
        self.r.check("native: the driver restored the same model outside any sandbox, plain and with the weights "
                     "offloaded and copied back, each answering identically",
                     rec.get("identical") is True and off.get("identical") is True,
                     {k: rec.get(k) for k in ("native_restore_s", "identical", "error")} |
                     {"offload": {k: off.get(k) for k in ("cuda_restore_s", "restore_weights_s", "restore_s",
                                                          "identical", "error")}})
        self.r.data["parked_vs_native"] = parked_vs_native(self.rows, rec, self.o.profile)
        self.r.save()

    def cleanup(self) -> None:
        """After a failed restore: no container of it survives into the next."""
        for cid in list(self.node.containers):
            try:
                self.node.remove(cid)
            except Exception as e:  # noqa: BLE001 - recorded; the soak goes on
                self.r.error(f"soak cleanup of {cid}: {type(e).__name__}: {e}")

    def attempt(self, kind: str, fn) -> None:
        if self.done():
            return
        self.o.need(f"soak restore {len(self.rows) + 1} ({kind})", self.o.step_s(kind))
        mark = len(self.r.data["checks"])
        rec, error = None, None
        t0 = self.o.clock()
        try:
            rec = fn(self.k)
            # Only a restore that ran to its end times the kind: a fast failure would make
            # the next one's estimate too small.
            self.o.observe(kind, self.o.clock() - t0)
        except OutOfTime:
            raise
        except Exception as e:  # noqa: BLE001 - a failed restore is a row, not the end
            error = f"{type(e).__name__}: {e}"[:1000]
            self.cleanup()
        self.k += 1
        self.row(kind, rec, [c["check"] for c in self.r.data["checks"][mark:] if not c["ok"]], error)

    def parks(self, cold: dict, key: str) -> None:
        """Node.park_rounds: the template's start is a restore from the node cache (thawd
        with park.enabled: a row of kind cache, its checks labelled park-template:), then
        one row per adoption, a check the adoption's by its label (parked#j:), the rest
        (leftovers) the last row's. Names carry the lap (-L<n>), one start's each."""
        want = min(self.park_per_lap, self.n - len(self.rows) - 1)
        if want <= 0 or self.done():
            return
        # As many adoptions as the budget holds (the H100 soak of 2026-12-05 stopped with 205 s
        # left because two did not fit); none fitting ends the soak (OutOfTime).
        fixed = self.o.step_s("thawd", "cache", "thawd")
        while want > 1 and self.o.time_left() < fixed + want * self.o.step_s("park"):
            want -= 1
        self.o.need("soak parked rounds", fixed + want * self.o.step_s("park"))
        mark = len(self.r.data["checks"])
        recs, error = [], None
        t0 = self.o.clock()
        try:
            recs = self.node.park_rounds(cold, want, tag=f"-L{self.laps + 1}")
            # The whole lap's wall (its thawd restarts and template too) per adoption: more
            # than one adoption takes, so the next lap's estimate errs long.
            if recs:
                self.o.observe("park", (self.o.clock() - t0) / len(recs))
        except Exception as e:  # noqa: BLE001
            error = f"{type(e).__name__}: {e}"[:1000]
            self.cleanup()
        checks = self.r.data["checks"][mark:]
        tpl = self.node.park_template
        if tpl is not None or error:
            mine = [c["check"] for c in checks if not c["ok"] and c["check"].startswith("park-template:")]
            self.row("cache", tpl, mine, error if tpl is None else None)
        if tpl is None:
            return
        for j in range(1, max(len(recs), 1 if error else 0) + 1):
            rec = recs[j - 1] if j <= len(recs) else None
            mine = [c["check"] for c in checks if not c["ok"] and c["check"].startswith(f"parked#{j}:")]
            if j >= len(recs):   # the last: also whatever neither the template nor an adoption names
                mine += [c["check"] for c in checks if not c["ok"] and
                         not c["check"].startswith(("parked#", "park-template:"))]
            self.row("park", rec, mine, error if j >= len(recs) else None)
        if len(recs) < want and error is None:
            self.r.error(f"soak: park_rounds did {len(recs)} of {want} adoptions")

    def evict(self, key: str, k: int) -> None:
        """`thaw evict` before a store or streamed restore; the soak's first store restore
        follows checkpoint_and_publish, which evicted the entry already."""
        if any(e["key"] == key for e in self.node.stats()["entries"]):
            self.node.evict(key, f"soak{k}")

    def lap(self, cold: dict, key: str) -> None:
        """One lap: evict + store, cache, cache; stream on: evict + stream, cache; park."""
        node = self.node
        self.attempt("store", lambda k: (self.evict(key, k), node.restore_from_store(cold, k))[1])
        self.attempt("cache", lambda k: node.restore_from_cache(cold, k))
        self.attempt("cache", lambda k: node.restore_from_cache(cold, k))
        if not self.done():
            node.restart_thawd(stream=True)
            try:
                self.attempt("stream", lambda k: (self.evict(key, k),
                                                  node.restore_streamed(cold, key, k))[1])
                self.attempt("cache", lambda k: node.restore_from_cache(cold, k))
            finally:
                node.restart_thawd(stream=False)
        self.parks(cold, key)

    def run(self) -> None:
        cold = self.node.cold_start()
        self.r.data["cold"] = {k: cold.get(k) for k in ("first_answer_s", "answer", "boot")}
        key = self.node.checkpoint_and_publish(cold)["key"]   # ends with the entry evicted
        while not self.done():
            try:
                self.lap(cold, key)
            except OutOfTime as e:
                self.r.error(f"out of time: {e}; {len(self.rows)} of {self.n} restores done")
                break
            self.laps += 1
        self.r.data["laps"] = self.laps
        if self.consecutive >= self.max_fail:
            self.r.error(f"soak stopped: {self.consecutive} consecutive failed restores")


def parked_vs_native(rows: list[dict], native: dict | None, profile: str) -> dict:
    """Issue 32 item 6 side by side: the parked restores' first answers (ctr run to the
    answer; their CUDA wake and, cooperative, the weights' copy back) and the same run's
    native driver restore of the model (plain; offloaded: CUDA restore + copy back)."""
    park = [r for r in rows if r["kind"] == "park" and r.get("ok")]
    off = (native or {}).get("offload") or {}
    out = {"profile": profile, "parked_first_answer_s": nodemod.series([r.get("t") for r in park]),
           "parked_wake_cuda_s": nodemod.series([r.get("wake_cuda_s") for r in park]),
           "parked_weights_back_s": nodemod.series([r.get("weights_back_s") for r in park]),
           "native_restore_s": (native or {}).get("native_restore_s"),
           "native_offloaded": {k: off.get(k) for k in ("cuda_restore_s", "restore_weights_s", "restore_s")},
           "native_error": (native or {}).get("error") or off.get("error")}
    if profile == "pytorch-offload":
        t = [r.get("t") for r in park if isinstance(r.get("t"), (int, float))]
        out["target_s"] = COOPERATIVE_TARGET_S
        out["every_parked_within_target"] = bool(t) and max(t) <= COOPERATIVE_TARGET_S
    return out


def run(o: nodemod.Options, n: int, park_per_lap: int, max_fail: int, native: bool = True) -> dict:
    report = Report(o.out, {"benchmark": "gpu-soak", "mode": o.mode, "model": o.model, "profile": o.profile,
                            "date": time.strftime("%Y-%m-%d", time.gmtime()), "build": build_identity(o.bin),
                            "asked": n, "options": {"runsc_flags": o.runsc_flags,
                                                    "park_per_lap": park_per_lap, "max_consecutive_failures":
                                                    max_fail, "budget_s": o.budget_s, "profile": o.profile,
                                                    "native": native and o.gpu}}, name="soak.json")
    node = Node(o, report)
    soak = Soak(o, node, report, n, park_per_lap, max_fail)
    try:
        node.preflight()
        node.up()
        node.make_weights()
        if native and o.gpu:
            soak.native()
        soak.run()
    except OutOfTime as e:
        report.error(f"out of time: {e}")
    except KeyboardInterrupt:
        report.error("interrupted (SIGINT or SIGTERM): the node was torn down")
    except Exception as e:  # noqa: BLE001 - every failure is evidence in the report
        report.error(f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}")
    finally:
        try:
            node.down()
        except Exception as e:  # noqa: BLE001
            report.error(f"teardown: {type(e).__name__}: {e}")
        if not o.keep:
            import shutil
            shutil.rmtree(o.work, ignore_errors=True)
    s = report.data["soak"] = per_kind(soak.rows)
    report.data["parked_vs_native"] = parked_vs_native(soak.rows, report.data.get("native"), o.profile)
    report.check("soak: every restore restored (not cold) and answered identically to the cold start",
                 bool(soak.rows) and s["failures"] == 0, {"restores": s["restores"], "failures": s["failures"]})
    report.check("soak: every kind ran (store, cache, stream, and park if asked)",
                 all(s["kinds"].get(k, {}).get("count") for k in KINDS if k != "park" or park_per_lap),
                 {k: v["count"] for k, v in s["kinds"].items()})
    report.data["ok"] = not report.data["errors"] and all(c["ok"] for c in report.data["checks"])
    report.save()
    return report.data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--soak", type=int, default=12, help="restores to run (default 12)")
    ap.add_argument("--park-per-lap", type=int, default=2, help="parked adoptions per lap (0: none)")
    ap.add_argument("--max-consecutive-failures", type=int, default=5, help="end the soak after this many")
    ap.add_argument("--no-native", dest="native", action="store_false",
                    help="skip the native driver restore of the model (GPU only; run by default)")
    a, rest = ap.parse_known_args(argv)
    if a.soak < 1 or a.park_per_lap < 0 or a.max_consecutive_failures < 1:
        ap.error("--soak and --max-consecutive-failures: at least 1; --park-per-lap: 0 or more")
    o = nodemod.parse_args(rest + ["--repeat", "1", "--stream", "0"])
    main_pid = os.getpid()

    def on_term(signum, frame):   # node.py main's reason: pyroute2's forks must not tear down
        if os.getpid() != main_pid:
            os._exit(128 + signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    if os.geteuid() != 0:
        print("soak.py: run as root (runsc, containerd, mounts)", file=sys.stderr)
        return 2
    data = run(o, a.soak, a.park_per_lap, a.max_consecutive_failures, a.native)
    import json
    print(json.dumps(data["soak"], indent=2))
    print(f"soak.py: {'ok' if data['ok'] else 'FAILED'}; {o.out / 'soak.json'}", flush=True)
    return 0 if data["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
