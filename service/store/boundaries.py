"""Stage boundaries of a run, inferred at ingest from its own records (docs/metrics.md: stages.*).

The rule is `compute.stages.infer_stages` (the one definition); this module only decides when it
applies and shapes its answer for `stage_boundaries`. A run that computed the three families the
rule reads — intervention, logit_lens, neurons — gets its three boundaries (clear or not) in the
same transaction as its rows; re-ingesting the run replaces them with its rows.
"""

from __future__ import annotations

import math
from typing import Any

import polars as pl
import pyarrow as pa
from sqlalchemy.orm import Session

from compute.errors import SpecError
from compute.stages import infer_stages
from service.store.tables import StageBoundary

STAGE_FAMILIES = frozenset({"intervention", "logit_lens", "neurons"})


def _plain(value: Any) -> Any:
    """Evidence as JSON can hold it: plain floats (no NaN), ints, strings, lists, dicts."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):  # numpy / torch scalars
        return _plain(value.item())
    return value


def infer_boundaries(
    records: pa.Table,
    families: tuple[str, ...] | list[str],
    n_layers: int,
    sequence_means: pa.Table | None = None,
) -> list[dict[str, Any]]:
    """The boundaries of a run as `stage_boundaries` rows (no ids yet); none when the run lacks
    a family the rule reads or the model is too shallow for stages. With the run's per-sequence
    means, each boundary's evidence carries its bootstrap interval over sequences."""
    if not set(families) >= STAGE_FAMILIES:
        return []
    means = None
    if sequence_means is not None and sequence_means.num_rows:
        means = pl.from_arrow(sequence_means)
    try:
        boundaries = infer_stages(
            pl.from_arrow(records),  # type: ignore[arg-type]
            n_layers,
            means,  # type: ignore[arg-type]
        )
    except SpecError:
        return []
    return [
        {
            "boundary": b.index,
            "found": b.layer is not None,
            "layer": b.layer,
            "relative_depth": b.relative_depth if b.layer is not None else None,
            "rule": b.rule,
            "evidence": _plain(b.evidence),
        }
        for b in boundaries
    ]


def store_boundaries(
    session: Session, run_id: int, model_id: int, rows: list[dict[str, Any]]
) -> None:
    """Add a run's boundaries (inside the ingest transaction; old ones were deleted)."""
    session.add_all([StageBoundary(run_id=run_id, model_id=model_id, **row) for row in rows])
