"""A refit family's stability delivered over HTTP (`POST /api/v1/runs/ingest`, by a worker's
stability job: `service.worker.stability`), back into the `StabilityResult` the store ingests.

The body is one Arrow IPC stream of the records; its schema metadata `strata` holds
`kind: "stability"`, the job's configuration (`service.store.stability.stability_config`), each
member's spec and numbers, the device, wall time and versions. The configuration is taken as
the identity: the result rebuilt from it must hash to it (and, for a job, to the job's).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pyarrow as pa
from pydantic import ValidationError

from compute.models import ModelSpec
from compute.tokens import TokenSpec
from service.api.errors import UnprocessableHttpError
from service.store.stability import StabilityResult, config_hash


class MemberMetadata(msgspec.Struct):
    spec: dict[str, Any]
    model: dict[str, Any]  # LoadedModel.describe()


class StabilityMetadata(msgspec.Struct):
    kind: str
    config: dict[str, Any]
    members: list[MemberMetadata]
    device: str = "unknown"
    wall_s: float = 0.0
    environment: dict[str, str] = {}


def decode_stability(records: pa.Table, raw: bytes) -> StabilityResult:
    """The `StabilityResult` of a stability delivery's records and metadata;
    `UnprocessableHttpError` naming what is malformed."""
    try:
        meta = msgspec.json.decode(raw, type=StabilityMetadata)
        config = meta.config
        result = StabilityResult(
            family=str(config["refit_family"]),
            anchor=ModelSpec.model_validate(config["anchor"]),
            members=[(ModelSpec.model_validate(m.spec), m.model) for m in meta.members],
            records=records.replace_schema_metadata(None),
            options=dict(config["options"]),
            prompts=TokenSpec.model_validate(config["prompts"]),
            device=meta.device,
            wall_s=meta.wall_s,
            environment=dict(meta.environment),
        )
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise UnprocessableHttpError(f"the stability metadata is malformed: {exc}") from None
    except KeyError as exc:
        raise UnprocessableHttpError(f"the stability configuration lacks {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UnprocessableHttpError(
            f"the stability configuration is malformed: {where}: {first['msg']}"
        ) from None
    if result.config_hash() != config_hash(config):
        raise UnprocessableHttpError(
            "the stability results do not match their configuration (its members, anchor, "
            "options, prompts or metric version differ from what was computed)"
        )
    return result
