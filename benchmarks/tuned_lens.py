"""The tuned lens's cost at a real geometry: training (tokens/s, wall time at the chosen budget,
peak memory) and its evaluation's share of a run.

    .venv/bin/python benchmarks/tuned_lens.py                          # SmolLM2-135M's geometry
    .venv/bin/python benchmarks/tuned_lens.py --steps 20 --out build/tuned_lens.json
    .venv/bin/python benchmarks/tuned_lens.py --geometry gpt2-6l-256 --steps 5   # a quick check

The model is the geometry's random-weight checkpoint of `benchmarks/geometry.py` (timing does
not depend on the weights), loaded as a user's checkpoint is. Training runs
`compute.lens.training.train_translators` (what a run calls) for `--steps` steps of the default
budget's shape — `sequences_per_step` sequences of `--seq-len` tokens drawn from
`train_sequences` seeded random sequences — and the wall time at the default budget (250 steps)
is extrapolated from the measured per-step time (every step does the same work). Peak memory is
the process's ru_maxrss after training, beside the weights' bytes. The evaluation's share: one
sweep of `tuned_lens` (with an identity lens: the same arithmetic as a trained one) against one of
the default run's families, on `--n-sequences` x `--seq-len` tokens (the default run's 32 x 128),
each in this process.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--geometry", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=10, help="steps measured (then extrapolated)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--n-sequences", type=int, default=32, help="evaluation tokens")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--no-default-run", action="store_true",
                        help="skip the default run's sweep (minutes at SmolLM2's size)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    import torch

    from benchmarks.geometry import build_checkpoint
    from compute.engine import sweep
    from compute.lens.config import LensTraining
    from compute.lens.training import train_translators
    from compute.lens.translators import BASIS_STRATA, LensInfo, TunedLens
    from compute.metrics import DEFAULT_FAMILIES
    from compute.models import load_model, resolve_model_spec

    lm = load_model(resolve_model_spec(str(build_checkpoint(args.geometry)), dtype=args.dtype),
                    args.device)
    budget = LensTraining()
    gen = torch.Generator().manual_seed(0)
    train = torch.randint(1, lm.d_vocab, (budget.train_sequences, args.seq_len), generator=gen)
    train[:, 0] = lm.bos_token_id
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    measured = budget.model_copy(update={"steps": args.steps})
    _, _, report = train_translators(lm, train, measured)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    per_step = report["wall_s"] / args.steps
    result: dict[str, object] = {
        "geometry": args.geometry, "device": args.device, "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "n_layers": lm.n_layers, "d_model": lm.d_model, "d_vocab": lm.d_vocab,
        "train": {
            "steps_measured": args.steps,
            "tokens_per_step": report["tokens_per_step"],
            "tokens_per_s": report["tokens_per_s"],
            "s_per_step": round(per_step, 3),
            "default_budget_steps": budget.steps,
            "default_budget_tokens_seen": budget.steps * report["tokens_per_step"],
            "default_budget_wall_s": round(per_step * budget.steps, 1),
            "peak_rss_mb": round(peak, 1),
            "rss_before_training_mb": round(rss_before, 1),
            "weights_mb": round(lm.n_params * lm.dtype_bytes / 2**20, 1),
            "translators_mb": round(lm.n_layers * lm.d_model * (lm.d_model + 1) * 4 / 2**20, 1),
        },
    }
    tokens = torch.randint(1, lm.d_vocab, (args.n_sequences, args.seq_len), generator=gen)
    tokens[:, 0] = lm.bos_token_id
    info = LensInfo("0" * 16, lm.n_layers, lm.d_model, BASIS_STRATA)
    timings: dict[str, float] = {}
    families = [["tuned_lens"], ["logit_lens"]]
    if not args.no_default_run:
        families.append(list(DEFAULT_FAMILIES))
    with lm.using_lens(TunedLens.identity(info)):
        for names in families:
            start = time.perf_counter()
            sweep(lm, tokens, names)
            timings["+".join(names) if len(names) == 1 else "default run"] = round(
                time.perf_counter() - start, 2)
    evaluation: dict[str, object] = {"sweep_s": timings,
                                     "tokens": args.n_sequences * (args.seq_len - 2)}
    if "default run" in timings:
        total = timings["default run"] + timings["tuned_lens"]
        evaluation["share_of_run_with_tuned_lens"] = round(timings["tuned_lens"] / total, 4)
    result["evaluate"] = evaluation
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
