"""Print the "planted -> found" table of docs/controls.md, measured afresh.

    .venv/bin/python scripts/planted_controls.py

Runs Strata's own computations on the planted controls (`compute/zoo/planted.py`) with the
inputs the tests use: the induction probe (4 x BOS, r_1..r_63, r_1..r_63, seed 0) for the
induction model, 8 prompts x 64 tokens of the built-in corpus for stability (2 null models), and
32 sequences x 128 tokens of the built-in corpus (the `strata compute` default) for
planted-stages. About a minute on a laptop-class CPU.
"""

from __future__ import annotations

import polars as pl
import torch

from compute.engine import sweep
from compute.metrics.base import EngineOptions
from compute.models import LoadedModel, load_model, resolve_model_spec
from compute.records import Record, records_to_table
from compute.stability import StabilityOptions, stability_records
from compute.stages import infer_stages
from compute.tokens import TokenSpec, load_tokens, random_repeated_tokens, resolve_token_spec
from compute.zoo import planted as P


def frame(records: list[Record]) -> pl.DataFrame:
    return pl.from_arrow(records_to_table(records))  # type: ignore[return-value]


def heads(df: pl.DataFrame, metric: str) -> dict[tuple[int, int], float]:
    rows = df.filter((pl.col("metric") == metric) & pl.col("head").is_not_null())
    return {(r["layer"], r["head"]): r["value"] for r in rows.iter_rows(named=True)}


def curve(df: pl.DataFrame, metric: str, component: str | None = None) -> dict[int, float]:
    rows = df.filter((pl.col("metric") == metric) & pl.col("head").is_null()
                     & pl.col("neuron").is_null())
    if component is not None:
        rows = rows.filter(pl.col("component") == component)
    return {r["layer"]: r["value"] for r in rows.iter_rows(named=True)}


def others(values: dict[tuple[int, int], float], *skip: tuple[int, int]) -> float:
    return max(abs(v) for k, v in values.items() if k not in skip)


def corpus(lm: LoadedModel, n: int, t: int) -> torch.Tensor:
    spec = resolve_token_spec(TokenSpec(source="builtin", n_sequences=n, seq_len=t))
    return load_tokens(spec, lm.tokenizer, bos_token_id=lm.bos_token_id, d_vocab=lm.d_vocab,
                       n_ctx=lm.n_ctx)


def main() -> None:
    rows: list[tuple[str, str, str]] = []
    ind = load_model(resolve_model_spec("planted-induction"))
    opts = EngineOptions(induction_sequences=4)
    probe = random_repeated_tokens(4, 63, ind.d_vocab_real, ind.bos_token_id, seed=0)
    df = frame(sweep(ind, probe, ["heads", "attention"], opts).records)
    induction, prev, abl = (heads(df, m) for m in
                            ("heads.induction", "attention.prev_1", "heads.ablation_loss_delta"))
    ih, ph = P.INDUCTION_HEAD, P.PREV_TOKEN_HEAD
    rows += [
        ("induction head L1H2", "heads.induction ~1, others ~0",
         f"{induction[ih]:.3f}; max other {others(induction, ih):.3f}"),
        ("previous-token head L0H1", "attention.prev_1 ~1, others low",
         f"{prev[ph]:.4f}; max other {others(prev, ph):.3f}"),
        ("ablation on repeated sequences", "induction head (and its key source) >> rest",
         f"L1H2 {abl[ih]:+.3f} nats, L0H1 {abl[ph]:+.3f}; max other "
         f"{others(abl, ih, ph):.3f}"),
    ]
    refits = [load_model(resolve_model_spec(f"planted-induction-s{s}")) for s in (1, 2)]
    sdf = frame(stability_records(ind, refits, corpus(ind, 8, 64),
                                  StabilityOptions(n_prompts=8, prompt_len=64, n_null=2),
                                  load_model))
    stab, null = heads(sdf, "heads.stability"), heads(sdf, "heads.stability_null")
    diffuse = [k for k in stab if k not in (ih, ph)]
    rows.append(("refits share the circuit", "heads.stability ~1 there; diffuse ~ null",
                 f"L0H1 {stab[ph]:.3f} (null {null[ph]:.3f}), L1H2 {stab[ih]:.3f} "
                 f"(null {null[ih]:.3f}); diffuse mean {sum(stab[k] for k in diffuse) / 6:.3f} "
                 f"(null {sum(null[k] for k in diffuse) / 6:.3f})"))

    st = load_model(resolve_model_spec("planted-stages"))
    result = sweep(st, corpus(st, 32, 128), ["intervention", "logit_lens", "neurons",
                                             "attention"])
    df = frame(result.records)
    bos = heads(df, "attention.bos")
    rows.append(("sink head L2H1", "attention.bos ~1", f"{bos[P.SINK_HEAD]:.4f}; max other "
                 f"{others(bos, P.SINK_HEAD):.3f}"))
    neurons = df.filter(pl.col("neuron").is_not_null() & pl.col("layer").is_in([3, 5]))
    wide = neurons.pivot(on="metric", index=["layer", "neuron"], values="value")
    for (layer, neuron), strings in {**P.PLANTED_PREDICTION, **P.PLANTED_SUPPRESSION}.items():
        r = wide.filter((pl.col("layer") == layer) & (pl.col("neuron") == neuron)).row(
            0, named=True)
        cls = "prediction" if (layer, neuron) in P.PLANTED_PREDICTION else "suppression"
        direction = "promoted" if cls == "prediction" else "suppressed"
        top = [t.token for t in result.neuron_tokens if (t.layer, t.neuron, t.neuron_class,
               t.direction) == (layer, neuron, cls, direction) and t.rank < len(strings)]
        rows.append((f"{cls} neuron {layer}/{neuron} ({', '.join(map(repr, strings))})",
                     f"kurt > 10, skew {'>' if cls == 'prediction' else '<'} 0; top {direction}"
                     " = planted", f"kurt {r['neurons.vocab_kurt']:.1f}, skew "
                     f"{r['neurons.vocab_skew']:+.2f}, var {r['neurons.vocab_var']:.4f}; top "
                     f"{direction} {', '.join(map(repr, top))}"))
    for layer, neuron in P.PLANTED_PARTITION:
        r = wide.filter((pl.col("layer") == layer) & (pl.col("neuron") == neuron)).row(
            0, named=True)
        rows.append((f"partition neuron {layer}/{neuron}", "var > 0.005, kurt < 10",
                     f"var {r['neurons.vocab_var']:.4f}, kurt {r['neurons.vocab_kurt']:.2f}"))
    counts = {c: curve(df, f"neurons.n_{c}") for c in ("prediction", "suppression", "partition")}
    rows.append(("no other neuron classified", "counts per layer = planted",
                 "; ".join(f"{c} {[int(v) for v in counts[c].values()]}" for c in counts)))
    drop, swap = curve(df, "intervention.kl", "drop"), curve(df, "intervention.kl", "swap")
    rows.append(("identity layer 4", "drop KL 0 at 4; swap KL 0 for (3,4), (4,5); others > 0",
                 "drop " + ", ".join(f"{v:.3g}" for v in drop.values()) + "; swap "
                 + ", ".join(f"{v:.3g}" for v in swap.values())))
    b1, b2, b3 = infer_stages(df, P.STAGES_LAYERS)
    lens = curve(df, "logit_lens.kl_to_final")
    rows += [
        ("catastrophic layers 0-1", "stages.boundary_1 = layer 2", f"layer {b1.layer}"),
        ("prediction written at layer 3", "stages.boundary_2 = layer 3",
         f"layer {b2.layer} (lens KL " + ", ".join(f"{v:.2f}" for v in lens.values()) + ")"),
        ("suppression dominates from layer 5", "stages.boundary_3 = layer 5",
         f"layer {b3.layer}"),
    ]
    print("| planted | expected | found |\n|---|---|---|")
    for planted, expected, found in rows:
        print(f"| {planted} | {expected} | {found} |")


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
