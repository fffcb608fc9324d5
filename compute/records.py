"""The record format of docs/metrics.md: one Arrow schema, its catalog of names, and validation.

Every family yields `Record`s; a run's records become one Arrow table with `RECORD_SCHEMA`, the
same in Parquet, Arrow, CSV and JSON exports and in the API.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import astuple, dataclass
from typing import Any

import pyarrow as pa

from compute.errors import ComputeError, SpecError

RECORD_SCHEMA = pa.schema(
    [
        pa.field("metric", pa.string(), nullable=False),
        pa.field("layer", pa.int32()),
        pa.field("component", pa.string()),
        pa.field("head", pa.int32()),
        pa.field("neuron", pa.int32()),
        pa.field("value", pa.float64(), nullable=False),
        pa.field("stderr", pa.float64()),
        pa.field("n", pa.int64(), nullable=False),
        pa.field("unit", pa.string(), nullable=False),
    ]
)
RECORD_COLUMNS = tuple(RECORD_SCHEMA.names)

# The catalog: every metric name with its unit. Names with a parameter are patterns.
# Every name and unit is defined in docs/metrics.md (a unit test checks the two agree).
CATALOG: dict[str, str] = {
    **{
        f"intervention.{m}": u
        for m, u in [
            ("kl", "nats"),
            ("top1_agreement", "fraction"),
            ("entropy", "bits"),
            ("entropy_delta", "bits"),
            ("loss", "nats"),
            ("loss_delta", "nats"),
            ("accuracy", "fraction"),
            ("swap_minus_drop_kl", "nats"),
            ("swap_minus_drop_top1", "fraction"),
        ]
    },
    **{
        f"logit_lens.{m}": u
        for m, u in [
            ("kl_to_final", "nats"),
            ("entropy", "bits"),
            ("top1_agreement", "fraction"),
            ("loss", "nats"),
        ]
    },
    **{
        f"tuned_lens.{m}": u
        for m, u in [
            ("kl_to_final", "nats"),
            ("entropy", "bits"),
            ("top1_agreement", "fraction"),
            ("loss", "nats"),
        ]
    },
    **{
        f"neurons.{m}": u
        for m, u in [
            ("vocab_mean", "cosine"),
            ("vocab_var", "cosine^2"),
            ("vocab_skew", "ratio"),
            ("vocab_kurt", "ratio"),
            ("n_prediction", "count"),
            ("n_suppression", "count"),
            ("n_partition", "count"),
            ("frac_prediction", "fraction"),
            ("frac_suppression", "fraction"),
            ("frac_partition", "fraction"),
            ("n_prediction_cal", "count"),
            ("n_suppression_cal", "count"),
            ("n_partition_cal", "count"),
            ("frac_prediction_cal", "fraction"),
            ("frac_suppression_cal", "fraction"),
            ("frac_partition_cal", "fraction"),
            ("null_kurt_q999", "ratio"),
            ("null_skew_q999", "ratio"),
            ("null_var_q999", "cosine^2"),
        ]
    },
    "heads_atp.loss_delta": "nats",
    "heads_screen.loss_delta": "nats",
    "heads_screen.ablation_loss_delta": "nats",
    "heads_screen.ablation_kl": "nats",
    "pruning.block_influence": "cosine_distance",
    **{f"similarity.{m}": "cosine" for m in ("self", "index", "adjacent")},
    **{f"attention.{m}": u for m, u in [("bos", "fraction"), ("entropy", "bits")]},
    **{
        f"norms.{m}": u
        for m, u in [
            ("attn_out", "norm"),
            ("mlp_out", "norm"),
            ("attn_mlp_ratio", "ratio"),
            ("resid", "norm"),
        ]
    },
    **{
        f"heads.{m}": u
        for m, u in [
            ("ablation_kl", "nats"),
            ("ablation_loss_delta", "nats"),
            ("induction", "fraction"),
            ("stability", "cosine"),
            ("stability_null", "cosine"),
            ("stability_std", "cosine"),
            ("stability_null_std", "cosine"),
            ("stability_greedy", "cosine"),
            ("stability_greedy_std", "cosine"),
            ("stability_null_greedy", "cosine"),
            ("stability_null_greedy_std", "cosine"),
            ("peer_similarity", "cosine"),
        ]
    },
}
PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"attention\.prev_[1-9]\d*"), "fraction"),
    (re.compile(r"attention\.prev_[1-9]\d*_mean"), "fraction"),
    (re.compile(r"heads\.residual_cka(_null)?\.(linear|rbf)"), "cka"),
    (re.compile(r"stages\.boundary_[123]"), "relative_depth"),
    # the pruning predictors and measured n-block drops: <n> is the width in blocks
    (re.compile(r"pruning\.angular_distance(_last)?_[1-9]\d*"), "pi_radians"),
    (re.compile(r"pruning_drops\.(kl|loss|loss_delta)_[1-9]\d*"), "nats"),
    (re.compile(r"pruning_drops\.(entropy|entropy_delta)_[1-9]\d*"), "bits"),
    (re.compile(r"pruning_drops\.(top1_agreement|accuracy)_[1-9]\d*"), "fraction"),
    (
        re.compile(
            r"pruning_drops\.spearman_(block_influence|angular_distance|angular_distance_last)"
            r"_[1-9]\d*(_low|_high)?"
        ),
        "rank_correlation",
    ),
]
# Families indexed by residual point i = 0..L (0 = embeddings, i = output of block i-1), not by
# block: their `layer` runs to L and their relative depth is i / L.
LENS_PREFIXES = ("logit_lens.", "tuned_lens.")
COMPONENTS = frozenset(
    {"drop", "swap", "drop_attn", "drop_mlp", "none", "attn", "mlp", "swap-drop"}
)


def unit_of(metric: str) -> str | None:
    """The catalog unit of a metric name, or None if the name is unknown."""
    if metric in CATALOG:
        return CATALOG[metric]
    for pattern, unit in PATTERNS:
        if pattern.fullmatch(metric):
            return unit
    return None


@dataclass(frozen=True)
class Record:
    metric: str
    layer: int | None
    component: str | None
    head: int | None
    neuron: int | None
    value: float
    stderr: float | None
    n: int
    unit: str

    @classmethod
    def of(
        cls,
        metric: str,
        value: float,
        n: int,
        *,
        layer: int | None = None,
        component: str | None = None,
        head: int | None = None,
        neuron: int | None = None,
        stderr: float | None = None,
    ) -> Record:
        """A record whose unit is taken from the catalog (so it cannot disagree with it)."""
        unit = unit_of(metric)
        if unit is None:
            raise ComputeError(f"metric {metric!r} is not in the catalog")
        if not math.isfinite(value):
            raise ComputeError(f"{metric} layer={layer} head={head} is {value}; refusing to store")
        return cls(
            metric,
            layer,
            component,
            head,
            neuron,
            float(value),
            None if stderr is None else float(stderr),
            int(n),
            unit,
        )


def records_to_table(records: Iterable[Record]) -> pa.Table:
    rows = [astuple(r) for r in records]
    columns: list[tuple[Any, ...]] = (
        list(zip(*rows, strict=True)) if rows else [() for _ in RECORD_COLUMNS]
    )
    return pa.table(
        {
            name: pa.array(col, type=RECORD_SCHEMA.field(name).type)
            for name, col in zip(RECORD_COLUMNS, columns, strict=True)
        },
        schema=RECORD_SCHEMA,
    )


def validate_records(table: pa.Table, *, n_layers: int | None = None) -> pa.Table:
    """Check a table against the record format; return it cast to `RECORD_SCHEMA`.

    Raises `SpecError` naming the first problem: missing columns, wrong types, nulls where a value
    is required, NaN or infinite values, unknown metric names or units, layers outside the model.
    """
    import pyarrow.compute as pc

    missing = [c for c in RECORD_COLUMNS if c not in table.column_names]
    if missing:
        raise SpecError(f"records are missing columns: {', '.join(missing)}")
    try:
        table = table.select(list(RECORD_COLUMNS)).cast(RECORD_SCHEMA, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
        raise SpecError(f"records have wrong column types: {exc}") from exc
    for name in ("metric", "value", "n", "unit"):
        if table.column(name).null_count:
            raise SpecError(f"column {name!r} has null values")
    for name in ("value", "stderr"):
        col = table.column(name)
        bad = pc.sum(pc.invert(pc.is_finite(col.fill_null(0.0)))).as_py() or 0
        if bad:
            raise SpecError(f"column {name!r} has {bad} NaN or infinite values")
    pairs = pc.unique(
        pc.binary_join_element_wise(table.column("metric"), table.column("unit"), "\x00")
    ).to_pylist()
    for pair in pairs:
        metric, unit = pair.split("\x00")
        expected = unit_of(metric)
        if expected is None:
            raise SpecError(f"unknown metric name {metric!r} (see docs/metrics.md)")
        if unit != expected:
            raise SpecError(
                f"metric {metric!r} has unit {unit!r}; docs/metrics.md says {expected!r}"
            )
    components = set(pc.unique(table.column("component")).to_pylist()) - {None}
    if components - COMPONENTS:
        raise SpecError(f"unknown component(s): {sorted(components - COMPONENTS)}")
    if n_layers is not None and table.num_rows:
        lo, hi = pc.min(table.column("layer")).as_py(), pc.max(table.column("layer")).as_py()
        # logit-lens points run 0..L, block metrics 0..L-1
        if lo is not None and (lo < 0 or hi > n_layers):
            raise SpecError(f"layer out of range: found {lo}..{hi}, model has {n_layers} layers")
    if table.num_rows and pc.min(table.column("n")).as_py() < 0:
        raise SpecError("column 'n' has negative counts")
    return table
