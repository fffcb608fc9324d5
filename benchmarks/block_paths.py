"""The two block paths against each other: Strata's fused blocks (`compute/blocks.py`) and the
bridge's (the model's own Hugging Face modules through TransformerLens 4's hooks), on the
architectures both run, each a whole `strata compute` process of the default families.

    .venv/bin/python benchmarks/block_paths.py                       # gpt2-6l-256, smollm2-6l
    .venv/bin/python benchmarks/block_paths.py --n-sequences 8 --seq-len 128

Geometries (random weights, saved as Hugging Face checkpoints under build/block_paths/):
  gpt2-6l-256   GPT-2, 6 layers, d_model 256, 4 heads, d_mlp 1024, vocabulary 4,096
  smollm2-6l    SmolLM2-135M's blocks (Llama: d_model 576, 9 query heads over 3 key/value heads,
                SiLU-gated d_mlp 1536, RMSNorm, rotary), 6 of its 30 layers, vocabulary 49,152
Each path runs in a fresh process (`compute.run.compute_run`, what `strata compute` calls, on the
built-in corpus, the path forced after the load); wall_s is the whole process, sweep_s the
run's parts after the load (`timings_s`), and the ratio is the bridge's throughput over the fused
path's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = "intervention,logit_lens,neurons,similarity,attention,norms,heads"


def build(name: str, path: Path) -> None:
    import torch
    import transformers

    from compute.zoo.architectures import word_level_tokenizer

    if (path / "config.json").is_file():
        return
    torch.manual_seed(0)
    if name == "gpt2-6l-256":
        config = transformers.GPT2Config(n_layer=6, n_embd=256, n_head=4, n_inner=1024,
                                         vocab_size=4096, n_positions=1024)
        model = transformers.GPT2LMHeadModel(config)
        vocab = 4096
    else:
        config = transformers.LlamaConfig(num_hidden_layers=6, hidden_size=576,
                                          num_attention_heads=9, num_key_value_heads=3,
                                          intermediate_size=1536, vocab_size=49152,
                                          max_position_embeddings=2048, tie_word_embeddings=True)
        model = transformers.LlamaForCausalLM(config)
        vocab = 49152
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(path)
    word_level_tokenizer(vocab).save_pretrained(path)


def child(path: str, block_path: str, n: int, t: int) -> None:
    """One whole process: load, force the path, run the families, print the timings."""
    from compute.metrics.base import EngineOptions
    from compute.models import load_model, resolve_model_spec
    from compute.run import RunConfig, compute_run
    from compute.tokens import TokenSpec

    spec = resolve_model_spec(path)
    lm = load_model(spec)
    lm._ctx["fast_path"] = block_path == "fast"
    config = RunConfig(model=spec, tokens=TokenSpec(source="builtin", n_sequences=n, seq_len=t),
                       families=tuple(FAMILIES.split(",")), options=EngineOptions())
    result = compute_run(config, lm=lm)
    print(json.dumps(result.timings_s))


def run(path: Path, block_path: str, n: int, t: int) -> dict[str, float]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(path), block_path, str(n), str(t)],
        check=True, env=env, cwd=ROOT, capture_output=True, text=True,
    )
    wall = time.perf_counter() - start
    timings = json.loads(done.stdout.strip().splitlines()[-1])
    sweep = sum(v for k, v in timings.items() if k != "load")
    return {"wall_s": wall, "sweep_s": sweep, "load_s": timings.get("load", float("nan"))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--geometries", default="gpt2-6l-256,smollm2-6l")
    parser.add_argument("--n-sequences", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", nargs=4, metavar=("PATH", "BLOCK_PATH", "N", "T"))
    args = parser.parse_args()
    if args.child:
        path, block_path, n, t = args.child
        child(path, block_path, int(n), int(t))
        return
    rows = []
    for name in args.geometries.split(","):
        path = ROOT / "build" / "block_paths" / name
        build(name, path)
        fast = run(path, "fast", args.n_sequences, args.seq_len)
        bridge = run(path, "bridge", args.n_sequences, args.seq_len)
        row = {"geometry": name, "fast": fast, "bridge": bridge,
               "throughput_ratio_sweep": fast["sweep_s"] / bridge["sweep_s"],
               "throughput_ratio_wall": fast["wall_s"] / bridge["wall_s"]}
        rows.append(row)
        print(f"{name:14s} fast sweep {fast['sweep_s']:7.1f} s wall {fast['wall_s']:7.1f} s | "
              f"bridge sweep {bridge['sweep_s']:7.1f} s wall {bridge['wall_s']:7.1f} s | "
              f"bridge/fast throughput {row['throughput_ratio_sweep']:.2f} (sweep) "
              f"{row['throughput_ratio_wall']:.2f} (whole process)", flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
