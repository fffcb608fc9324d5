"""Query parameters shared by several endpoints."""

from __future__ import annotations

from typing import Annotated

from litestar.params import Parameter

from service.api.formats import FormatName

Format = Annotated[
    FormatName | None,
    Parameter(
        query="format", description="json (default), csv, parquet or arrow; overrides Accept"
    ),
]
ModelId = Annotated[
    int | None,
    Parameter(
        query="model_id",
        ge=0,
        description="pick one registration of a name registered several "
        "times (other processing or revision); default: latest",
    ),
]
RunId = Annotated[
    int | None,
    Parameter(
        query="run_id",
        ge=0,
        description="read this run of the model; default: its canonical run for the metric's "
        "family (the run pinned for it, else its default configuration's run; docs/api.md)",
    ),
]
MetricVersion = Annotated[
    str | None,
    Parameter(
        query="metric_version",
        max_length=64,
        description="choose the canonical run under this metric version (default: the current one)",
    ),
]
LayerMin = Annotated[int | None, Parameter(query="layer_min", ge=0, le=100_000)]
LayerMax = Annotated[int | None, Parameter(query="layer_max", ge=0, le=100_000)]
Metric = Annotated[
    str,
    Parameter(
        query="metric",
        min_length=1,
        max_length=200,
        description="family.metric, e.g. intervention.kl",
    ),
]
Component = Annotated[
    str | None,
    Parameter(
        query="component",
        max_length=32,
        description="drop, swap, drop_attn, drop_mlp, none (interventions); attn, mlp",
    ),
]
Models = Annotated[
    str,
    Parameter(
        query="models",
        min_length=1,
        max_length=10_000,
        description="comma-separated model names or ids",
    ),
]


def split_models(models: str) -> list[str]:
    return [m.strip() for m in models.split(",") if m.strip()]


RunIds = Annotated[
    str | None,
    Parameter(
        query="run_ids",
        max_length=10_000,
        pattern=r"^\s*\d+\s*(,\s*\d+\s*)*$",
        description="comma-separated run ids, at most one per listed model: each replaces its "
        "model's canonical run",
    ),
]


def split_run_ids(run_ids: str | None) -> list[int] | None:
    if run_ids is None:
        return None
    return [int(r) for r in run_ids.split(",") if r.strip()]
