"""A stability job on a worker: a refit family's members compared with its anchor, by the same
`compute.refits.stability_of` that `strata stability` runs, with the worker's model cache and
the job's progress, and encoded for delivery (`POST /api/v1/runs/ingest?job_id=`).

The delivered body is one Arrow IPC stream of the records whose schema metadata `strata` holds
`kind: "stability"`, the job's configuration exactly as claimed (its hash is the job's), every
member's spec with its architecture numbers (`LoadedModel.describe()`), the device, wall time
and versions: what `service.api.queries.stability_ingest` turns back into a `StabilityResult`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from service.settings import Settings
from service.worker.cache import ModelCache

if TYPE_CHECKING:
    from compute.engine import ProgressFn

STABILITY_KIND = "stability"


def stability_body(
    config: dict[str, Any],
    *,
    settings: Settings,
    device: str,
    cache: ModelCache,
    progress: ProgressFn,
) -> tuple[bytes, int]:
    """Compute a claimed stability configuration; the delivery body and its record count."""
    from compute.models import ModelSpec
    from compute.refits import stability_of
    from compute.stability import StabilityOptions
    from compute.tokens import TokenSpec
    from service.exports import FORMATS

    members = [ModelSpec.model_validate(m) for m in config["members"]]
    result = stability_of(
        ModelSpec.model_validate(config["anchor"]),
        members,
        StabilityOptions.model_validate(config["options"]),
        TokenSpec.model_validate(config["prompts"]),
        device=device,
        load=lambda spec: cache.get(spec, device),
        progress=progress,
    )
    meta = {
        "kind": STABILITY_KIND,
        "config": config,
        "members": [{"spec": s.model_dump(mode="json"), "model": m} for s, m in result.members],
        "device": device,
        "wall_s": round(result.wall_s, 3),
        "environment": result.environment,
    }
    return FORMATS["arrow"].encode(result.records, meta), result.records.num_rows
