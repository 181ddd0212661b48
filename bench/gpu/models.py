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

The levers of issue 17 (docs/gpu.md, "Restore speed levers") are variants too:
`cooperative*` restore images taken behind the pytorch-offload profile (the
weights in host memory, or dropped, at checkpoint; the post-restore hook
copies them back), `parked*` restore ahead of demand, park the CUDA state
again with the helper through `runsc exec` and time only the demand (CUDA
restore + hook + request), `*-thp` restore with host shmem huge pages on.
The images after the first of a model come from the same server process:
`runsc checkpoint --leave-running` (the CUDA state is toggled back in place)
then the next profile hook, one cold start for all of them. `--native` adds
the driver's own checkpoint/restore of the same model outside any sandbox
(bench/gpu/native_cuda.py), plain and with the weights offloaded.

The GPU goes in through thaw's own path: nvproxy.gpu (NVML) -> nvproxy.cdi
(the node's CDI spec, generated when none exists; re-injected for each
restore with nvproxy.restore_spec.for_restore) and nvproxy.helper (the CUDA checkpoint helper
mounted at its fixed path). The channel to the server is the spool directory
(default) or HTTP over a veth into the sandbox's netns (runsc_hooks.network;
needs pyroute2): bench/gpu/README.md.

Writes <out>/models.json (every model) and returns the same dict.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from control.lifecycle import profiles  # noqa: E402
from control.node.provision import THP_DEFRAG, THP_DIR, THP_SHMEM, thp_read, thp_write  # noqa: E402
# A sandbox's host memory: its memory file counted once, and its processes' RSS (what thawd's
# parked sandboxes report too).
from control.thawd.parked import host_memory as sandbox_host_memory  # noqa: E402
from nvproxy import cdi, gpu, helper, restore_spec  # noqa: E402
from runsc_hooks import spec as specmod  # noqa: E402
from runsc_hooks.runsc import (CheckpointOptions, CreateOptions, GlobalOptions,  # noqa: E402
                               RestoreOptions, Runsc)

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
import smoke  # noqa: E402  (bench/gpu/smoke.py)
from channels import SERVER_PORT, ChannelTimeout, FileChannel, HttpChannel  # noqa: E402,F401
from runsc_logs import cuda_toggles, go_duration, huge_pages_line, read_logs, timelines  # noqa: E402,F401

# Restore targets (seconds to the first correct answer, warm page cache) from
# issue 17: `target_s` for a workload left as it is (transparent; issue 6 had
# 4.5 s for 8B), `coop_target_s` for one behind the pytorch-offload profile.
# `min_s`: what a model needs before its first restore result (weights, cold
# start, checkpoint, one restore; H200 2026-11-29), so a budget skips it whole.
# Model shapes: twin bench/gpu/weights.py SHAPES.
MODELS: dict[str, dict] = {
    "gpt2-large": {"target_s": 1.0, "coop_target_s": 0.7, "min_s": 70},
    "llama-3b": {"target_s": 2.0, "coop_target_s": 1.2, "min_s": 110},
    "llama-8b": {"target_s": 4.0, "coop_target_s": 2.5, "min_s": 170},
    "tiny": {"target_s": None, "coop_target_s": None, "min_s": 10},
    "tiny-llama": {"target_s": None, "coop_target_s": None, "min_s": 10},
}


@dataclass(frozen=True)
class ImageKind:
    """How an image is taken from a warm server: the server's ops before the
    checkpoint (the profile's pre-checkpoint hooks), and the op a restore of it
    needs before the server can answer (the post-restore hook)."""
    pre: tuple[tuple[str, dict], ...] = ()
    post: str | None = None


IMAGES: dict[str, ImageKind] = {
    "norelease": ImageKind(),
    "release": ImageKind(pre=(("pre-checkpoint", {}),)),                    # profile pytorch
    "offload": ImageKind(pre=(("pre-checkpoint", {}), ("offload-weights", {"mode": "register"})),
                         post="restore-weights"),                          # profile pytorch-offload
    "offload-staged": ImageKind(pre=(("pre-checkpoint", {}), ("offload-weights", {"mode": "staged"})),
                                post="restore-weights"),
    "offload-alloc": ImageKind(pre=(("pre-checkpoint", {}), ("offload-weights", {"mode": "alloc"})),
                               post="restore-weights"),
    "drop": ImageKind(pre=(("pre-checkpoint", {}), ("offload-weights", {"mode": "drop"})),
                      post="restore-weights"),
}
# The images one server process gives, in this order (leave-running checkpoints).
CHAIN = ("release", "offload", "offload-staged", "offload-alloc", "drop")


@dataclass(frozen=True)
class Variant:
    image: str            # an IMAGES kind: "release": torch.cuda.empty_cache() before the checkpoint; "norelease": without
    background: bool      # runsc restore --background
    drop_cache: bool      # page cache dropped before the restore
    about: str
    park: bool = False    # restore ahead of demand, CUDA state parked again; time only the demand
    thp: bool = False     # host shmem huge pages on for the restore (THP_FOR_HUGE_PAGES)
    target: str = "transparent"   # which target it answers to: transparent | cooperative
    verified: bool = False  # read through thaw-gofer, every chunk checked (issue 30: bench/gpu/verified.py)


VARIANTS: dict[str, Variant] = {
    "thaw": Variant("release", True, False, "every optimization on"),
    "thaw-cold-cache": Variant("release", True, True, "page cache dropped before restore"),
    "no-background": Variant("release", False, False, "plain runsc restore of the same image (no --background)"),
    "no-release": Variant("norelease", True, False, "without the pre-checkpoint release of cached GPU memory"),
    "baseline": Variant("norelease", False, False, "no thaw optimization at all: no release, no --background"),
    # Issue 17's levers (not in DEFAULT_VARIANTS; bench/gpu/run-speed.sh runs them).
    "cooperative": Variant("offload", True, False, "pytorch-offload profile: weights in cudaHostRegister'd host "
                           "memory at checkpoint, copied back by the post-restore hook", target="cooperative"),
    "cooperative-staged": Variant("offload-staged", True, False, "as cooperative, host memory pageable; the hook "
                                  "copies it back through a small pinned ring", target="cooperative"),
    "cooperative-alloc": Variant("offload-alloc", True, False, "as cooperative, host memory from cudaHostAlloc",
                                 target="cooperative"),
    "cooperative-reload": Variant("drop", True, False, "as cooperative, no host copy: the post-restore hook "
                                  "reloads the weights from the model files", target="cooperative"),
    "parked": Variant("release", True, False, "restored ahead of demand, CUDA state parked again (pages loaded, "
                      "GPU free); timed from demand: CUDA restore by runsc exec of the helper + request", park=True),
    "parked-cooperative": Variant("offload", True, False, "parked, image of the pytorch-offload profile; timed "
                                  "from demand: CUDA restore + post-restore hook + request", park=True,
                                  target="cooperative"),
    "parked-staged": Variant("offload-staged", True, False, "parked, image of cooperative-staged", park=True,
                             target="cooperative"),
    "thaw-thp": Variant("release", True, False, "thaw with host shmem huge pages (runsc --app-huge-pages)", thp=True),
    "no-release-thp": Variant("norelease", True, False, "thaw-thp without the pre-checkpoint release: the caching "
                              "allocator keeps its free blocks, so the first request after the restore allocates "
                              "no device memory", thp=True),
    "no-background-thp": Variant("release", False, False, "thaw-thp without --background: runsc restore loads "
                                 "every page before the workload runs (checkpoint.restore_background = false)",
                                 thp=True),
    "cooperative-thp": Variant("offload", True, False, "cooperative with host shmem huge pages", thp=True,
                               target="cooperative"),
    "cooperative-staged-thp": Variant("offload-staged", True, False, "cooperative-staged with host shmem huge pages",
                                      thp=True, target="cooperative"),
    "parked-cooperative-thp": Variant("offload", True, False, "parked-cooperative with host shmem huge pages",
                                      park=True, thp=True, target="cooperative"),
    "parked-thp": Variant("release", True, False, "parked with host shmem huge pages (thaw-thp's image)",
                          park=True, thp=True),
    "thaw-thp-cold-cache": Variant("release", True, True, "thaw-thp with the page cache dropped before the "
                                   "restore: the image on the node's disk only (the run also reads the "
                                   "image's pages file with O_DIRECT once: the disk's read limit)", thp=True),
    # Issue 30: a node's restore from its cache reads through thaw-gofer, each chunk checked as it
    # is read (cache.verify = read); set beside thaw / thaw-thp, the same image and runsc.
    "thaw-verified": Variant("release", True, False, "thaw, the image read through thaw-gofer with every chunk "
                             "checked (cache.verify = read)", verified=True),
    "thaw-thp-verified": Variant("release", True, False, "thaw-thp, the image read through thaw-gofer with every "
                                 "chunk checked (cache.verify = read)", thp=True, verified=True),
}
DEFAULT_VARIANTS = ("thaw", "thaw-cold-cache", "no-background", "no-release", "baseline")

# Host THP for the *-thp variants. runsc (--app-huge-pages, on by default)
# backs its memory file with huge pages only for shmem_enabled "advise" with
# defrag "always", "defer" or "never" (runsc/boot/loader.go createMemoryFile;
# "always" for shmem_enabled halves nvproxy's pageable copies: gVisor #12804).
# The H200 VM has never/madvise: the driver sets these for the variant's
# restore and puts the old values back after it. runsc reads them when the
# restored sandbox boots; the image's chunks keep their own huge flag.
THP_FOR_HUGE_PAGES = {"shmem_enabled": THP_SHMEM, "defrag": THP_DEFRAG}   # what `thaw provision` sets


def split_variant(name: str) -> tuple[str, str | None]:
    """"thaw@readers8" -> ("thaw", "readers8"): restore with the runsc given as
    --restore-runsc readers8=PATH (a build of the same pin and label with one
    change, e.g. bench/gpu/build-runsc-variant.sh), from the same image."""
    base, _, alt = name.partition("@")
    return base, alt or None


class OutOfTime(Exception):
    pass


class HookFailed(Exception):
    """A pre-checkpoint op of an image failed: that image is not made (the process may go on)."""


def image_complete(img: Path) -> bool:
    """A runsc image directory with a non-empty checkpoint.img and its page files."""
    files = {p.name: p.stat().st_size for p in img.iterdir()} if img.is_dir() else {}
    return files.get("checkpoint.img", 0) > 0 and "pages.img" in files and "pages_meta.img" in files


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
    model_variants: dict[str, list[str]] = field(default_factory=dict)   # per model, instead of `variants`
    native: bool = False                  # also the driver's own checkpoint/restore outside a sandbox (cuda)
    thp_dir: Path = THP_DIR               # where the host THP settings are (tests: a stand-in directory)
    gofer: Path | None = None             # thaw-gofer, for *-verified variants
    chunker: Path | None = None           # thaw-chunk, for *-verified variants (the image's chunk hashes)
    started: float = field(default_factory=time.monotonic, repr=False)

    def time_left(self) -> float:
        return float("inf") if self.budget_s is None else self.budget_s - (time.monotonic() - self.started)

    def validate(self) -> None:
        bad = [m for m in self.models if m not in MODELS]
        if bad:
            raise SystemExit(f"unknown model(s) {bad}; known: {', '.join(MODELS)}")
        bad = [m for m in self.model_variants if m not in MODELS]
        if bad:
            raise SystemExit(f"unknown model(s) {bad} in --model-variants; known: {', '.join(MODELS)}")
        every = [v for vs in [self.variants, *self.model_variants.values()] for v in vs]
        bad = [v for v in every if split_variant(v)[0] not in VARIANTS
               or (split_variant(v)[1] is not None and split_variant(v)[1] not in self.restore_runsc)]
        if bad:
            raise SystemExit(f"unknown variant(s) {bad}; known: {', '.join(VARIANTS)}, each optionally "
                             "@NAME for a --restore-runsc NAME=PATH")
        if any(VARIANTS[split_variant(v)[0]].verified for v in every) and not (self.gofer and self.chunker):
            raise SystemExit("*-verified variants need --gofer (build/thaw-gofer) and --chunker (build/thaw-chunk)")
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


def disk_read_limit(image_dir: Path) -> dict:
    """dd with O_DIRECT over the image's pages file: what the disk under the image reads
    at with no page cache involved (bench/gpu/node.py measures the cache's disk the same way)."""
    f = image_dir / "pages.img"
    if not f.is_file():
        return {"error": f"no {f}"}
    p = subprocess.run(["dd", f"if={f}", "of=/dev/null", "bs=16M", "iflag=direct"], capture_output=True, text=True,
                       timeout=600)
    m = re.search(r"(\d+) bytes .* copied, ([\d.]+) s", p.stderr)
    if p.returncode != 0 or not m:
        return {"error": p.stderr.strip()[-300:]}
    n, s = int(m.group(1)), float(m.group(2))
    return {"file": f.name, "bytes": n, "seconds": s, "mb_s": round(n / s / 1e6, 1) if s else None,
            "how": "dd bs=16M iflag=direct"}


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def gpu_memory_used() -> str:
    try:
        return sh("nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader", check=False, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "?"




# The CPU rehearsal's stand-in for the CUDA checkpoint helper (--device cpu,
# parked variants): the same command line and output, a state in the sandbox's
# own /tmp, no GPU.
FAKE_HELPER = """#!/bin/sh
# bench/gpu/models.py --device cpu: stand-in for thaw-cuda-checkpoint (no GPU).
f=/tmp/.thaw-fake-cuda-state
mode=; timing=
for a in "$@"; do case "$a" in --get-state|--toggle) mode=$a;; --timing) timing=1;; esac; done
s=$(cat "$f" 2>/dev/null || echo running)
case "$mode" in
  --toggle) if [ "$s" = running ]; then s=checkpointed; else s=running; fi; echo "$s" > "$f";;
  --get-state) echo "$s";;
  *) exit 2;;
esac
[ -n "$timing" ] && echo "thaw-cuda-checkpoint timing: dlopen=0.000000 cuInit=0.000000 total=0.000000" >&2
exit 0
"""


def interpreter(python: str) -> tuple[str, list[str]]:
    """The server interpreter's own path (a venv's, not its symlink target: that
    is what makes the venv's packages active) and the host directories it
    needs visible in the sandbox (host layout)."""
    code = ("import sys,os,json;print(json.dumps([sys.executable,[sys.prefix,sys.base_prefix,"
            "os.path.dirname(os.path.realpath(sys.executable))]]))")
    exe, paths = json.loads(sh(python, "-c", code))
    return exe, paths


def median_run(runs: list[dict]) -> dict:
    """Several runs of a variant as one record: the run with the median
    restore_s (the lower middle of an even count) and its fields, `runs`, the
    spread (`restore_s_min`/`_max`), and `identical` only if every run was.
    A failed run (no restore_s) is never the median unless all failed."""
    if len(runs) == 1:
        return runs[0]
    ok = sorted((r for r in runs if r.get("restore_s") is not None), key=lambda r: r["restore_s"])
    mid = ok[(len(ok) - 1) // 2] if ok else runs[0]
    out = {**mid, "runs": runs, "identical": all(r.get("identical") for r in runs)}
    if ok:
        out.update(restore_s_min=ok[0]["restore_s"], restore_s_max=ok[-1]["restore_s"])
    return out


HELPER_TIMING = "helper-timing.log"


def helper_steps(path: Path, t0_wall: float | None) -> list[dict]:
    """The helper runs' lines in `path` (THAW_CUDA_CHECKPOINT_TIMING): mode and
    each step's seconds, and `started_s`, when it started after `t0_wall` (the
    restore command's start): runsc's exec of it and what came before."""
    out = []
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        t = helper.parse_timing(line)
        mode = next((w[5:] for w in line.split() if w.startswith("mode=")), None)
        if t:
            if t0_wall is not None and "started" in t:
                t["started_s"] = round(t["started"] - t0_wall, 4)
            out.append({"mode": mode, **t})
    return out


def warm_request_s(r: dict, image: str = "release") -> float | None:
    """The request's server time on the warm server `image` was taken from."""
    return (((r.get("images") or {}).get(image) or {}).get("warm_request") or {}).get("server_s")


def request_after_unlock(rec: dict) -> float | None:
    """The first request's server time less its wait for the CUDA unlock."""
    t = rec.get("request_timing") or {}
    if rec.get("server_s") is None or t.get("cuda_wait_s") is None:
        return None
    return round(rec["server_s"] - t["cuda_wait_s"], 4)


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
        self.variants = list(opts.model_variants.get(model, opts.variants))
        self.result: dict = {"model": model, "target_s": MODELS[model]["target_s"],
                             "coop_target_s": MODELS[model]["coop_target_s"], "device": opts.device,
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
        elif any(VARIANTS[split_variant(v)[0]].park for v in self.variants):
            fake = self.dir / "fake-helper"
            fake.write_text(FAKE_HELPER)
            fake.chmod(0o755)
            helper.stage(fake, self.dir / "helper")
            helper.add_to_spec(spec, self.dir / "helper")
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
        # The helper runsc starts in the sandbox (the restore's toggle) appends its
        # steps here (thaw-cuda-checkpoint.c; runsc keeps its output only in a debug log).
        env["THAW_CUDA_CHECKPOINT_TIMING"] = "/share/" + HELPER_TIMING
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

    def call(self, op: str, timeout_s: float = 300, cid: str | None = None, **args) -> dict:
        """One server op (a profile hook's route on the HTTP channel); RuntimeError when it answers an
        error. With `cid`, waiting stops as soon as that sandbox is dead."""
        t0 = time.monotonic()
        out = self.channel.request(op, timeout_s, abort=(lambda: self.dead(cid)) if cid else None, **args)
        if "error" in out:
            raise RuntimeError(f"server {op}: {out['error']}")
        return {**out, "wall_s": round(time.monotonic() - t0, 4)}

    def make_image(self, kind: str, first: bool) -> dict:
        """One cold start, one image (the sandbox ends with the checkpoint)."""
        made = self.make_chain([kind], first)
        if kind not in made:
            raise RuntimeError(f"no {kind} image: {self.result['errors'][-1] if self.result['errors'] else '?'}")
        return made[kind]

    def make_chain(self, kinds: list[str], first: bool) -> dict[str, dict]:
        """The images `kinds` (in CHAIN order) from one server process: each but
        the last is saved with --leave-running, after which the process goes on
        (its weights back if they had left) and must answer as before; the next
        kind's hooks run on it. A kind whose hook or checkpoint fails is left out
        (recorded in errors; its variants say so) and the process goes on if it
        still answers as before, else the kinds left get a new cold start. An
        image saved whole whose in-place resume failed is kept, and the kinds
        left get a cold start each."""
        made: dict[str, dict] = {}
        todo = list(kinds)
        chained = True
        while todo:
            if made:        # a cold start of its own for what is left
                ck = next(iter(made.values()))["checkpoint_s"]
                self.check_time(f"image {todo[0]}", 45 + 2 * ck)
            cid, answer, cold_s = self.cold_start(cold_cache=first and self.o.drop_caches)
            ready = next((e for e in self.events() if e.get("event") == "ready"), {})
            base: dict = {"cold_start_s": round(cold_s, 3), "cold_cache": first and self.o.drop_caches,
                          "server": {k: v for k, v in ready.items() if k not in ("event", "t")},
                          "answer": {k: answer.get(k) for k in ("tokens", "digest", "finite")},
                          "boot": answer.get("boot"),
                          # What the request costs a warm server: a restore's first answer
                          # includes it, the driver's restore time (the native column) does not.
                          "warm_request": self.request_record(cid, answer)}
            first = False
            here: list[str] = []        # the images taken from this process so far
            try:
                while todo:
                    kind = todo[0]
                    leave = chained and len(todo) > 1
                    if here:
                        ck = made[here[0]]["checkpoint_s"]
                        self.check_time(f"image {kind}", 10 + 2 * ck)
                    try:
                        info = self.take_image(cid, kind, dict(base, taken_after=list(here)), leave_running=leave)
                    except OutOfTime:
                        raise
                    except Exception as e:  # noqa: BLE001 - a hook, or the checkpoint leaving no whole image
                        # Not retried: the same process state would fail the same way.
                        why = str(e) if isinstance(e, HookFailed) else f"{type(e).__name__}: {str(e)[-600:]}"
                        self.result["errors"].append(f"image {kind} not made: {why}")
                        todo.pop(0)
                        if not todo or not (leave or isinstance(e, HookFailed)):
                            break
                        # The rest from this process if it still answers as before (its weights back
                        # first if they had left: harmless if they had not), else from a new one.
                        check = self.answers_as_before(cid, IMAGES[kind].post, answer)
                        if not check.get("identical"):
                            self.result["errors"].append(f"after image {kind} failed the server did not answer "
                                                         f"as before: {check}; a new cold start for the rest")
                            break
                        continue
                    made[kind] = info
                    here.append(kind)
                    todo.pop(0)
                    if not leave:
                        break
                    if "checkpoint_error" in info:
                        # Saved whole, then the in-place CUDA resume failed: the image stays, the process does not.
                        self.result["errors"].append(f"image {kind}: saved, then --leave-running failed: "
                                                     f"{info['checkpoint_error']}; the images left get a cold "
                                                     "start each")
                        chained = False
                        break
                    # The process goes on: the next image is taken from it.
                    info["after_leave_running"] = cont = self.answers_as_before(cid, IMAGES[kind].post, answer)
                    self.progress(self.result)
                    if not cont.get("identical"):
                        self.result["errors"].append(f"after the leave-running checkpoint of {kind} the server "
                                                     f"did not answer as before: {cont}; the images left get a "
                                                     "cold start each")
                        chained = False
                        break
            finally:
                self.delete(cid)
        return made

    def answers_as_before(self, cid: str, post: str | None, answer: dict) -> dict:
        """After a leave-running checkpoint (or a failed hook): the post-restore op if the image needs
        one, then a request, which must give the cold start's answer."""
        out: dict = {}
        try:
            # Short waits: a process left locked by a failed CUDA checkpoint never answers.
            if post:
                out["post"] = self.call(post, 60, cid=cid)
            again = self.call("generate", 30, cid=cid)
            out["identical"] = same_answer(again, answer)
            out["server_s"] = again.get("server_s")
            out["timing"] = again.get("timing")
        except Exception as e:  # noqa: BLE001 - recorded; the caller ends the chain
            out["error"] = f"{type(e).__name__}: {str(e)[-600:]}"
        return out

    def request_record(self, cid: str, answer: dict) -> dict:
        """One more request to a running server: its time and split (server.py
        TorchBackend.generate), and whether it answered as `answer`."""
        try:
            again = self.call("generate", 60, cid=cid)
        except Exception as e:  # noqa: BLE001 - a measurement, not a step
            return {"error": f"{type(e).__name__}: {str(e)[-300:]}"}
        return {"server_s": again.get("server_s"), "timing": again.get("timing"),
                "identical": same_answer(again, answer)}

    def take_image(self, cid: str, kind: str, info: dict, leave_running: bool) -> dict:
        """The kind's pre-checkpoint ops, then `runsc checkpoint`. HookFailed when an op
        fails (nothing was saved); with --leave-running, a checkpoint command that fails
        after writing a whole image keeps it (`checkpoint_error`)."""
        try:
            for op, args in IMAGES[kind].pre:
                info.setdefault("hooks", {})[op] = self.call(op, cid=cid, **args)
        except Exception as e:  # noqa: BLE001 - the caller decides
            raise HookFailed(f"{type(e).__name__}: {str(e)[-600:]}") from e
        if "pre-checkpoint" in info.get("hooks", {}):
            info["release"] = info["hooks"]["pre-checkpoint"]
        if self.o.device == "cuda":
            info["gpu_memory_before_checkpoint"] = gpu_memory_used()
        img = self.dir / f"image-{kind}"
        shutil.rmtree(img, ignore_errors=True)
        seen = len(cuda_toggles(read_logs(self.logs, cid)))
        t0 = time.monotonic()
        try:
            self.runsc.checkpoint(cid, CheckpointOptions(
                image_path=img, leave_running=leave_running,
                cuda_checkpoint_path=helper.HELPER_PATH if self.o.device == "cuda" else None))
        except Exception as e:
            if not (leave_running and image_complete(img)):
                shutil.rmtree(img, ignore_errors=True)
                raise
            info["checkpoint_error"] = f"{type(e).__name__}: {str(e)[-600:]}"
        info["checkpoint_s"] = round(time.monotonic() - t0, 3)
        info["leave_running"] = leave_running
        info["image_files"] = {p.name: p.stat().st_size for p in sorted(img.iterdir()) if p.is_file()}
        info["image_bytes"] = sum(info["image_files"].values())
        toggles = cuda_toggles(read_logs(self.logs, cid))[seen:]
        info["cuda_checkpoint"] = toggles[:1]
        if leave_running:
            info["cuda_resume"] = toggles[1:]    # the process toggled back in place
        if self.o.device == "cuda":
            info["gpu_memory_after_checkpoint"] = gpu_memory_used()
        info["path"] = str(img)
        self.result["images"][kind] = info
        self.progress(self.result)
        return info

    @contextlib.contextmanager
    def host_thp(self, why: str):
        """THP_FOR_HUGE_PAGES on the host for the block, the old values after it.
        Yields the values in force (None where they could not be set: recorded
        in errors, the block runs anyway)."""
        try:
            saved = thp_read(self.o.thp_dir)
            thp_write(self.o.thp_dir, THP_FOR_HUGE_PAGES)
        except OSError as e:
            self.result["errors"].append(f"host THP not set for {why}: {e}")
            yield None
            return
        try:
            yield thp_read(self.o.thp_dir)
        finally:
            try:
                thp_write(self.o.thp_dir, saved)
            except OSError as e:
                self.result["errors"].append(f"could not put host THP back to {saved} after {why}: {e}")

    def helper_exec(self, runsc: Runsc, cid: str, pid: int, *args: str) -> dict:
        """The CUDA checkpoint helper run in the sandbox through `runsc exec`, with
        its --timing line: the wall time from here (runsc exec included) and the
        helper's own steps (libcuda load, cuInit, the driver calls)."""
        t0 = time.monotonic()
        p = runsc.exec(cid, [helper.HELPER_PATH, helper.TIMING_FLAG, *args, "--pid", str(pid)], timeout_s=300)
        return {"args": list(args), "wall_s": round(time.monotonic() - t0, 4), "stdout": p.stdout.strip(),
                "timing": helper.parse_timing(p.stderr)}

    def park(self, runsc: Runsc, cid: str, t0: float, image: dict) -> dict:
        """After a --background restore: wait until runsc has restored the CUDA
        state and loaded every page, then check it (the helper's fixed cost in
        the sandbox: --get-state twice), park it (--toggle: checkpointed, GPU
        memory free) and measure what the parked sandbox holds on the host."""
        pid = int((image.get("server") or {}).get("pid") or 1)
        rec: dict = {"pid": pid}
        runsc.wait(cid, timeout_s=self.o.restore_timeout_s, restore=True)
        rec["restore_done_s"] = round(time.monotonic() - t0, 4)
        rec["get_state"] = [self.helper_exec(runsc, cid, pid, "--get-state") for _ in range(2)]
        rec["park_toggle"] = self.helper_exec(runsc, cid, pid, "--toggle")
        rec["parked_state"] = self.helper_exec(runsc, cid, pid, "--get-state")["stdout"]
        if rec["parked_state"] != "checkpointed":
            raise RuntimeError(f"parking left the process {rec['parked_state']!r}, not checkpointed")
        rec["parked_s"] = round(time.monotonic() - t0, 4)
        if self.o.device == "cuda":
            rec["gpu_memory_parked"] = gpu_memory_used()
        try:
            rec["host_memory"] = sandbox_host_memory(runsc.state(cid).pid)
        except Exception as e:  # noqa: BLE001 - a measurement, not a step
            rec["host_memory"] = {"error": f"{type(e).__name__}: {e}"}
        return rec

    def restore(self, name: str, variant: Variant, image: dict) -> dict:
        alt = split_variant(name)[1]
        runsc = self.runsc if alt is None else Runsc(self.o.restore_runsc[alt], self.runsc.options, timeout_s=600)
        if variant.drop_cache:
            if not self.o.drop_caches:
                raise RuntimeError("variant needs the page cache dropped; --no-drop-caches was given")
            if "disk_read" not in image:   # once per image: the disk's own limit, beside the cold restore
                image["disk_read"] = disk_read_limit(Path(image["path"]))
            drop_caches()
        bundle = self.bundle
        if self.o.device == "cuda" and self.o.cdi:
            # Re-inject the GPUs for the restore the way the node would (same GPU here).
            bundle = specmod.Bundle(self.dir / "bundle-restore")
            bundle.write(restore_spec.for_restore(self.spec, self.spec, self.registry, self.devices))
        if self.net is not None:
            from runsc_hooks import network
            self.net = network.plumb(*self.net_args)   # same addresses, fresh namespace
        self.channel.reset()
        cid = self.new_id(name)
        rec: dict = {"about": variant.about + (f"; restored by runsc {alt}" if alt else ""),
                     "image": variant.image, "background": variant.background,
                     "page_cache": "dropped" if variant.drop_cache else "warm"}
        if variant.drop_cache:
            rec["disk_read"] = image.get("disk_read")
        held = contextlib.ExitStack()
        t0_wall: float | None = None
        image_path, env = Path(image["path"]), ()
        if variant.verified:   # untimed: what a node's cache holds already (the manifest), and the view
            import verified  # noqa: E402  (bench/gpu/verified.py)
            chunks = self.dir / f"{variant.image}.chunks.json"
            if "verify_chunks" not in image:
                image["verify_chunks"] = verified.chunk_list(image_path, self.o.chunker, chunks)
            image_path, env = verified.view(image_path, chunks, self.o.gofer, self.dir / "verified",
                                               huge=variant.thp)
            rec["verified"] = dict(image["verify_chunks"])
        try:
            if variant.thp:
                # Until the sandbox is deleted: runsc reads the setting as the
                # restored sandbox boots, and pages go on loading after `runsc restore`.
                rec["host_thp"] = held.enter_context(self.host_thp(f"variant {name}"))
            (self.share / HELPER_TIMING).unlink(missing_ok=True)
            t0, t0_wall = time.monotonic(), time.time()
            runsc.restore(cid, RestoreOptions(image_path=image_path,
                                              create=CreateOptions(bundle=bundle.path), detach=True,
                                              background=variant.background, env=env))
            rec["runsc_restore_s"] = round(time.monotonic() - t0, 4)
            if variant.park:
                rec["park"] = self.park(runsc, cid, t0, image)
                t0 = time.monotonic()           # demand: from here to the first answer
                rec["demand_toggle"] = self.helper_exec(runsc, cid, rec["park"]["pid"], "--toggle")
            post = IMAGES[variant.image].post
            if post:
                rec["post_restore"] = self.call(post, self.o.restore_timeout_s, cid=cid)
            answer = self.channel.request("generate", self.o.restore_timeout_s, abort=lambda: self.dead(cid))
            rec["restore_s"] = round(time.monotonic() - t0, 4)
            rec["first_request_s"] = round(rec["restore_s"] - (0 if variant.park else rec["runsc_restore_s"]), 4)
            if "error" in answer:
                raise RuntimeError(f"server generate: {answer['error']}")
            rec["server_s"] = answer.get("server_s")
            rec["request_timing"] = answer.get("timing")
            rec["identical"] = same_answer(answer, image["answer"])
            rec["same_process"] = answer.get("boot") == image["boot"]
            if not rec["identical"]:
                rec["answer"] = {k: answer.get(k) for k in ("tokens", "digest", "finite")}
            if not variant.park:
                try:
                    runsc.wait(cid, timeout_s=self.o.restore_timeout_s, restore=True)
                    rec["restore_done_s"] = round(time.monotonic() - t0, 4)
                except Exception as e:  # noqa: BLE001 - recorded; the answer already came
                    rec["wait_restore_error"] = str(e)[-300:]
            # The same request once more: the first answer's extra over it is
            # what the first request after a restore pays.
            rec["second_request"] = self.request_record(cid, image["answer"])
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
            held.close()
        if variant.verified:
            import verified  # noqa: E402
            rec["verified"].update(verified.report(image_path))   # corrupt None: every chunk matched
        rec["helper_steps"] = helper_steps(self.share / HELPER_TIMING, t0_wall)
        text = read_logs(self.logs, cid)
        rec["cuda_restore"] = cuda_toggles(text)
        rec["huge_pages"] = huge_pages_line(text)
        tls = timelines(text)
        rec["timeline"] = tls[-1] if tls else []
        return rec

    def with_cdi_fallback(self, step: Callable[[], dict]) -> dict:
        """Set-up and the first image step; when GPUs went in through CDI and
        that failed before any image was made, once more with the GPU smoke's
        hand-made device list, so one bad CDI detail costs a retry, not the device run."""
        try:
            self.setup()
            return step()
        except OutOfTime:
            raise
        except Exception as e:  # noqa: BLE001 - retried without CDI, the error is kept
            if not (self.o.device == "cuda" and self.o.cdi) or self.result["images"]:
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
            return step()

    def first_image(self, kind: str) -> dict:
        return self.with_cdi_fallback(lambda: self.make_image(kind, first=True))

    def check_time(self, what: str, need_s: float) -> None:
        if self.o.time_left() < need_s:
            raise OutOfTime(f"{what} skipped: {self.o.time_left():.0f} s left of --budget-s, ~{need_s:.0f} s needed")

    def native(self) -> None:
        """The driver's own checkpoint/restore of the same model, outside any sandbox (bench/gpu/native_cuda.py)."""
        import native_cuda  # noqa: E402  (bench/gpu/native_cuda.py)
        self.check_time("native", 45)
        t0 = time.monotonic()
        self.result["native"] = native_cuda.one(self.model, str(self.o.helper), self.o.work, keep_weights=True,
                                                offload_mode="register")
        self.result["native"]["wall_s"] = round(time.monotonic() - t0, 1)
        self.progress(self.result)
        print(f"[bench] {self.model} native: {json.dumps(_native_brief(self.result['native']))}", flush=True)

    def run(self) -> dict:
        t0 = time.monotonic()
        try:
            self.check_time("model", MODELS[self.model]["min_s"])
            self.make_weights()
            if self.o.native and self.o.device == "cuda":
                try:
                    self.native()
                except OutOfTime:
                    raise
                except Exception as e:  # noqa: BLE001 - the sandbox variants still run
                    self.result["native"] = {"error": f"{type(e).__name__}: {str(e)[-800:]}"}
            needed = {VARIANTS[split_variant(v)[0]].image for v in self.variants}
            solo = [k for k in ("norelease",) if k in needed]
            chain = [k for k in CHAIN if k in needed]
            if solo:
                self.first_image("norelease")
            if chain:
                # The memory file's chunks get their huge-page flag when the
                # workload allocates (pkg/sentry/pgalloc: chunk.huge), so the
                # *-thp variants need the cold start and checkpoints under host
                # THP too; the other variants restore the same images with THP
                # as it was (runsc then backs the chunks with small pages).
                thp = any(VARIANTS[split_variant(v)[0]].thp for v in self.variants)
                with self.host_thp("the cold start and checkpoints") if thp else contextlib.nullcontext() as t:
                    self.result["host_thp_at_checkpoint"] = t if thp else None
                    if solo:
                        self.make_chain(chain, first=False)
                    else:
                        self.with_cdi_fallback(lambda: self.make_chain(chain, first=True))
            uses = Counter(VARIANTS[split_variant(v)[0]].image for v in self.variants)
            for name in self.variants:
                variant = VARIANTS[split_variant(name)[0]]
                image = self.result["images"].get(variant.image)
                if image is None:
                    self.result["variants"][name] = {"error": f"no {variant.image} image was made",
                                                     "identical": False}
                    continue
                runs = []
                for _ in range(self.o.repeat):
                    # A restore takes about half a checkpoint; parked ones a checkpoint and a half.
                    self.check_time(f"variant {name}", 2 * image["checkpoint_s"] + 10)
                    runs.append(self.restore(name, variant, image))
                self.result["variants"][name] = median_run(runs)
                self.progress(self.result)
                print(f"[bench] {self.model} {name}: {json.dumps(_brief(runs))}", flush=True)
                uses[variant.image] -= 1
                if uses[variant.image] == 0 and not self.o.keep:
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


def _native_brief(n: dict) -> dict:
    """bench/gpu/native_cuda.py's record, shortened: the CUDA restore outside a sandbox, plain and cooperative."""
    if not isinstance(n, dict) or "native_restore_s" not in n:
        return {"error": (n or {}).get("error")} if isinstance(n, dict) else {}
    out = {"cuda_checkpoint_s": n.get("native_checkpoint_s"), "cuda_restore_s": n.get("native_restore_s"),
           "identical": n.get("identical"), "get_state_s": n.get("get_state_s"),
           "warm_request_s": (n.get("warm_request") or {}).get("wall_s"),
           "requests_after_restore_s": [x.get("wall_s") for x in n.get("requests_after_restore") or []]}
    off = n.get("offload") or {}
    if off:
        out["cooperative"] = {k: off.get(k) for k in ("cuda_checkpoint_s", "cuda_restore_s", "restore_weights_s",
                                                       "restore_s", "identical", "error") if k in off}
    return out


def levers(r: dict) -> dict:
    """Issue 17's comparison, per variant: seconds to the first correct answer
    (parked: from demand), the target it answers to (transparent or
    cooperative) and the gap to `thaw`; beside them the driver's own restore
    of the same model outside a sandbox (`native`: CUDA restore only, no
    runsc, no request)."""
    out: dict = {}
    variants = r.get("variants", {})
    thaw = (variants.get("thaw") or {}).get("restore_s")
    for name, v in variants.items():
        var = VARIANTS.get(split_variant(name)[0])
        if var is None:
            continue
        target = r.get("target_s") if var.target == "transparent" else r.get("coop_target_s")
        t = v.get("restore_s")
        row: dict = {"restore_s": t, "identical": v.get("identical"), "target": var.target, "target_s": target,
                     "met_target": None if target is None or t is None else bool(t <= target and v.get("identical")),
                     "vs_thaw_s": round(t - thaw, 4) if t is not None and thaw is not None else None,
                     "image_bytes": (r.get("images", {}).get(var.image) or {}).get("image_bytes")}
        if "demand_toggle" in v:
            row["cuda_restore_s"] = v["demand_toggle"].get("wall_s")
        elif v.get("cuda_restore"):
            row["cuda_restore_s"] = round(sum(x["seconds"] for x in v["cuda_restore"]), 4)
        if "post_restore" in v:
            row["post_restore_s"] = v["post_restore"].get("wall_s")
            # The hook's own copy, after its wait for the CUDA unlock (offload.py Stash.restore).
            row["weights_copy_s"] = v["post_restore"].get("copy_s")
        row["request_s"] = request_after_unlock(v)
        toggle = next((h for h in v.get("helper_steps") or [] if h.get("mode") == "toggle"), None)
        if toggle:
            # The restore's toggle as the helper saw it: when runsc had it running, libcuda's
            # load and cuInit, and the driver's restore.
            row["helper"] = {k: toggle.get(k) for k in ("started_s", "dlopen", "cuInit", "restore", "total")}
        if "park" in v:
            row["parked_after_s"] = v["park"].get("parked_s")
            row["parked_host_memfd_bytes"] = (v["park"].get("host_memory") or {}).get("memfd_bytes")
        if v.get("error"):
            row["error"] = v["error"][:300]
        out[name] = row
    if r.get("native"):
        out["native"] = _native_brief(r["native"])
    return out


def summarize(r: dict) -> dict:
    """The headline fields (`bench/gpu/models.py --json`) and, where the target is missed, where the time goes."""
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
            # The first request's own time once the process was unlocked, the
            # same request's on the warm server before the checkpoint, and once
            # more after the restore (server.py TorchBackend.generate's split).
            "request_after_unlock_s": request_after_unlock(best),
            "warm_request_s": warm_request_s(r, best.get("image") or "release"),
            "second_request_s": (best.get("second_request") or {}).get("server_s"),
            "all_pages_loaded_s": best.get("restore_done_s"),
            "largest_restore_phases": sorted(
                ({"after": ", ".join(row["events"]), "seconds": row["since_prev_s"]} for row in best.get("timeline", [])),
                key=lambda x: -x["seconds"])[:5],
            "image_bytes": s["image_bytes"],
        }
    s["levers"] = levers(r)
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
    ap.add_argument("--model-variants", action="append", default=[], metavar="MODEL=V1,V2",
                    help="this model's variants instead of --variants (in this order)")
    ap.add_argument("--native", action="store_true",
                    help="also the driver's checkpoint/restore of each model outside a sandbox (bench/gpu/native_cuda.py)")
    ap.add_argument("--gofer", type=Path, help="thaw-gofer (the *-verified variants)")
    ap.add_argument("--chunker", type=Path, help="thaw-chunk (the *-verified variants)")
    ap.add_argument("--thp-dir", type=Path, default=THP_DIR,
                    help="where the host THP settings the *-thp variants change are (CPU rehearsals: a stand-in)")
    a = ap.parse_args(argv)
    per_model = {}
    for item in a.model_variants:
        m, sep, vs = item.partition("=")
        if not sep or not m:
            raise SystemExit(f"--model-variants wants MODEL=V1,V2, got {item!r}")
        per_model[m] = [v for v in vs.split(",") if v]
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
                   drop_caches=a.drop_caches, budget_s=a.budget_s, restore_runsc=alts,
                   model_variants=per_model, native=a.native, thp_dir=a.thp_dir, gofer=a.gofer, chunker=a.chunker)


def lever_table(result: dict) -> str:
    """The levers of every model as text (`models.py table RESULTS.json`)."""
    gb = lambda b: f"{b / 1e9:.2f}" if isinstance(b, (int, float)) else "-"   # noqa: E731
    num = lambda x: f"{x:.3f}" if isinstance(x, (int, float)) else "-"        # noqa: E731
    lines = []
    for m, r in result.get("models", {}).items():
        lv = r.get("levers") or levers(r)
        lines.append(f"== {m}: transparent target {r.get('target_s')} s, cooperative {r.get('coop_target_s')} s; "
                     f"errors: {len(r.get('errors', []))}")
        warm = warm_request_s(r)
        lines.append(f"{'variant':24} {'restore_s':>9} {'target':>6} {'met':>5} {'same':>5} {'image_GB':>8} "
                     f"{'cuda_s':>7} {'hook_s':>7} {'copy_s':>7} {'req_s':>7} {'parked_GB':>9}  error"
                     f"   (req_s: the first request after the unlock; warm server {num(warm)} s)")
        for name, row in lv.items():
            if name == "native":
                continue
            lines.append(f"{name:24} {num(row.get('restore_s')):>9} {num(row.get('target_s')):>6} "
                         f"{str(row.get('met_target')):>5} {str(row.get('identical')):>5} {gb(row.get('image_bytes')):>8} "
                         f"{num(row.get('cuda_restore_s')):>7} {num(row.get('post_restore_s')):>7} "
                         f"{num(row.get('weights_copy_s')):>7} {num(row.get('request_s')):>7} "
                         f"{gb(row.get('parked_host_memfd_bytes')):>9}  {(row.get('error') or '')[:80]}")
        n = lv.get("native") or {}
        if n:
            c = n.get("cooperative") or {}
            lines.append(f"native (no sandbox): CUDA restore {num(n.get('cuda_restore_s'))} s, checkpoint "
                         f"{num(n.get('cuda_checkpoint_s'))} s, get-state {n.get('get_state_s')}; cooperative: "
                         f"CUDA restore {num(c.get('cuda_restore_s'))} s + weights {num(c.get('restore_weights_s'))} s"
                         f" = {num(c.get('restore_s'))} s, identical {n.get('identical')}/{c.get('identical')}; "
                         f"request warm {num(n.get('warm_request_s'))} s, after the restore "
                         f"{[num(x) for x in n.get('requests_after_restore_s') or []]}"
                         + (f"; error {n.get('error') or c.get('error')}" if n.get("error") or c.get("error") else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["table"]:
        print(lever_table(json.loads(Path(argv[1]).read_text())))
        return 0
    result = run(parse_args(argv))
    print(json.dumps(headline(result), indent=2))
    ok = all(r.get("identical") and not r.get("errors") for r in result["models"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
