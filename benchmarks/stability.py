"""Stability benchmark: heads.stability + null baseline + residual CKA for a family of refits.

    .venv/bin/python benchmarks/stability.py [--family DIR [DIR ...]] [--refits 10]

With --family, the refits are the checkpoints in the DIRs (e.g. trained by `strata zoo train`);
without, 10 randomly initialised models of the zoo's 4-layer architecture stand in (timing does
not depend on the weights). Prints the wall time of loading, of the activations pass and of the
whole comparison, on the default prompt set (32 prompts x 64 tokens, 3 null models).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from compute.models import ModelSpec, load_model, resolve_model_spec  # noqa: E402
from compute.stability import StabilityOptions, stability_records  # noqa: E402

ARCH = dict(n_layers=4, d_model=128, n_heads=4, d_head=32, d_mlp=512, d_vocab=4096, n_ctx=128,
            act_fn="gelu_new", normalization_type="LN")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--family", nargs="+", default=None, help="folder(s) of refits")
    parser.add_argument("--refits", type=int, default=10)
    args = parser.parse_args()
    opts = StabilityOptions()
    start = time.perf_counter()
    if args.family:
        dirs = sorted(p for folder in args.family for p in Path(folder).iterdir()
                      if (p / "config.json").is_file())
        models = [load_model(resolve_model_spec(str(d))) for d in dirs[: args.refits]]
    else:
        models = [load_model(ModelSpec(source="random", name=f"r{i}", architecture=ARCH, seed=i))
                  for i in range(args.refits)]
    loaded = time.perf_counter()
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(1, models[0].d_vocab, (opts.n_prompts, opts.prompt_len), generator=g)
    prompts[:, 0] = 0
    records = stability_records(models[0], models[1:], prompts, opts, load_model)
    done = time.perf_counter()
    print(f"{len(models)} refits of {models[0].n_layers} layers x {models[0].n_heads} heads, "
          f"{opts.n_prompts} prompts x {opts.prompt_len} tokens, {opts.n_null} null models")
    print(f"load: {loaded - start:.1f} s   stability + null + CKA: {done - loaded:.1f} s   "
          f"total: {done - start:.1f} s   ({len(records)} records)")


if __name__ == "__main__":
    main()
