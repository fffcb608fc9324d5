"""Runs without computing them: variants of a computed run under other configurations, and a
large model's worth of per-neuron moment records with a configuration and model information that
the store accepts."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa

from compute.models import ModelSpec
from compute.records import RECORD_SCHEMA, unit_of
from compute.run import NEURON_TOKENS_SCHEMA, RunConfig, RunResult
from compute.tokens import TokenSpec

MOMENTS = ("vocab_mean", "vocab_var", "vocab_skew", "vocab_kurt")


def synthetic_result(n_layers: int, d_mlp: int, *, name: str = "synthetic", seed: int = 0,
                     scale: float = 1.0, d_vocab: int = 50_000) -> RunResult:
    rng = np.random.default_rng(seed)
    count = n_layers * d_mlp
    moments = np.stack([rng.normal(0, 0.01, count), rng.uniform(0.001, 0.01, count),
                        rng.normal(0, 1, count), 3 + rng.exponential(3, count)]) * scale
    metric = np.repeat(np.array([f"neurons.{m}" for m in MOMENTS]), count)
    layer = np.tile(np.repeat(np.arange(n_layers, dtype=np.int32), d_mlp), len(MOMENTS))
    neuron = np.tile(np.arange(d_mlp, dtype=np.int32), n_layers * len(MOMENTS))
    rows = 4 * count
    records = pa.table({
        "metric": metric, "layer": layer, "component": pa.nulls(rows, pa.string()),
        "head": pa.nulls(rows, pa.int32()), "neuron": neuron, "value": moments.reshape(-1),
        "stderr": pa.nulls(rows, pa.float64()), "n": np.full(rows, d_vocab),
        "unit": np.array([unit_of(m) for m in metric[:: count]]).repeat(count),
    }, schema=RECORD_SCHEMA)
    spec = ModelSpec(source="random", name=name, architecture=dict(n_layers=n_layers,
                                                                    d_mlp=d_mlp))
    config = RunConfig(model=spec, tokens=TokenSpec(source="npy", path="synthetic.npy",
                                                    n_sequences=1, seq_len=3, fingerprint="0"),
                       families=("neurons",))
    info = dict(architecture="synthetic", n_layers=n_layers, d_model=64, n_heads=4, d_mlp=d_mlp,
                d_vocab=d_vocab, d_vocab_real=d_vocab, n_ctx=64, n_params=1,
                normalization_type="LN", parallel_attn_mlp=False,
                processing=dict(fold_ln=True, center_writing_weights=True, center_unembed=True,
                                fold_value_biases=True, notes=[]))
    return RunResult(config=config, config_hash=config.config_hash(), records=records,
                     neuron_tokens=NEURON_TOKENS_SCHEMA.empty_table(), model_info=info,
                     tokens_evaluated=1, device="cpu", wall_s=1.0)


def variant(result: RunResult, *, seed: int | None = None, name: str | None = None,
            metric_version: str | None = None, scale: float = 1.0) -> RunResult:
    """The same rows under another configuration (another induction seed, model name or metric
    version), values optionally scaled: distinct runs without computing again."""
    config = result.config
    if seed is not None:
        config = config.model_copy(update={"options": config.options.model_copy(
            update={"induction_seed": seed})})
    if name is not None:
        config = config.model_copy(update={"model": config.model.model_copy(
            update={"name": name})})
    if metric_version is not None:
        config = config.model_copy(update={"metric_version": metric_version})
    records = result.records
    if scale != 1.0:
        import pyarrow.compute as pc

        index = records.schema.get_field_index("value")
        records = records.set_column(index, "value", pc.multiply(records.column("value"), scale))
    return dataclasses.replace(result, config=config, config_hash=config.config_hash(),
                               records=records)


def old_version_body(version: str) -> bytes:
    """tiny-4l-s0's default run computed under an older metric version (what a store holds after
    METRIC_VERSION is bumped), encoded as `strata compute --out run.arrow` writes it."""
    from compute.models import resolve_model_spec
    from compute.run import compute_run, result_metadata
    from service.exports import FORMATS

    config = RunConfig(model=resolve_model_spec("zoo:tiny-4l-s0"),
                       tokens=TokenSpec(source="builtin", n_sequences=2, seq_len=16),
                       families=("intervention", "logit_lens"), metric_version=version)
    result = compute_run(config)
    result = dataclasses.replace(result, config_hash=result.config.config_hash())
    return FORMATS["arrow"].encode(result.records, result_metadata(result))
