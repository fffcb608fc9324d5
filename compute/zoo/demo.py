"""The demo zoo model: small, trained in a few CPU minutes, with learned structure to look at.

Trained on the built-in corpus with part of every batch replaced by synthetic repeated random
sequences (`ZooModelConfig.repeat_fraction`), so that previous-token and induction heads form
within the budget; rotary positions (GPT-NeoX, sequential residual) make the previous-token
step cheap. `python -m compute.zoo.demo` trains it (unless it exists), runs every metric family
exactly as `strata compute --model zoo:<name>` does by default (32 sequences x 128 tokens of the
built-in corpus), places the stage boundaries, and prints the summary that docs/controls.md
reports; the summary is also stored in the checkpoint's `strata_zoo.json` under "report".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import polars as pl
import torch

from compute.models import ModelSpec
from compute.zoo.train import ZOO_METADATA_FILE, ZooModelConfig, train_zoo_model

# A 512-token vocabulary (its own BPE, trained on the corpus like the zoo's 4096-token one)
# makes each synthetic token recur often enough for the copying circuit to form in 1500 steps;
# with the zoo's 4096 tokens, or at lr 3e-3, it had not formed by then.
DEMO_CONFIG = ZooModelConfig(
    name="demo-4l",
    n_layers=4,
    d_model=64,
    n_heads=4,
    n_ctx=128,
    vocab_size=512,
    lr=6e-3,
    steps=1500,
    batch_size=32,
    seed=0,
    repeat_fraction=0.5,
    positional="rotary",
)
SUMMARY = (
    "demo: 4 layers, d_model 64, rotary, 512-token BPE; corpus + 50% repeated random "
    "sequences -> learned previous-token and induction heads"
)


def _per_head(df: pl.DataFrame, metric: str) -> list[dict[str, Any]]:
    rows = df.filter((pl.col("metric") == metric) & pl.col("head").is_not_null())
    return [
        {"layer": r["layer"], "head": r["head"], "value": round(r["value"], 4)}
        for r in rows.sort("value", descending=True).iter_rows(named=True)
    ]


def _curve(df: pl.DataFrame, metric: str, component: str | None = None) -> list[float]:
    rows = df.filter(
        (pl.col("metric") == metric) & pl.col("head").is_null() & pl.col("neuron").is_null()
    )
    if component is not None:
        rows = rows.filter(pl.col("component") == component)
    return [round(v, 4) for v in rows.sort("layer")["value"].to_list()]


def report(records: pl.DataFrame, n_layers: int) -> dict[str, Any]:
    """The figures docs/controls.md quotes, from one model's records."""
    from compute.metrics.neurons import KURTOSIS_THRESHOLD
    from compute.stages import infer_stages

    kurt = records.filter(pl.col("metric") == "neurons.vocab_kurt")
    boundaries = infer_stages(records, n_layers)
    return {
        "induction_top": _per_head(records, "heads.induction")[:4],
        "prev_1_top": _per_head(records, "attention.prev_1")[:4],
        "bos_top": _per_head(records, "attention.bos")[:4],
        "neurons_over_kurtosis_threshold": {
            "threshold": KURTOSIS_THRESHOLD,
            "per_layer": [
                int((kurt.filter(pl.col("layer") == layer)["value"] > KURTOSIS_THRESHOLD).sum())
                for layer in range(n_layers)
            ],
            "max_per_layer": [
                round(
                    float(
                        kurt.filter(pl.col("layer") == layer)["value"].fill_null(0.0).max() or 0.0  # type: ignore[arg-type]
                    ),
                    2,
                )
                for layer in range(n_layers)
            ],
        },
        "n_prediction": _curve(records, "neurons.n_prediction"),
        "n_suppression": _curve(records, "neurons.n_suppression"),
        "n_partition": _curve(records, "neurons.n_partition"),
        "drop_kl": _curve(records, "intervention.kl", "drop"),
        "swap_kl": _curve(records, "intervention.kl", "swap"),
        "lens_kl_to_final": _curve(records, "logit_lens.kl_to_final"),
        "stages": [
            {
                "boundary": b.index,
                "layer": b.layer,
                "clear": b.clear,
                "reason": b.evidence.get("reason"),
            }
            for b in boundaries
        ],
    }


def compute_report(name_or_path: str) -> dict[str, Any]:
    """Every family at `strata compute`'s defaults, summarised by `report`."""
    from compute.models import resolve_model_spec
    from compute.run import RunConfig, compute_run
    from compute.tokens import TokenSpec

    config = RunConfig(
        model=resolve_model_spec(name_or_path),
        tokens=TokenSpec(source="builtin", n_sequences=32, seq_len=128, seed=0),
    )
    result = compute_run(config)
    records: pl.DataFrame = pl.from_arrow(result.records)  # type: ignore[assignment]
    return {
        "config_hash": result.config_hash,
        "tokens_evaluated": result.tokens_evaluated,
        **report(records, result.model_info["n_layers"]),
        "on_repeated_sequences": repeated_sequence_figures(config.model),
    }


def repeated_sequence_figures(spec: ModelSpec, n_sequences: int = 8) -> dict[str, Any]:
    """Head ablation on the induction probe (BOS, r_1..r_63, r_1..r_63; seed 0), and the clean
    loss on its first and second halves: what the induction circuit is worth."""
    from compute.engine import sweep
    from compute.metrics.base import EngineOptions
    from compute.models import load_model
    from compute.records import records_to_table
    from compute.tokens import random_repeated_tokens

    lm = load_model(spec)
    n = min(63, (lm.n_ctx - 1) // 2)
    probe = random_repeated_tokens(n_sequences, n, lm.d_vocab_real, lm.bos_token_id, seed=0)
    result = sweep(lm, probe, ["heads"], EngineOptions(induction_sequences=n_sequences))
    records: pl.DataFrame = pl.from_arrow(records_to_table(result.records))  # type: ignore[assignment]
    with torch.inference_mode():
        x = lm.embed(probe)
        for layer in range(lm.n_layers):
            x = lm.run_block(layer, x).resid
        logp = lm.logits(x[:, :-1]).log_softmax(-1)
    nll = -logp.gather(-1, probe[:, 1:, None])[..., 0]
    return {
        "tokens": f"{n_sequences} x (BOS, r_1..r_{n}, r_1..r_{n})",
        "clean_loss_first_half": round(float(nll[:, 1:n].mean()), 3),
        "clean_loss_second_half": round(float(nll[:, n + 1 :].mean()), 3),
        "ablation_loss_delta_top": _per_head(records, "heads.ablation_loss_delta")[:5],
    }


def main() -> None:
    from compute.zoo.paths import ZOO_DIR

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out-dir", type=Path, default=ZOO_DIR, help="where the checkpoint goes (default: the zoo)"
    )
    parser.add_argument("--retrain", action="store_true", help="train even if it exists")
    args = parser.parse_args()
    path = args.out_dir / DEMO_CONFIG.name
    if args.retrain or not (path / "config.json").is_file():
        torch.set_num_threads(1)  # bit-for-bit reproducible: reductions in one fixed order
        train_zoo_model(
            DEMO_CONFIG,
            path,
            progress=lambda s, n, loss: print(
                f"step {s}/{n} loss {loss:.3f}", end="\r", flush=True
            ),
        )
        print()
    figures = compute_report(str(path))
    meta_file = path / ZOO_METADATA_FILE
    meta = json.loads(meta_file.read_text())
    meta.update({"kind": "demo", "summary": SUMMARY, "report": figures})
    meta_file.write_text(json.dumps(meta, indent=2) + "\n")
    print(
        json.dumps(
            {"val_loss": meta["val_loss"], "wall_time_s": meta["wall_time_s"], **figures}, indent=2
        )
    )


if __name__ == "__main__":
    main()
