"""Fixed-seed random fp16 checkpoints of real model shapes, made on the machine
that runs the benchmark (no hub, no network).

`python3 bench/gpu/weights.py --model llama-8b --out DIR [--device cuda]`
writes DIR/config.json and DIR/model.safetensors, loadable with
`AutoModelForCausalLM.from_pretrained(DIR)`. The tensors come from
torch.Generator(seed) on --device (the GPU makes 8B parameters in seconds);
norm weights are ones and biases zeros, the rest N(0, 0.02), so activations
stay finite through every layer. DIR/.complete marks a finished directory;
an existing complete one with the same config is reused.

`--model tiny`/`tiny-llama` are for CPU tests; `--format fake` writes a small
random file instead (for bench/gpu/server.py --backend fake, without torch).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

SEED = 20261129

# Model shapes (transformers config fields). Twin: bench/gpu/models.py MODELS.
SHAPES: dict[str, dict] = {
    "gpt2-large": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 1280, "n_layer": 36,
                   "n_head": 20, "vocab_size": 50257, "n_positions": 1024, "n_inner": None},
    "llama-3b": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 3072,
                 "num_hidden_layers": 28, "num_attention_heads": 24, "num_key_value_heads": 8,
                 "intermediate_size": 8192, "vocab_size": 128256, "max_position_embeddings": 8192,
                 "rope_theta": 500000.0, "tie_word_embeddings": True, "rms_norm_eps": 1e-5},
    "llama-8b": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
                 "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                 "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192,
                 "rope_theta": 500000.0, "tie_word_embeddings": False, "rms_norm_eps": 1e-5},
    "tiny": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_layer": 2,
             "n_head": 2, "vocab_size": 1000, "n_positions": 128, "n_inner": None},
    "tiny-llama": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                   "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 128,
                   "tie_word_embeddings": False, "rms_norm_eps": 1e-5},
}


def config_for(model: str) -> dict:
    if model not in SHAPES:
        raise SystemExit(f"unknown model {model!r}; known: {', '.join(SHAPES)}")
    return {**SHAPES[model], "torch_dtype": "float16", "dtype": "float16", "use_cache": True,
            "bos_token_id": 1, "eos_token_id": 2}


def _fingerprint(config: dict, fmt: str) -> str:
    return hashlib.sha256(json.dumps({"config": config, "seed": SEED, "format": fmt},
                                     sort_keys=True).encode()).hexdigest()[:16]


def make(model: str, out: Path, device: str = "cpu", fmt: str = "safetensors") -> dict:
    """Write (or reuse) the checkpoint; returns facts about it."""
    config = config_for(model)
    fp = _fingerprint(config, fmt)
    done = out / ".complete"
    if done.is_file() and done.read_text().strip() == fp:
        return {"model": model, "dir": str(out), "reused": True, "seconds": 0.0,
                "bytes": sum(p.stat().st_size for p in out.iterdir() if p.is_file())}
    t0 = time.time()
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    partial.mkdir(parents=True)
    (partial / "config.json").write_text(json.dumps(config, indent=2))
    if fmt == "fake":
        rnd = hashlib.sha256(f"{model}-{SEED}".encode()).digest()
        (partial / "model.bin").write_bytes(rnd * (1 << 14))
        params = 0
    else:
        params = _write_safetensors(config, partial / "model.safetensors", device)
    (partial / ".complete").write_text(fp + "\n")
    os.sync()
    partial.rename(out)
    return {"model": model, "dir": str(out), "reused": False, "seconds": round(time.time() - t0, 3),
            "params": params, "bytes": sum(p.stat().st_size for p in out.iterdir() if p.is_file())}


def _write_safetensors(config: dict, path: Path, device: str) -> int:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**{k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")})
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(cfg)
    tied = {"lm_head.weight"} if getattr(cfg, "tie_word_embeddings", False) else set()
    gen = torch.Generator(device=device).manual_seed(SEED)
    tensors, params = {}, 0
    for name, p in skeleton.state_dict().items():
        if name in tied or not p.is_floating_point():
            continue
        shape = tuple(p.shape)
        if name.endswith("bias"):
            t = torch.zeros(shape, dtype=torch.float16, device=device)
        elif "norm" in name or ".ln_" in name or name.startswith("ln_") or ".ln_f" in name:
            t = torch.ones(shape, dtype=torch.float16, device=device)
        else:
            t = torch.empty(shape, dtype=torch.float16, device=device).normal_(0.0, 0.02, generator=gen)
        tensors[name] = t.cpu()
        params += t.numel()
    save_file(tensors, str(path), metadata={"format": "pt"})
    return params


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--format", choices=("safetensors", "fake"), default="safetensors")
    args = ap.parse_args()
    print(json.dumps(make(args.model, args.out, args.device, args.format)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
