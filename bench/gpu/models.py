"""GPU restore benchmark: real inference servers in runsc sandboxes, cold start
vs checkpoint/restore, with each thaw optimization switched off in turn.

Per model (GPT-2-large shape, Llama-shaped ~3B and ~8B; `tiny` for CPU tests):
  1. fixed-seed fp16 safetensors are made on this machine (bench/gpu/weights.py);
  2. cold start: the sandbox boots bench/gpu/server.py, which loads the model
     with from_pretrained onto the GPU; timed to its first answer;
  3. checkpoint (`runsc checkpoint --cuda-checkpoint-path`), image size;
  4. restores of that image under each variant, each timed from just before
     `runsc restore` to the first answer equal (tokens and logits digest) to
     the answer the same process gave before the checkpoint.

Variants (VARIANTS): `thaw` is every optimization on; each other one turns one
off, `baseline` all of them. The pre-checkpoint release is a property of the image, so variants that
go without it use a second image (a second cold start, with a warm page
cache: `cold_start_warm_s`). Images are deleted once their variants ran
(disk: an 8B image is ~20 GB).

The GPU goes in through thaw's own path: nvproxy.gpu (NVML) -> nvproxy.cdi
(the node's CDI spec, generated when none exists; re-injected for each
restore with cdi.for_restore) and nvproxy.helper (the CUDA checkpoint helper
mounted at its fixed path). The channel to the server is the spool directory
(default) or HTTP over a veth into the sandbox's netns (runsc_hooks.network;
needs pyroute2): bench/gpu/README.md.

Writes <out>/models.json (every model) and returns the same dict.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from control.lifecycle import profiles  # noqa: E402
from nvproxy import cdi, gpu, helper  # noqa: E402
from runsc_hooks import spec as specmod  # noqa: E402
from runsc_hooks.runsc import (CheckpointOptions, CreateOptions, GlobalOptions,  # noqa: E402
                               RestoreOptions, Runsc)

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
import smoke  # noqa: E402  (bench/gpu/smoke.py)
from channels import SERVER_PORT, ChannelTimeout, FileChannel, HttpChannel  # noqa: E402,F401
from runsc_logs import cuda_toggles, go_duration, read_logs, timelines  # noqa: E402,F401

# Restore targets (seconds to the first correct answer) from issue 6.
# Model shapes: twin bench/gpu/weights.py SHAPES.
MODELS: dict[str, dict] = {
    "gpt2-large": {"target_s": 1.0},
    "llama-3b": {"target_s": 2.0},
    "llama-8b": {"target_s": 4.5},
    "tiny": {"target_s": None},
    "tiny-llama": {"target_s": None},
}


@dataclass(frozen=True)
class Variant:
    image: str            # "release": torch.cuda.empty_cache() before the checkpoint; "norelease": without
    background: bool      # runsc restore --background
    drop_cache: bool      # page cache dropped before the restore
    about: str


VARIANTS: dict[str, Variant] = {
    "thaw": Variant("release", True, False, "every optimization on"),
    "thaw-cold-cache": Variant("release", True, True, "page cache dropped before restore"),
    "no-background": Variant("release", False, False, "plain runsc restore of the same image (no --background)"),
    "no-release": Variant("norelease", True, False, "without the pre-checkpoint release of cached GPU memory"),
    "baseline": Variant("norelease", False, False, "no thaw optimization at all: no release, no --background"),
}
DEFAULT_VARIANTS = tuple(VARIANTS)


def split_variant(name: str) -> tuple[str, str | None]:
    """"thaw@readers8" -> ("thaw", "readers8"): restore with the runsc given as
    --restore-runsc readers8=PATH (a build of the same pin and label with one
    change, e.g. bench/gpu/build-runsc-variant.sh), from the same image."""
    base, _, alt = name.partition("@")
    return base, alt or None


class OutOfTime(Exception):
    pass


@dataclass
class Options:
    runsc: Path
    out: Path
    models: list[str]
    variants: list[str] = field(default_factory=lambda: list(DEFAULT_VARIANTS))
    helper: Path | None = None            # host path of thaw-cuda-checkpoint (cuda only)
    work: Path = Path("/var/tmp/thaw-bench")
    device: str = "cuda"                  # cuda | cpu
    backend: str = "transformers"         # transformers | fake
    channel: str = "file"                 # file | http
    python: str = "python3"               # runs the server (in the sandbox) and the weight maker
    cdi: bool = True                      # GPUs through nvproxy.cdi; False: the smoke's hand-made device list
    repeat: int = 1
    runsc_debug: bool = False             # runsc --debug (machine-readable timer lines; more logging)
    keep: bool = False                    # keep images and weights (default: deleted once used)
    drop_caches: bool = True              # False: never write /proc/sys/vm/drop_caches (variants that need it fail)
    cold_timeout_s: float = 300.0         # an 8B cold start took 24 s with a cold page cache (h200-facts)
    restore_timeout_s: float = 180.0
    budget_s: float | None = None         # stop starting new steps after this many seconds (device commands get 600)
    restore_runsc: dict[str, Path] = field(default_factory=dict)   # "name@alt" variants restore with these
    started: float = field(default_factory=time.monotonic, repr=False)

    def time_left(self) -> float:
        return float("inf") if self.budget_s is None else self.budget_s - (time.monotonic() - self.started)

    def validate(self) -> None:
        bad = [m for m in self.models if m not in MODELS]
        if bad:
            raise SystemExit(f"unknown model(s) {bad}; known: {', '.join(MODELS)}")
        bad = [v for v in self.variants if split_variant(v)[0] not in VARIANTS
               or (split_variant(v)[1] is not None and split_variant(v)[1] not in self.restore_runsc)]
        if bad:
            raise SystemExit(f"unknown variant(s) {bad}; known: {', '.join(VARIANTS)}, each optionally "
                             "@NAME for a --restore-runsc NAME=PATH")
        if self.device == "cuda" and not self.helper:
            raise SystemExit("--device cuda needs --helper (build/thaw-cuda-checkpoint)")
        if self.channel not in ("file", "http"):
            raise SystemExit("--channel is file or http")


# -- one model -------------------------------------------------------------------------

def sh(*argv: str, check: bool = True, timeout: float = 120) -> str:
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])} ... exit {p.returncode}: {p.stderr.strip()[-1500:]}")
    return p.stdout.strip()


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def gpu_memory_used() -> str:
    try:
        return sh("nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader", check=False, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "?"


def interpreter(python: str) -> tuple[str, list[str]]:
    """The server interpreter's own path (a venv's, not its symlink target: that
    is what makes the venv's packages active) and the host directories it
    needs visible in the sandbox (host layout)."""
    code = ("import sys,os,json;print(json.dumps([sys.executable,[sys.prefix,sys.base_prefix,"
            "os.path.dirname(os.path.realpath(sys.executable))]]))")
    exe, paths = json.loads(sh(python, "-c", code))
    return exe, paths


def same_answer(a: dict | None, b: dict | None) -> bool:
    return bool(a and b and a.get("tokens") == b.get("tokens") and a.get("digest") == b.get("digest"))


class ModelBench:
    def __init__(self, opts: Options, model: str, node: gpu.NodeGpus | None,
                 progress: "Callable[[dict], None]" = lambda result: None) -> None:
        self.o, self.model, self.node, self.progress = opts, model, node, progress
        self.dir = opts.work / model
        self.logs = opts.out / "runsc-logs"
        self.share = self.dir / "share"
        self.n = 0
        self.net = None
        self.result: dict = {"model": model, "target_s": MODELS[model]["target_s"], "device": opts.device,
                             "backend": opts.backend, "channel": opts.channel, "images": {}, "variants": {},
                             "errors": []}

    # -- sandbox plumbing --

    def setup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        self.share.mkdir(parents=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        specmod.prepare_host_rootfs(self.dir / "rootfs")
        g = GlobalOptions(root=self.o.work / "runsc-root", network="sandbox" if self.o.channel == "http" else "none",
                          nvproxy=self.o.device == "cuda", debug=self.o.runsc_debug,
                          debug_log=Path(f"{self.logs}/%ID%.%COMMAND%.log"))
        self.runsc = Runsc(self.o.runsc, g, timeout_s=600)
        self.devices: list[str] = []
        self.registry = None
        spec = self.base_spec()
        if self.o.device == "cuda":
            helper.stage(self.o.helper, self.dir / "helper")
            helper.add_to_spec(spec, self.dir / "helper")
            if self.o.cdi:
                self.registry = cdi.node_registry(self.node)
                self.devices = [f"{cdi.NVIDIA_KIND}={self.node.gpus[0].uuid}"]
                spec = cdi.inject(spec, self.registry, self.devices)
            else:
                spec["linux"]["devices"] = smoke.nvidia_devices()   # the GPU smoke's list, no CDI
        if self.o.channel == "http":
            from runsc_hooks import network
            ip = network.slot_addresses("10.213.0.0/16", 200)
            self.net_args = (f"bench-{self.model}", *ip)
            self.net = network.plumb(*self.net_args)
            spec = specmod.with_netns(spec, self.net.netns_path)
            self.channel = HttpChannel(self.net.sandbox_ip)
        else:
            self.channel = FileChannel(self.share / "spool")
        self.spec = spec
        self.bundle = specmod.Bundle(self.dir / "bundle")
        self.bundle.write(spec)

    def base_spec(self) -> dict:
        env = {k: os.environ[k] for k in ("PATH", "LD_LIBRARY_PATH", "CUDA_HOME") if k in os.environ}
        env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME="/tmp/hf",
                   XDG_CACHE_HOME="/tmp/cache", TOKENIZERS_PARALLELISM="false", PYTHONDONTWRITEBYTECODE="1")
        env.update(profiles.get("pytorch").env)
        python, paths = interpreter(self.o.python)
        args = [python, "/bench/server.py", "--model-dir", "/model", "--backend", self.o.backend,
                "--device", self.o.device, "--spool", "/share/spool", "--events", "/share/events.jsonl",
                "--log", "/share/server.log", "--port", str(SERVER_PORT)]
        return specmod.command_spec(args, env=env, rootfs=str(self.dir / "rootfs"), extra_mounts=[
            *specmod.host_layout(paths),
            specmod.bind_mount(str(self.share), "/share", readonly=False),
            specmod.bind_mount(str(self.weights_dir), "/model"),
            specmod.bind_mount(str(HERE), "/bench"),
        ])

    @property
    def weights_dir(self) -> Path:
        return self.o.work / "weights" / self.model

    def new_id(self, what: str) -> str:
        self.n += 1
        return f"tb-{self.model}-{what.replace('@', '-')}-{self.n}"   # runsc ids: no "@"

    def events(self) -> list[dict]:
        p = self.share / "events.jsonl"
        out = []
        for line in (p.read_text().splitlines() if p.exists() else []):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def delete(self, cid: str) -> None:
        try:
            self.runsc.delete(cid, force=True)
        except Exception as e:  # noqa: BLE001 - gone already is fine
            if "not found" not in str(e):
                self.result["errors"].append(f"delete {cid}: {e}")

    # -- steps --

    def make_weights(self) -> None:
        fmt = "fake" if self.o.backend == "fake" else "safetensors"
        dev = self.o.device if fmt == "safetensors" else "cpu"
        out = sh(self.o.python, str(HERE / "weights.py"), "--model", self.model, "--out", str(self.weights_dir),
                 "--device", dev, "--format", fmt, timeout=900)
        self.result["weights"] = json.loads(out.splitlines()[-1])

    def cold_start(self, cold_cache: bool) -> tuple[str, dict, float]:
        self.channel.reset()
        (self.share / "events.jsonl").unlink(missing_ok=True)
        if self.net is not None:
            from runsc_hooks import network
            self.net = network.plumb(*self.net_args)
        if cold_cache:
            drop_caches()
        cid = self.new_id("cold")
        t0 = time.monotonic()
        try:
            self.runsc.create(cid, CreateOptions(bundle=self.bundle.path))
            self.runsc.start(cid)
            answer = self.channel.request("generate", self.o.cold_timeout_s, abort=lambda: self.dead(cid))
        except Exception as e:
            self.delete(cid)
            raise RuntimeError(f"cold start: {e}; server log: {self.server_log_tail()}") from None
        return cid, answer, time.monotonic() - t0

    def dead(self, cid: str) -> str | None:
        """Why the server will never answer (its error event, or the sandbox stopped), else None."""
        err = next((e for e in self.events() if e.get("event") == "error"), None)
        if err:
            return f"server: {err.get('error')}"
        try:
            status = self.runsc.state(cid).status
        except Exception as e:  # noqa: BLE001 - a sandbox runsc cannot find is dead too
            return f"runsc state: {e}"
        return f"sandbox {status}" if status == "stopped" else None

    def server_log_tail(self, n: int = 1500) -> str:
        p = self.share / "server.log"
        return p.read_text(errors="replace")[-n:] if p.exists() else "(none)"

    def make_image(self, kind: str, first: bool) -> dict:
        cid, answer, cold_s = self.cold_start(cold_cache=first and self.o.drop_caches)
        ready = next((e for e in self.events() if e.get("event") == "ready"), {})
        info: dict = {"cold_start_s": round(cold_s, 3), "cold_cache": first and self.o.drop_caches,
                      "server": {k: v for k, v in ready.items() if k not in ("event", "t")},
                      "answer": {k: answer.get(k) for k in ("tokens", "digest", "finite")}}
        if kind == "release":
            info["release"] = self.channel.request("pre-checkpoint", 120)
        if self.o.device == "cuda":
            info["gpu_memory_before_checkpoint"] = gpu_memory_used()
        img = self.dir / f"image-{kind}"
        shutil.rmtree(img, ignore_errors=True)
        t0 = time.monotonic()
        self.runsc.checkpoint(cid, CheckpointOptions(
            image_path=img, cuda_checkpoint_path=helper.HELPER_PATH if self.o.device == "cuda" else None))
        info["checkpoint_s"] = round(time.monotonic() - t0, 3)
        info["image_files"] = {p.name: p.stat().st_size for p in sorted(img.iterdir()) if p.is_file()}
        info["image_bytes"] = sum(info["image_files"].values())
        info["cuda_checkpoint"] = cuda_toggles(read_logs(self.logs, cid))
        if self.o.device == "cuda":
            info["gpu_memory_after_checkpoint"] = gpu_memory_used()
        self.delete(cid)
        info["path"] = str(img)
        info["boot"] = answer.get("boot")
        self.result["images"][kind] = info
        self.progress(self.result)
        return info

    def restore(self, name: str, variant: Variant, image: dict) -> dict:
        alt = split_variant(name)[1]
        runsc = self.runsc if alt is None else Runsc(self.o.restore_runsc[alt], self.runsc.options, timeout_s=600)
        if variant.drop_cache:
            if not self.o.drop_caches:
                raise RuntimeError("variant needs the page cache dropped; --no-drop-caches was given")
            drop_caches()
        bundle = self.bundle
        if self.o.device == "cuda" and self.o.cdi:
            # Re-inject the GPUs for the restore the way the node would (same GPU here).
            bundle = specmod.Bundle(self.dir / "bundle-restore")
            bundle.write(cdi.for_restore(self.spec, self.spec, self.registry, self.devices))
        if self.net is not None:
            from runsc_hooks import network
            self.net = network.plumb(*self.net_args)   # same addresses, fresh namespace
        self.channel.reset()
        cid = self.new_id(name)
        rec: dict = {"about": variant.about + (f"; restored by runsc {alt}" if alt else ""),
                     "image": variant.image, "background": variant.background,
                     "page_cache": "dropped" if variant.drop_cache else "warm"}
        t0 = time.monotonic()
        try:
            runsc.restore(cid, RestoreOptions(image_path=Path(image["path"]),
                                                   create=CreateOptions(bundle=bundle.path), detach=True,
                                                   background=variant.background))
            rec["runsc_restore_s"] = round(time.monotonic() - t0, 4)
            answer = self.channel.request("generate", self.o.restore_timeout_s, abort=lambda: self.dead(cid))
            rec["restore_s"] = round(time.monotonic() - t0, 4)
            rec["first_request_s"] = round(rec["restore_s"] - rec["runsc_restore_s"], 4)
            rec["server_s"] = answer.get("server_s")
            rec["identical"] = same_answer(answer, image["answer"])
            rec["same_process"] = answer.get("boot") == image["boot"]
            if not rec["identical"]:
                rec["answer"] = {k: answer.get(k) for k in ("tokens", "digest", "finite")}
            try:
                runsc.wait(cid, timeout_s=self.o.restore_timeout_s, restore=True)
                rec["restore_done_s"] = round(time.monotonic() - t0, 4)
            except Exception as e:  # noqa: BLE001 - recorded; the answer already came
                rec["wait_restore_error"] = str(e)[-300:]
            # The sentry logs the Restore table in a deferred call after it
            # reports the restore done (runsc/boot/restore.go postRestore): give
            # it a moment before the sandbox is deleted.
            end = time.monotonic() + 3.0
            while time.monotonic() < end and "---- End of Restore timing" not in read_logs(self.logs, cid):
                time.sleep(0.05)
        except Exception as e:  # noqa: BLE001 - a failed variant is a result (ChannelTimeout too)
            rec["error"] = f"{type(e).__name__}: {str(e)[-800:]}"
            rec["identical"] = False
        finally:
            self.delete(cid)
        text = read_logs(self.logs, cid)
        rec["cuda_restore"] = cuda_toggles(text)
        tls = timelines(text)
        rec["timeline"] = tls[-1] if tls else []
        return rec

    def first_image(self, kind: str) -> dict:
        """Set-up, first cold start and checkpoint; when GPUs went in through CDI
        and that failed, once more with the GPU smoke's hand-made device list,
        so one bad CDI detail costs a retry, not the device run."""
        try:
            self.setup()
            return self.make_image(kind, first=True)
        except Exception as e:  # noqa: BLE001 - retried without CDI, the error is kept
            if not (self.o.device == "cuda" and self.o.cdi):
                raise
            self.result["cdi_fallback"] = f"{type(e).__name__}: {str(e)[-800:]}"
            print(f"[bench] {self.model}: with CDI: {e}; again without CDI", flush=True)
            self.o.cdi = False      # for later models too
            try:
                for c in self.runsc.list():
                    self.delete(c.id)
            except Exception as e2:  # noqa: BLE001 - set-up failed before runsc had a root
                self.result["errors"].append(f"cleanup before retry: {e2}")
            self.setup()
            return self.make_image(kind, first=True)

    def check_time(self, what: str, need_s: float) -> None:
        if self.o.time_left() < need_s:
            raise OutOfTime(f"{what} skipped: {self.o.time_left():.0f} s left of --budget-s, ~{need_s:.0f} s needed")

    def run(self) -> dict:
        t0 = time.monotonic()
        try:
            self.check_time("model", 60)
            self.make_weights()
            kinds = [k for k in ("norelease", "release")
                     if any(VARIANTS[split_variant(v)[0]].image == k for v in self.o.variants)]
            for i, kind in enumerate(kinds):
                if i:
                    cold = self.result["images"][kinds[0]]
                    self.check_time(f"image {kind}", cold["cold_start_s"] + 3 * cold["checkpoint_s"] + 10)
                image = self.first_image(kind) if i == 0 else self.make_image(kind, first=False)
                for name in [v for v in self.o.variants if VARIANTS[split_variant(v)[0]].image == kind]:
                    runs = []
                    for _ in range(self.o.repeat):
                        self.check_time(f"variant {name}", 3 * image["checkpoint_s"] + 10)
                        runs.append(self.restore(name, VARIANTS[split_variant(name)[0]], image))
                    self.result["variants"][name] = runs[0] if len(runs) == 1 else {**runs[0], "runs": runs}
                    self.progress(self.result)
                    print(f"[bench] {self.model} {name}: {json.dumps(_brief(runs))}", flush=True)
                if not self.o.keep:
                    shutil.rmtree(image["path"], ignore_errors=True)
        except Exception as e:  # noqa: BLE001 - every failure is evidence in the result
            self.result["errors"].append(f"{type(e).__name__}: {e}")
            print(f"[bench] {self.model} error: {e}", flush=True)
        finally:
            if (self.share / "server.log").exists():
                shutil.copy(self.share / "server.log", self.logs / f"{self.model}.server.log")
            if self.net is not None:
                from runsc_hooks import network
                network.unplumb(self.net.name)
            if not self.o.keep:       # disk: the three models' weights are 24 GB
                shutil.rmtree(self.weights_dir, ignore_errors=True)
                shutil.rmtree(self.dir, ignore_errors=True)
        self.result["wall_s"] = round(time.monotonic() - t0, 1)
        self.result.update(summarize(self.result))
        return self.result


def _brief(runs: list[dict]) -> dict:
    keys = ("restore_s", "runsc_restore_s", "first_request_s", "identical", "error")
    return {k: [r.get(k) for r in runs] if len(runs) > 1 else runs[0].get(k) for k in keys if k in runs[0]}


def summarize(r: dict) -> dict:
    """The headline fields (`thaw bench gpu --json`) and, where the target is missed, where the time goes."""
    imgs, variants = r.get("images", {}), r.get("variants", {})
    main = imgs.get("release") or imgs.get("norelease") or {}
    first = imgs.get("norelease") or imgs.get("release") or {}
    best = variants.get("thaw") or next(iter(variants.values()), {})
    s: dict = {
        "cold_start_s": first.get("cold_start_s"),
        "cold_start_warm_s": imgs["release"]["cold_start_s"] if "release" in imgs and "norelease" in imgs else None,
        "checkpoint_s": main.get("checkpoint_s"),
        "image_bytes": main.get("image_bytes"),
        "restore_s": best.get("restore_s"),
        "identical": bool(variants) and all(v.get("identical") for v in variants.values()),
        # Two cold starts giving the same answer: the model and kernels are deterministic across processes.
        "cold_answers_equal": same_answer(imgs["release"]["answer"], imgs["norelease"]["answer"])
        if "release" in imgs and "norelease" in imgs else None,
    }
    target = r.get("target_s")
    s["met_target"] = None if target is None or s["restore_s"] is None else s["restore_s"] <= target
    gains = {}
    if best.get("restore_s") is not None:
        for name, v in variants.items():
            if name != "thaw" and v.get("restore_s") is not None:
                gains[name] = round(v["restore_s"] - best["restore_s"], 4)
    s["slower_than_thaw_s"] = gains
    if s["met_target"] is False or (target is not None and s["restore_s"] is None):
        s["where_time_goes"] = {
            "runsc_restore_s": best.get("runsc_restore_s"),
            "cuda_restore_s": sum(x["seconds"] for x in best.get("cuda_restore", [])) or None,
            "first_request_s": best.get("first_request_s"),
            "server_compute_s": best.get("server_s"),
            "all_pages_loaded_s": best.get("restore_done_s"),
            "largest_restore_phases": sorted(
                ({"after": ", ".join(row["events"]), "seconds": row["since_prev_s"]} for row in best.get("timeline", [])),
                key=lambda x: -x["seconds"])[:5],
            "image_bytes": s["image_bytes"],
        }
    return s


def run(opts: Options) -> dict:
    opts.validate()
    opts.out.mkdir(parents=True, exist_ok=True)
    opts.work.mkdir(parents=True, exist_ok=True)
    node = gpu.probe() if opts.device == "cuda" else None
    if opts.device == "cuda" and not node:
        raise SystemExit("no NVIDIA GPU found through NVML")
    runsc = Runsc(opts.runsc, GlobalOptions(root=opts.work / "runsc-root"))
    result: dict = {
        "benchmark": "gpu-models",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "runsc": runsc.version(),
        "node": node.to_dict() if node else None,
        "options": json.loads(json.dumps(asdict(opts), default=str)),
        "machine": {"cpus": os.cpu_count(), "kernel": os.uname().release,
                    "work_fs": sh("stat", "-f", "-c", "%T", str(opts.work), check=False)},
        "models": {},
    }
    out = opts.out / "models.json"

    def save(model_result: dict) -> None:
        # After every image and variant: a command killed at its time limit keeps what it measured.
        result["models"][model_result["model"]] = {**model_result, **summarize(model_result)}
        tmp = out.with_suffix(".json.partial")
        tmp.write_text(json.dumps(result, indent=2))
        tmp.rename(out)

    for m in opts.models:
        save(ModelBench(opts, m, node, save).run())
    return result


def headline(result: dict) -> dict:
    """Per model: the five fields of issue 6, the target and whether it was met."""
    keys = ("cold_start_s", "checkpoint_s", "image_bytes", "restore_s", "identical", "target_s", "met_target")
    return {m: {k: r.get(k) for k in keys} for m, r in result.get("models", {}).items()}


def parse_args(argv: list[str] | None = None) -> Options:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runsc", required=True, type=Path)
    ap.add_argument("--helper", type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/thaw-bench"))
    ap.add_argument("--models", default="gpt2-large,llama-3b,llama-8b")
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--backend", choices=("transformers", "fake"), default="transformers")
    ap.add_argument("--channel", choices=("file", "http"), default="file")
    ap.add_argument("--python", default="python3")
    ap.add_argument("--no-cdi", dest="cdi", action="store_false")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--runsc-debug", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep images and weights")
    ap.add_argument("--no-drop-caches", dest="drop_caches", action="store_false")
    ap.add_argument("--budget-s", type=float, help="start no new step after this many seconds")
    ap.add_argument("--restore-runsc", action="append", default=[], metavar="NAME=PATH",
                    help="another runsc (same pin and label) for variants named VARIANT@NAME")
    a = ap.parse_args(argv)
    alts = {}
    for item in a.restore_runsc:
        n, sep, path = item.partition("=")
        if not sep or not n or not path:
            raise SystemExit(f"--restore-runsc wants NAME=PATH, got {item!r}")
        alts[n] = Path(path)
    return Options(runsc=a.runsc, helper=a.helper, out=a.out, work=a.work,
                   models=[m for m in a.models.split(",") if m], variants=[v for v in a.variants.split(",") if v],
                   device=a.device, backend=a.backend, channel=a.channel, python=a.python, cdi=a.cdi,
                   repeat=a.repeat, runsc_debug=a.runsc_debug, keep=a.keep,
                   drop_caches=a.drop_caches, budget_s=a.budget_s, restore_runsc=alts)


def main(argv: list[str] | None = None) -> int:
    result = run(parse_args(argv))
    print(json.dumps(headline(result), indent=2))
    ok = all(r.get("identical") and not r.get("errors") for r in result["models"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
