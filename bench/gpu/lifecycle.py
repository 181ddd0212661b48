"""The CLI door's GPU lifecycle, as a user types it (issue 12), on one machine.

A transformers model server (bench/gpu/server.py, fixed-seed weights made
here by bench/gpu/weights.py; no network) goes through the `thaw` commands:

  thaw run --gpus 0 --probe gpu:8000/gpu -- python3 server.py ...   cold start
  thaw checkpoint ID --out IMG                                       (the CUDA helper: automatic)
  thaw restore IMG --id ID2 --gpus N                                 N: 1 on a 2-GPU machine, else 0
  answers compared with the cold server's (tokens and logits digest identical, same boot id)
  thaw restore IMG --gpus 0,1                                        refused before runsc runs
  thaw checkpoint ID2 --out <full tmpfs>                             fails (exit 4, no room); ID2 keeps serving
  thaw restore IMG --cold-fallback (unhealthy)                       cold start with the GPUs re-injected
  thaw ps / thaw logs / thaw health along the way

and writes one JSON file: every command (argv, exit status, seconds, output
tails), the timings, the checks, and the node's GPU facts. `--device cpu`
rehearses the same commands without a GPU (no --gpus; `--backend fake` needs
no torch): its result says "device": "cpu" and is never a GPU result.

The sandbox reaches the driver over thaw's sandbox network (HTTP to its
address); where the node cannot plumb it (`--network auto` falls back), the
sandbox runs without one and the driver asks the server from inside it with
`runsc exec` (probes do the same: runsc_hooks/probe.py).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PORT = 8000
EXIT_NO_SPACE = 4   # twin: control/errors.py EXIT_CODE NoSpace (CheckpointNoSpace)


def tail(s: str, n: int = 1500) -> str:
    return s if len(s) <= n else "..." + s[-n:]


def gpus_of(pid) -> list[int]:
    """Indexes of the GPUs on which host process `pid` (the sandbox's) has a compute
    context, by NVML; [] without NVML or pid."""
    if not pid:
        return []
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVML here (CPU rehearsal)
        return []
    try:
        return [i for i in range(pynvml.nvmlDeviceGetCount())
                if any(pr.pid == int(pid) for pr in
                       pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i)))]
    finally:
        pynvml.nvmlShutdown()


class Lifecycle:
    def __init__(self, o: argparse.Namespace) -> None:
        self.o = o
        self.work: Path = o.work
        self.ids: list[str] = []
        self.commands: list[dict] = []
        self.checks: dict[str, bool] = {}
        self.r: dict = {"benchmark": "gpu-lifecycle", "device": o.device, "backend": o.backend, "model": o.model,
                        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "errors": []}
        self.env = {**os.environ,
                    "THAW_CONFIG": "/dev/null", "THAW_RUNSC_PATH": str(o.runsc),
                    "THAW_RUNSC_ROOT": str(self.work / "runsc-root"),
                    "THAW_NODE_STATE_DIR": str(self.work / "state"), "THAW_NODE_LOG_DIR": str(self.work / "log"),
                    "THAW_RUNSC_TIMEOUT_S": "600", "THAW_THAWD_HEALTH_TIMEOUT_S": str(o.restore_timeout_s),
                    "THAW_NETWORK_SUBNET": "10.219.0.0/24",
                    "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
        self.network = o.network != "off"

    # -- the thaw CLI ------------------------------------------------------------

    def thaw(self, *args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "control.cli.main", *args]
        t0 = time.monotonic()
        try:
            p = subprocess.run(argv, cwd=REPO, env={**self.env, **(env or {})}, capture_output=True, text=True,
                               timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            p = subprocess.CompletedProcess(argv, 124, e.stdout or "", f"timed out after {timeout} s")
        dt = time.monotonic() - t0
        shown = ["thaw", *[a if len(a) < 300 else a[:60] + "..." for a in args]]
        self.commands.append({"argv": shlex.join(shown), "rc": p.returncode, "seconds": round(dt, 3),
                              "stdout": tail(p.stdout or ""), "stderr": tail(p.stderr or ""),
                              **({"env": env} if env else {})})
        print(f"[lifecycle] {shlex.join(shown)[:160]} -> {p.returncode} ({dt:.2f}s)", flush=True)
        return p

    def thaw_json(self, *args: str, **kw) -> tuple[int, dict | list | None]:
        p = self.thaw(*args, "--json", **kw) if "--" not in args else self.thaw(*args, **kw)
        try:
            return p.returncode, json.loads(p.stdout)
        except ValueError:
            return p.returncode, None

    def check(self, name: str, ok: bool) -> bool:
        self.checks[name] = bool(ok)
        print(f"[lifecycle] check {name}: {'ok' if ok else 'FAILED'}", flush=True)
        return bool(ok)

    # -- the server ----------------------------------------------------------------

    def server_args(self, sid: str, gpus: str | None) -> list[str]:
        o = self.o
        exe, paths = interpreter(o.python)
        env = {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": "/tmp/hf",
               "XDG_CACHE_HOME": "/tmp/cache", "TOKENIZERS_PARALLELISM": "false", "PYTHONDONTWRITEBYTECODE": "1"}
        env.update({k: os.environ[k] for k in ("PATH", "CUDA_HOME") if k in os.environ})
        args = ["run", "--id", sid, "--json", "--probe", f"gpu:{PORT}/gpu"]
        if gpus:
            args += ["--gpus", gpus]
        if not self.network:
            args.append("--no-network")
        for k, v in env.items():
            args += ["--env", f"{k}={v}"]
        for b in [*paths, str(HERE), str(self.weights)]:
            args += ["--bind", b]
        return args + ["--", exe, str(HERE / "server.py"), "--model-dir", str(self.weights), "--backend", o.backend,
                       "--device", o.device, "--port", str(PORT), "--spool", "/tmp/spool",
                       "--events", "/tmp/events.jsonl"]

    def request(self, sid: str, address: str | None, op: str, timeout_s: float) -> dict:
        """POST /generate or GET /gpu, over the network or from inside the sandbox."""
        method, path = {"generate": ("POST", "/generate"), "gpu": ("GET", "/gpu")}[op]
        if address:
            req = urllib.request.Request(f"http://{address}:{PORT}{path}", method=method,
                                         data=b"{}" if method == "POST" else None)
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                return json.loads(r.read())
        code = ("import json,sys,urllib.request as u;r=u.Request(sys.argv[1],method=sys.argv[2],"
                "data=b'{}' if sys.argv[2]=='POST' else None);print(u.urlopen(r,timeout=float(sys.argv[3])).read().decode())")
        exe, _ = interpreter(self.o.python)
        p = subprocess.run([str(self.o.runsc), f"--root={self.work / 'runsc-root'}", "exec", sid + "+", exe, "-c", code,
                            f"http://127.0.0.1:{PORT}{path}", method, str(timeout_s)],
                           capture_output=True, text=True, timeout=timeout_s + 30)
        if p.returncode != 0:
            raise RuntimeError(f"runsc exec: {tail(p.stderr, 400)}")
        return json.loads(p.stdout)

    def answer(self, sid: str, address: str | None, timeout_s: float) -> tuple[dict, float]:
        """The first answer to /generate within `timeout_s` (retrying while it loads)."""
        t0 = time.monotonic()
        last = ""
        while time.monotonic() - t0 < timeout_s:
            try:
                return self.request(sid, address, "generate", min(120.0, timeout_s)), time.monotonic() - t0
            except Exception as e:  # noqa: BLE001 - not up yet
                last = f"{type(e).__name__}: {e}"
                time.sleep(0.2)
        raise RuntimeError(f"{sid}: no answer within {timeout_s} s ({last})")

    # -- steps ---------------------------------------------------------------------

    def setup(self) -> None:
        o = self.o
        self.cleanup()
        shutil.rmtree(self.work / "images", ignore_errors=True)
        (self.work / "images").mkdir(parents=True, exist_ok=True)
        sys.path.insert(0, str(REPO))
        if o.device == "cuda":
            from nvproxy import gpu
            node = gpu.probe()
            self.r["node"] = node.to_dict()
            if not node:
                raise SystemExit("no NVIDIA GPU found (NVML, /proc/driver/nvidia)")
            self.n_gpus = len(node.gpus)
        else:
            self.r["node"] = None
            self.n_gpus = 0
        self.r["runsc"] = subprocess.run([str(o.runsc), "--version"], capture_output=True, text=True).stdout.split("\n")[0]
        self.weights = self.work / "weights" / o.model
        fmt = "fake" if o.backend == "fake" else "safetensors"
        t0 = time.monotonic()
        out = subprocess.run([o.python, str(HERE / "weights.py"), "--model", o.model, "--out", str(self.weights),
                              "--device", o.device if fmt == "safetensors" else "cpu", "--format", fmt],
                             capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            raise RuntimeError(f"weights.py: {tail(out.stderr)}")
        self.r["weights"] = {**json.loads(out.stdout.splitlines()[-1]), "seconds": round(time.monotonic() - t0, 2)}

    def run_cold(self, sid: str, gpus: str | None) -> tuple[str | None, dict]:
        t0 = time.monotonic()
        code, out = self.thaw_json(*self.server_args(sid, gpus))
        if code != 0 and self.network and self.o.network == "auto":
            # No sandbox network on this node (netlink/nftables): ask from inside instead.
            self.r["network_fallback"] = self.commands[-1]["stderr"]
            self.network = False
            code, out = self.thaw_json(*self.server_args(sid, gpus))
        if code != 0:
            raise RuntimeError(f"thaw run failed: {self.commands[-1]['stderr']}")
        self.ids.append(sid)
        address = out.get("address") if self.network else None
        answer, _ = self.answer(sid, address, self.o.cold_timeout_s)
        return address, {"cold_start_s": round(time.monotonic() - t0, 3), "run": out, "answer": answer}

    def lifecycle(self) -> None:
        o = self.o
        cuda = o.device == "cuda"
        first = "0" if cuda else None
        other = ("1" if self.n_gpus >= 2 else "0") if cuda else None
        cold, warm, fallback = "lc-cold", "lc-warm", "lc-fallback"
        img = self.work / "images" / "img"

        address, c = self.run_cold(cold, first)
        self.r["cold"] = c
        base = c["answer"]
        self.r["cold"]["gpu"] = self.request(cold, address, "gpu", 60)
        p = self.thaw("health", cold, "--json")
        self.check("health of the cold server (gpu probe)", p.returncode == 0)
        self.r["cold"]["logs_tail"] = tail(self.thaw("logs", cold, "--tail", "5").stdout, 800)

        code, out = self.thaw_json("checkpoint", cold, "--out", str(img))
        self.check("checkpoint", code == 0)
        self.r["checkpoint"] = out
        meta = json.loads((img / "thaw.json").read_text())
        self.r["image_meta"] = {k: meta.get(k) for k in ("gpu", "nvproxy", "rootfs", "network", "runsc_version",
                                                         "files", "checkpoint_s")}
        if cuda:
            self.check("image says its GPU needs", bool(meta.get("gpu")) and meta["gpu"]["count"] == 1
                       and meta["gpu"]["indexes"] == [0] and meta["gpu"]["driver_version"] != "")

        t0 = time.monotonic()
        args = ["restore", str(img), "--id", warm] + (["--gpus", other] if cuda else [])
        code, out = self.thaw_json(*args)
        self.check("restore", code == 0)
        self.ids.append(warm)
        ans, _ = self.answer(warm, address, o.restore_timeout_s)
        self.r["restore"] = {"gpus": other, "thaw_restore": out, "to_first_answer_s": round(time.monotonic() - t0, 3),
                             "answer": ans, "gpu": self.request(warm, address, "gpu", 60)}
        self.check("restored answer identical to the cold server's",
                   ans.get("tokens") == base.get("tokens") and ans.get("digest") == base.get("digest"))
        self.check("restored process is the saved one (boot id)", ans.get("boot") == base.get("boot"))
        if cuda and self.n_gpus >= 2:
            # Which GPU the restored sandbox computes on, as the host's NVML sees it: the
            # sandbox process holds contexts on the GPUs it uses. What the process itself
            # reports (torch's device properties) is recorded too, but torch caches them
            # from before the checkpoint, so it still names the GPU it was saved on
            # (docs/gpu.md "Restore onto another GPU").
            def hexdigits(u: str) -> str:
                return "".join(c for c in str(u).lower().removeprefix("gpu-") if c in "0123456789abcdef")
            self.r["restore"]["uuid_seen_by_process"] = self.r["restore"]["gpu"].get("uuid", "")
            self.r["restore"]["uuid_is_saved_gpu"] = (
                hexdigits(self.r["restore"]["gpu"].get("uuid", "")) == hexdigits(self.r["node"]["gpus"][0]["uuid"]))
            on = gpus_of(self.sandbox_pid(warm))
            self.r["restore"]["host_nvml_gpus"] = on
            self.check(f"restored sandbox holds GPU {other} only (host NVML)", on == [int(other)])
        self.r["ps_after_restore"] = self.thaw_json("ps")[1]

        # Refused before runsc runs: another GPU count (or GPUs for a CPU image).
        bad = ["--gpus", "0,1"] if cuda else ["--gpus", "0"]
        p = self.thaw("restore", str(img), "--id", "lc-refused", *bad)
        self.check("restore onto the wrong GPUs is refused with a clear line (exit 2)",
                   p.returncode == 2 and p.stderr.count("thaw: error:") == 1)
        self.check("the refused restore left no sandbox", "lc-refused" not in json.dumps(self.thaw_json("ps")[1]))

        # A checkpoint that fails (ENOSPC): the workload keeps serving.
        small = self.work / "small"
        small.mkdir(exist_ok=True)
        # A quarter of the image the first checkpoint wrote: runsc runs out of space mid-save.
        size_mb = o.small_mb or max(1, (self.r["checkpoint"] or {}).get("image_bytes", 4 << 20) // (4 << 20))
        self.r["full_fs_mb"] = size_mb
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "thaw-lifecycle-small", str(small)],
                       check=True)
        try:
            p = self.thaw("-vv", "checkpoint", warm, "--out", str(small / "img"))
            self.r["failed_checkpoint"] = {"rc": p.returncode, "stderr": tail(p.stderr, 12000),
                                           "left_in_dir": os.listdir(small)}
            errors = [x for x in p.stderr.splitlines() if x.startswith("thaw: error:")]
            # 4: thaw recognised the full file system (CheckpointNoSpace), not only "a save failed" (73).
            self.check("checkpoint onto a full disk fails with exit 4 (no room) and one error line",
                       p.returncode == EXIT_NO_SPACE and len(errors) == 1)
            self.check("no partial image is left", os.listdir(small) == [])
            # runsc's own log of the sandbox (its --log, JSON): the failed save's whole message.
            for f in (self.work / "log" / "sandboxes" / warm).glob("runsc*.log"):
                shutil.copy2(f, self.o.out.parent / f"failed-save-{f.name}")
        finally:
            subprocess.run(["umount", "-l", str(small)], check=False)
        try:
            after, after_s = self.answer(warm, address, 120)
        except RuntimeError:
            self.r["failed_checkpoint"]["diagnosis"] = self.diagnose(warm)
            raise
        self.r["failed_checkpoint"]["answer_after_s"] = round(after_s, 3)
        self.check("after the failed checkpoint the same process answers identically",
                   after.get("boot") == base.get("boot") and after.get("digest") == base.get("digest"))
        rows = {r["id"]: r for r in self.thaw_json("ps")[1] or []}
        self.check("thaw ps says running", rows.get(warm, {}).get("state") == "running")
        self.r["restore"]["logs_tail"] = tail(self.thaw("logs", warm, "--tail", "5").stdout, 800)
        self.thaw("delete", warm, "--force")

        # --cold-fallback: a restore whose health check cannot pass starts the workload cold, GPUs re-injected.
        t0 = time.monotonic()
        args = ["restore", str(img), "--id", fallback, "--cold-fallback", "--probe", f"http:{PORT}/health~never"]
        code, out = self.thaw_json(*args, *(["--gpus", other] if cuda else []), env={"THAW_THAWD_HEALTH_TIMEOUT_S": "5"})
        self.ids.append(fallback)
        self.check("--cold-fallback starts cold", code == 0 and (out or {}).get("mode") == "cold")
        fb_address = (out or {}).get("address") if self.network else None
        ans, _ = self.answer(fallback, fb_address, o.cold_timeout_s)
        self.r["cold_fallback"] = {"thaw_restore": out, "to_first_answer_s": round(time.monotonic() - t0, 3),
                                   "answer": ans, "gpu": self.request(fallback, fb_address, "gpu", 60)}
        self.check("the cold fallback is a fresh process", ans.get("boot") != base.get("boot"))
        self.check("the cold fallback answers like the first cold start (deterministic model)",
                   ans.get("digest") == base.get("digest"))

    def sandbox_pid(self, sid: str) -> int | None:
        """The host pid of the sandbox's sentry (runsc state), which holds its GPU contexts."""
        p = subprocess.run([str(self.o.runsc), f"--root={self.work / 'runsc-root'}", "state", sid + "+"],
                           capture_output=True, text=True, timeout=30)
        try:
            return int(json.loads(p.stdout)["pid"]) if p.returncode == 0 else None
        except (ValueError, KeyError, TypeError):
            return None

    def diagnose(self, sid: str) -> dict:
        """What a workload that stopped answering after a failed save is doing: its
        processes, the CUDA helper's view of each, the sentry's goroutine stacks."""
        from nvproxy import helper
        root = f"--root={self.work / 'runsc-root'}"
        d: dict = {}

        def run(*argv: str, timeout: float = 30) -> str:
            try:
                p = subprocess.run([str(self.o.runsc), root, *argv], capture_output=True, text=True, timeout=timeout)
                return f"rc={p.returncode}\n{p.stdout}{p.stderr}"
            except subprocess.TimeoutExpired:
                return f"timed out after {timeout} s"
        d["ps"] = tail(run("ps", "--format=json", sid + "+"), 3000)
        try:
            pids = [str(x) for x in json.loads(d["ps"].split("\n", 1)[1])]   # runsc prints pids only
        except (ValueError, KeyError, IndexError, TypeError):
            pids = []
        d["cuda_state"] = {pid: tail(run("exec", sid + "+", helper.HELPER_PATH, "--get-state", "--pid", pid), 400)
                           for pid in pids}
        stacks = run("debug", "--stacks", sid + "+", timeout=60)
        (self.o.out.parent / "failed-save-stacks.txt").write_text(stacks)
        d["stacks_file"] = "failed-save-stacks.txt"
        d["host_nvml_gpus"] = gpus_of(self.sandbox_pid(sid))
        print(f"[lifecycle] diagnosis of {sid}: {json.dumps(d)[:3000]}", flush=True)
        return d

    def cleanup(self) -> None:
        rows = self.thaw_json("ps")[1] if (self.work / "state").exists() else []
        for r in rows or []:
            if r["id"].startswith("lc-"):
                self.thaw("delete", r["id"], "--force")

    def result(self) -> dict:
        self.r["commands"] = self.commands
        self.r["checks"] = self.checks
        self.r["ok"] = bool(self.checks) and all(self.checks.values()) and not self.r["errors"]
        self.r["channel"] = "http" if self.network else "runsc exec"
        return self.r


def interpreter(python: str) -> tuple[str, list[str]]:
    """The server interpreter's own path and the host directories it needs
    visible (twin: bench/gpu/models.py interpreter)."""
    code = ("import sys,os,json;print(json.dumps([sys.executable,[sys.prefix,sys.base_prefix,"
            "os.path.dirname(os.path.realpath(sys.executable))]]))")
    exe, paths = json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout)
    return exe, sorted(set(paths))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runsc", type=Path, required=True, help="runsc; thaw-monitor and thaw-cuda-checkpoint beside it")
    ap.add_argument("--out", type=Path, required=True, help="the result JSON file")
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/thaw-lifecycle"))
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--backend", choices=("transformers", "fake"), default="transformers")
    ap.add_argument("--model", default="gpt2-large", help="a bench/gpu/weights.py shape")
    ap.add_argument("--python", default=sys.executable, help="the server's interpreter (torch, transformers)")
    ap.add_argument("--network", choices=("auto", "on", "off"), default="auto")
    ap.add_argument("--cold-timeout-s", type=float, default=300)
    ap.add_argument("--restore-timeout-s", type=float, default=120)
    ap.add_argument("--small-mb", type=int, default=0,
                    help="size of the tmpfs the failing checkpoint fills (default: a quarter of the image)")
    o = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (runsc refuses --rootless)")
    for b in ("thaw-monitor", "thaw-cuda-checkpoint"):
        if not os.access(o.runsc.parent / b, os.X_OK):
            raise SystemExit(f"{o.runsc.parent / b} missing: thaw finds it beside runsc")
    o.work.mkdir(parents=True, exist_ok=True)
    lc = Lifecycle(o)
    try:
        lc.setup()
        lc.lifecycle()
    except Exception as e:  # noqa: BLE001 - every failure is evidence in the result
        lc.r["errors"].append(f"{type(e).__name__}: {e}")
        print(f"[lifecycle] error: {e}", flush=True)
    finally:
        try:
            lc.cleanup()
        except Exception as e:  # noqa: BLE001
            lc.r["errors"].append(f"cleanup: {e}")
        res = lc.result()
        o.out.parent.mkdir(parents=True, exist_ok=True)
        o.out.write_text(json.dumps(res, indent=2) + "\n")
        shutil.rmtree(o.work / "images", ignore_errors=True)
    print(json.dumps({"ok": res["ok"], "checks": res["checks"], "errors": res["errors"]}, indent=2), flush=True)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
