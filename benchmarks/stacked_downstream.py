"""Whether stacking an intervention family's runs that restart at the same block pays: drop,
drop_attn and drop_mlp at block l each run blocks l+1.. and an unembedding on their own
residual; stacked, the three residuals go through those blocks and the comparison as one batch
three times as wide (`BatchContext.compare` takes stacked variants). CPU seconds of both
schedules over every block but the last, in one process, one torch thread, alternating twice,
and the largest difference of their per-token KL (docs/performance.md, "The schedule").

    .venv/bin/python benchmarks/stacked_downstream.py \
        --model ~/.cache/strata/models/SmolLM2-135M-Instruct.Q4_1.gguf --n-sequences 4
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--n-sequences", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()

    import torch

    from compute.metrics.base import EngineOptions
    from compute.metrics.heads_screen import clean_context
    from compute.models import load_model, resolve_model_spec
    from compute.tokens import TokenSpec, load_tokens, resolve_token_spec

    torch.set_num_threads(1)
    lm = load_model(resolve_model_spec(args.model))
    spec = resolve_token_spec(
        TokenSpec(source="builtin", n_sequences=args.n_sequences, seq_len=args.seq_len))
    tokens = load_tokens(spec, lm.tokenizer, bos_token_id=lm.bos_token_id,
                         d_vocab=lm.d_vocab_real, n_ctx=lm.n_ctx)
    with torch.inference_mode():
        ctx = clean_context(lm, tokens, EngineOptions())

        def starts(layer: int) -> list[torch.Tensor]:
            pre = ctx.resid[layer]
            attn = ctx.attn_out[layer]
            assert attn is not None, "a block with attention and an MLP"
            return [pre, pre + lm.run_mlp(layer, pre), pre + attn]

        def one_by_one() -> torch.Tensor:
            return torch.cat([ctx.compare(ctx.run_from(layer + 1, s), "drop").kl
                              for layer in range(lm.n_layers - 1) for s in starts(layer)])

        def stacked() -> torch.Tensor:
            return torch.cat([ctx.compare(ctx.run_from(layer + 1, torch.cat(starts(layer))),
                                          "drop").kl for layer in range(lm.n_layers - 1)])

        seconds: dict[str, list[float]] = {"one by one": [], "stacked": []}
        out: dict[str, torch.Tensor] = {}
        for _ in range(2):
            for name, schedule in (("one by one", one_by_one), ("stacked", stacked)):
                began = time.process_time()
                out[name] = schedule()
                seconds[name].append(round(time.process_time() - began, 2))
    print(json.dumps({
        "model": lm.spec.name, "n_sequences": args.n_sequences, "seq_len": args.seq_len,
        "cpu_s": seconds,
        "max_abs_kl_difference": float((out["one by one"] - out["stacked"]).abs().max()),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }))


if __name__ == "__main__":
    main()
