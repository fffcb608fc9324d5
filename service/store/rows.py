"""From a run's records to the store's Arrow tables, every check made before the database is
touched.

The record format's validity has one definition, `compute.records.validate_records`; this module
adds what only the store can know: the model's shape (heads, neurons, block layers 0..L-1 versus
logit-lens points 0..L), duplicate keys, and complete per-neuron moments. The four
`neurons.vocab_*` records of a neuron become one `neurons` row, classified by
`compute.metrics.neurons.classify` (the one definition of the classes). Every refusal raises
`IngestError` naming the problem.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from compute.errors import SpecError
from compute.metrics.neurons import MOMENTS, classify
from compute.records import LENS_PREFIXES, validate_records
from compute.run import NEURON_TOKENS_SCHEMA, SEQUENCE_MEANS_SCHEMA
from service.store.errors import IngestError

MOMENT_METRICS: tuple[str, ...] = tuple(f"neurons.{m}" for m in MOMENTS)
RESULT_KEY: tuple[str, ...] = ("metric", "layer", "component", "head", "neuron")
TOKEN_KEY: tuple[str, ...] = ("layer", "neuron", "neuron_class", "direction", "rank")
NEURON_CLASSES = ("prediction", "suppression", "partition")
DIRECTIONS = ("promoted", "suppressed")


class AppliedProcessingInfo(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    fold_ln: bool
    center_writing_weights: bool
    center_unembed: bool
    fold_value_biases: bool
    notes: list[str] = []


class ModelInfo(BaseModel):
    """What `LoadedModel.describe()` reports: the numbers a registered model stores."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    architecture: str
    n_layers: int = Field(ge=1)
    d_model: int = Field(ge=1)
    n_heads: int = Field(ge=0)
    d_mlp: int = Field(ge=0)
    d_vocab: int = Field(ge=1)
    d_vocab_real: int = Field(ge=1)
    n_ctx: int = Field(ge=1)
    n_params: int = Field(ge=0)
    normalization_type: str | None
    parallel_attn_mlp: bool
    processing: AppliedProcessingInfo
    # Experts per MLP layer (1: dense). A neuron is one hidden unit of one expert.
    n_experts: int = Field(default=1, ge=1)
    # The parity report measured at load (compute.models.parity); None where not measured.
    parity: dict[str, Any] | None = None
    # Each block's token mixer ("attention", "Mamba", ...; None: none) and MLP ("dense",
    # "experts"; None: none), and the families refused on the architecture with the reason
    # (`LoadedModel.describe`); absent from models described before they were reported.
    blocks: list[dict[str, str | None]] | None = None
    refused_families: dict[str, str] = {}

    @property
    def n_neurons(self) -> int:
        return self.d_mlp * self.n_experts


def parse_model_info(raw: object) -> ModelInfo:
    try:
        return ModelInfo.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise IngestError(f"model information is malformed: {where}: {first['msg']}") from None


@dataclass(frozen=True)
class PreparedRows:
    """The rows of one run, ready for `INSERT ... SELECT` (no run_id yet)."""

    results: pa.Table
    neurons: pa.Table
    neuron_tokens: pa.Table
    n_records: int
    sequence_means: pa.Table = field(default_factory=SEQUENCE_MEANS_SCHEMA.empty_table)


def relative_depth(
    layer: pa.ChunkedArray | pa.Array, lens: pa.ChunkedArray | pa.Array | bool, n_layers: int
) -> pa.Array:
    """l/(L-1) for block metrics, i/L for logit-lens points (docs/metrics.md: depth); null layer ->
    null."""
    layers = pc.cast(layer, pa.float64())
    block = pc.divide(layers, float(max(n_layers - 1, 1)))
    if isinstance(lens, bool):
        return pc.divide(layers, float(n_layers)) if lens else block
    return pc.if_else(lens, pc.divide(layers, float(n_layers)), block)


def prepare_rows(
    records: pa.Table,
    neuron_tokens: pa.Table | None,
    info: ModelInfo,
    sequence_means: pa.Table | None = None,
) -> PreparedRows:
    """Check a run's records, top tokens and per-sequence means against the format and the
    model; split and shape them for the store. Raises `IngestError` naming the first problem."""
    try:
        table = validate_records(records, n_layers=info.n_layers)
    except SpecError as exc:
        raise IngestError(f"records refused: {exc}") from None
    _check_shape(table, info)
    is_moment = pc.is_in(table.column("metric"), pa.array(MOMENT_METRICS))
    results = _result_rows(table.filter(pc.invert(is_moment)), info)
    neurons, present = _neuron_rows(table.filter(is_moment), info)
    tokens = _token_rows(neuron_tokens, info, present)
    means = _sequence_mean_rows(sequence_means, results)
    return PreparedRows(results, neurons, tokens, table.num_rows, means)


def _first(table: pa.Table, mask: pa.ChunkedArray | pa.Array) -> dict[str, object]:
    return table.filter(mask).slice(0, 1).to_pylist()[0]


def _lens_points(metric: pa.ChunkedArray) -> pa.ChunkedArray:
    """Rows indexed by residual point 0..L (`compute.records.LENS_PREFIXES`), not by block."""
    first, *rest = (pc.starts_with(metric, prefix) for prefix in LENS_PREFIXES)
    for other in rest:
        first = pc.or_(first, other)
    return first


def _check_shape(table: pa.Table, info: ModelInfo) -> None:
    layer, metric = table.column("layer"), table.column("metric")
    lens = _lens_points(metric)
    beyond_blocks = pc.and_(pc.greater(layer, info.n_layers - 1), pc.invert(lens))
    if pc.any(beyond_blocks).as_py():
        row = _first(table, beyond_blocks)
        raise IngestError(
            f"layer out of range: {row['metric']} has layer {row['layer']} but the model has "
            f"{info.n_layers} layers (blocks 0..{info.n_layers - 1}; lens points "
            f"0..{info.n_layers})"
        )
    for column, size, what in (
        ("head", info.n_heads, "heads"),
        ("neuron", info.n_neurons, "neurons"),
    ):
        values = table.column(column)
        outside = pc.or_(pc.less(values, 0), pc.greater_equal(values, size))
        if pc.any(outside).as_py():
            row = _first(table, outside)
            raise IngestError(
                f"{column} out of range: {row['metric']} layer {row['layer']} has "
                f"{column} {row[column]} but the model has {size} {what} per layer"
            )


def _result_rows(table: pa.Table, info: ModelInfo) -> pa.Table:
    frame = pl.DataFrame(table.select(RESULT_KEY))
    duplicated = frame.is_duplicated()
    if duplicated.any():
        row = frame.filter(duplicated).row(0, named=True)
        key = ", ".join(f"{k}={row[k]}" for k in RESULT_KEY if row[k] is not None)
        raise IngestError(f"duplicate records: {key} appears more than once")
    lens = _lens_points(table.column("metric"))
    table = table.append_column(
        "relative_depth", relative_depth(table.column("layer"), lens, info.n_layers)
    )
    # Sorted so that a run's rows of one metric sit together: zone maps skip the rest.
    return table.sort_by(
        [
            ("metric", "ascending"),
            ("component", "ascending"),
            ("layer", "ascending"),
            ("head", "ascending"),
        ]
    )


def _neuron_rows(table: pa.Table, info: ModelInfo) -> tuple[pa.Table, np.ndarray]:
    """One row per neuron from its four moment records; also the mask of neurons present."""
    slots = info.n_layers * info.n_neurons
    if table.num_rows == 0:
        return _neurons_table({}, info), np.zeros(slots, dtype=bool)
    for column in ("layer", "neuron"):
        if table.column(column).null_count:
            row = _first(table, pc.is_null(table.column(column)))
            raise IngestError(
                f"{row['metric']} records need a layer and a neuron; one has "
                f"layer={row['layer']} neuron={row['neuron']}"
            )
    code = pc.index_in(table.column("metric"), pa.array(MOMENT_METRICS)).to_numpy()
    neuron_index = (
        table.column("layer").to_numpy().astype(np.int64) * info.n_neurons
        + table.column("neuron").to_numpy()
    )
    slot = neuron_index * len(MOMENTS) + code
    counts = np.bincount(slot, minlength=slots * len(MOMENTS)).reshape(slots, len(MOMENTS))
    if (counts > 1).any():
        i, m = np.argwhere(counts > 1)[0]
        raise IngestError(
            f"duplicate records: {MOMENT_METRICS[m]} of layer {i // info.n_neurons} "
            f"neuron {i % info.n_neurons} appears {counts[i, m]} times"
        )
    per_neuron = counts.sum(axis=1)
    partial = (per_neuron > 0) & (per_neuron < len(MOMENTS))
    if partial.any():
        i = int(np.argmax(partial))
        missing = [MOMENT_METRICS[m] for m in range(len(MOMENTS)) if counts[i, m] == 0]
        raise IngestError(
            f"incomplete neuron: layer {i // info.n_neurons} neuron {i % info.n_neurons} "
            f"lacks {', '.join(missing)}"
        )
    present = per_neuron == len(MOMENTS)
    values = np.empty(slots * len(MOMENTS))
    values[slot] = table.column("value").to_numpy()
    n = np.zeros(slots * len(MOMENTS), dtype=np.int64)
    n[slot] = table.column("n").to_numpy()
    values, n = values.reshape(slots, -1)[present], n.reshape(slots, -1)[present]
    if (n != n[:, :1]).any():
        i = int(np.flatnonzero(present)[np.argmax((n != n[:, :1]).any(axis=1))])
        raise IngestError(
            f"the moments of layer {i // info.n_neurons} neuron {i % info.n_neurons} "
            "have different n"
        )
    index = np.flatnonzero(present)
    columns = {
        "layer": index // info.n_neurons,
        "neuron": index % info.n_neurons,
        **{m: values[:, k] for k, m in enumerate(MOMENTS)},
        "n": n[:, 0],
    }
    return _neurons_table(columns, info), present


def _neurons_table(columns: dict[str, np.ndarray], info: ModelInfo) -> pa.Table:
    if not columns:
        columns = {
            "layer": np.zeros(0, np.int64),
            "neuron": np.zeros(0, np.int64),
            **{m: np.zeros(0) for m in MOMENTS},
            "n": np.zeros(0, np.int64),
        }
    moments = torch.from_numpy(np.stack([columns[m] for m in MOMENTS]))
    classes = {name: mask.numpy() for name, mask in classify(moments).items()}
    layer = pa.array(columns["layer"].astype(np.int32))
    return pa.table(
        {
            "layer": layer,
            "neuron": pa.array(columns["neuron"].astype(np.int32)),
            **{m: pa.array(columns[m], pa.float64()) for m in MOMENTS},
            "n": pa.array(columns["n"], pa.int64()),
            **{name: pa.array(classes[name], pa.bool_()) for name in NEURON_CLASSES},
            "relative_depth": relative_depth(layer, False, info.n_layers),
        }
    )


def _conformed(table: pa.Table | None, schema: pa.Schema, what: str) -> pa.Table:
    """A side table in `schema`'s columns and types (empty when absent); `IngestError` naming
    `what` for a missing column or a type that does not cast safely."""
    if table is None:
        return schema.empty_table()
    missing = [c for c in schema.names if c not in table.column_names]
    if missing:
        raise IngestError(f"{what} are missing columns: {', '.join(missing)}")
    try:
        return table.select(schema.names).cast(schema, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
        raise IngestError(f"{what} have wrong column types: {exc}") from None


def _token_rows(table: pa.Table | None, info: ModelInfo, present: np.ndarray) -> pa.Table:
    table = _conformed(table, NEURON_TOKENS_SCHEMA, "neuron tokens")
    if table.num_rows == 0:
        return table
    for name in table.column_names:
        if table.column(name).null_count:
            raise IngestError(f"neuron tokens: column {name!r} has null values")
    if not pc.all(pc.is_finite(table.column("cosine"))).as_py():
        raise IngestError("neuron tokens: column 'cosine' has NaN or infinite values")
    for name, allowed in (("neuron_class", NEURON_CLASSES), ("direction", DIRECTIONS)):
        unknown = set(pc.unique(table.column(name)).to_pylist()) - set(allowed)
        if unknown:
            raise IngestError(
                f"neuron tokens: unknown {name} {sorted(unknown)}; "
                f"expected one of {', '.join(allowed)}"
            )
    for name, low, high in (
        ("layer", 0, info.n_layers),
        ("neuron", 0, info.n_neurons),
        ("token_id", 0, info.d_vocab),
        ("rank", 0, None),
    ):
        lo, hi = pc.min(table.column(name)).as_py(), pc.max(table.column(name)).as_py()
        if lo < low or (high is not None and hi >= high):
            raise IngestError(
                f"neuron tokens: {name} out of range ({lo}..{hi}; the model allows "
                f"{low}..{'' if high is None else high - 1})"
            )
    index = (
        table.column("layer").to_numpy().astype(np.int64) * info.n_neurons
        + table.column("neuron").to_numpy()
    )
    orphan = ~present[index]
    if orphan.any():
        i = int(index[np.argmax(orphan)])
        raise IngestError(
            f"neuron tokens for layer {i // info.n_neurons} neuron {i % info.n_neurons}, "
            "which has no neurons.vocab_* records"
        )
    frame = pl.DataFrame(table.select(TOKEN_KEY))
    duplicated = frame.is_duplicated()
    if duplicated.any():
        row = frame.filter(duplicated).row(0, named=True)
        raise IngestError(
            "duplicate neuron tokens: " + ", ".join(f"{k}={row[k]}" for k in TOKEN_KEY)
        )
    return table.sort_by([("layer", "ascending"), ("neuron", "ascending")])


SEQUENCE_KEY: tuple[str, ...] = ("metric", "layer", "component", "head")


def _sequence_mean_rows(table: pa.Table | None, results: pa.Table) -> pa.Table:
    """Per-sequence means, checked: the schema, no nulls where required, finite values,
    sequences >= 0, no key twice, and each (metric, layer, component, head) a per-layer mean
    among the records whose n is its number of sequences (docs/metrics.md: uncertainty)."""
    table = _conformed(table, SEQUENCE_MEANS_SCHEMA, "per-sequence means")
    if table.num_rows == 0:
        return table
    for name in ("metric", "sequence", "value"):
        if table.column(name).null_count:
            raise IngestError(f"per-sequence means: column {name!r} has null values")
    if not pc.all(pc.is_finite(table.column("value"))).as_py():
        raise IngestError("per-sequence means: column 'value' has NaN or infinite values")
    if pc.min(table.column("sequence")).as_py() < 0:
        raise IngestError("per-sequence means: negative sequence index")
    frame = pl.DataFrame(table.select([*SEQUENCE_KEY, "sequence"]))
    duplicated = frame.is_duplicated()
    if duplicated.any():
        row = frame.filter(duplicated).row(0, named=True)
        raise IngestError(
            "duplicate per-sequence means: "
            + ", ".join(f"{k}={row[k]}" for k in (*SEQUENCE_KEY, "sequence") if row[k] is not None)
        )
    counts = frame.group_by(SEQUENCE_KEY).len("sequences")
    records = pl.DataFrame(results.select([*SEQUENCE_KEY, "n"]))
    joined = counts.join(records, on=list(SEQUENCE_KEY), how="left", nulls_equal=True)
    orphan = joined.filter(pl.col("n").is_null())
    if orphan.height:
        row = orphan.row(0, named=True)
        raise IngestError(
            "per-sequence means of a mean that is not among the records: "
            + ", ".join(f"{k}={row[k]}" for k in SEQUENCE_KEY if row[k] is not None)
        )
    wrong = joined.filter(pl.col("n") != pl.col("sequences"))
    if wrong.height:
        row = wrong.row(0, named=True)
        key = ", ".join(f"{k}={row[k]}" for k in SEQUENCE_KEY if row[k] is not None)
        raise IngestError(
            f"per-sequence means of {key}: {row['sequences']} sequences, but the "
            f"record says n={row['n']}"
        )
    return table.sort_by(
        [
            ("metric", "ascending"),
            ("component", "ascending"),
            ("layer", "ascending"),
            ("sequence", "ascending"),
        ]
    )
