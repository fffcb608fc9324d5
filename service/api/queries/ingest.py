"""Results delivered over HTTP: Arrow IPC in, `service.store.ingest.ingest_result` behind.

The body is one Arrow IPC stream, or up to three back to back (`Content-Type:
application/vnd.apache.arrow.stream`):

1. the run's records (docs/metrics.md record format), whose schema metadata key `strata` holds the
   run's identity as JSON — exactly what `strata compute --out run.arrow` writes (`config`,
   `config_hash`, `model`, `tokens_evaluated`, `device`, `wall_s`, `environment`);
2. optionally, the neurons family's top tokens (`run.neuron_tokens.arrow` beside it) and the
   per-sequence means (`run.sequence_means.arrow`), in either order: each is recognised by its
   columns (`neuron_class`; `sequence`).

So a worker that computed a run delivers it with
`cat run.arrow run.neuron_tokens.arrow run.sequence_means.arrow | curl -H 'X-API-Key: ...' \\
 --data-binary @- -H 'Content-Type: application/vnd.apache.arrow.stream' \\
 http://host:8000/api/v1/runs/ingest`.
The ingest is atomic per run and idempotent by configuration hash: delivering a run again
replaces it. `?run_id=` delivers to a queued run.

A refit family's stability (a worker's stability job) comes the same way, recognised by
`kind: "stability"` in the records' metadata (`service.api.queries.stability_ingest`); `deliver`
sends each kind to its own store path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import msgspec
import pyarrow as pa
import pyarrow.ipc as ipc
from pydantic import ValidationError

from compute.run import NEURON_TOKENS_SCHEMA, SEQUENCE_MEANS_SCHEMA, RunConfig, RunResult
from service.api.errors import NotFoundHttpError, UnprocessableHttpError
from service.schemas.runs import IngestSummary
from service.store import Store
from service.store.errors import RunNotFoundError
from service.store.ingest import ingest_result
from service.store.stability import ingest_stability

if TYPE_CHECKING:
    from service.jobs.service import JobService

METADATA_KEY = b"strata"


class RunMemory(msgspec.Struct):
    """The peak memory a run measured (`compute.memory.peak_memory`), as delivered."""

    host_peak_rss_mib: int | None = None
    host_peak_scope: Literal["run", "process"] | None = None
    device_peak_allocated_mib: int | None = None


class RunMetadata(msgspec.Struct):
    """The run identity that travels beside the records (`compute.run.result_metadata`)."""

    config: dict[str, Any]
    config_hash: str
    model: dict[str, Any]
    tokens_evaluated: int
    device: str = "unknown"
    wall_s: float = 0.0
    environment: dict[str, str] = {}
    metric_version: str | None = None
    # the tuned lens the run evaluated: key, whether it trained it, the budget used
    tuned_lens: dict[str, Any] | None = None
    # where its time went, by phase, and its measured peak memory (absent from older workers)
    timings_s: dict[str, float] = {}
    memory: RunMemory | None = None


def _read_stream(source: pa.BufferReader, what: str) -> pa.Table:
    try:
        with ipc.open_stream(source) as reader:
            return reader.read_all()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
        raise UnprocessableHttpError(f"the {what} are not an Arrow IPC stream: {exc}") from None


def decode(body: bytes) -> RunResult:
    """The `RunResult` an ingest body carries. Raises `UnprocessableHttpError` naming the
    problem."""
    if not body:
        raise UnprocessableHttpError(
            "the body is empty: send the run's records as an Arrow IPC stream"
        )
    source = pa.BufferReader(pa.py_buffer(body))
    records = _read_stream(source, "records")
    side: dict[str, pa.Table] = {}
    while source.tell() < len(body):
        if len(side) == 2:
            raise UnprocessableHttpError("the body holds more than three Arrow streams")
        table = _read_stream(source, f"side table (stream {len(side) + 2})")
        kind = (
            "sequence_means"
            if "sequence" in table.column_names
            else "neuron_tokens"
            if "neuron_class" in table.column_names
            else None
        )
        if kind is None:
            raise UnprocessableHttpError(
                f"stream {len(side) + 2} is neither neuron tokens (a 'neuron_class' column) nor "
                f"per-sequence means (a 'sequence' column); its columns: "
                f"{', '.join(table.column_names)}"
            )
        if kind in side:
            raise UnprocessableHttpError(f"the body holds {kind} twice")
        side[kind] = table
    tokens = side.get("neuron_tokens", NEURON_TOKENS_SCHEMA.empty_table())
    means = side.get("sequence_means", SEQUENCE_MEANS_SCHEMA.empty_table())
    raw = (records.schema.metadata or {}).get(METADATA_KEY)
    if raw is None:
        raise UnprocessableHttpError(
            "the records' schema metadata has no 'strata' key with the run's "
            "configuration (write them with `strata compute --out run.arrow`)"
        )
    try:
        meta = msgspec.json.decode(raw, type=RunMetadata)
        config = RunConfig.model_validate(meta.config)
    except msgspec.ValidationError as exc:
        raise UnprocessableHttpError(f"the run metadata is malformed: {exc}") from None
    except msgspec.DecodeError as exc:
        raise UnprocessableHttpError(f"the run metadata is not JSON: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UnprocessableHttpError(
            f"the run configuration is malformed: {where}: {first['msg']}"
        ) from None
    return RunResult(
        config=config,
        config_hash=meta.config_hash,
        records=records.replace_schema_metadata(None),
        neuron_tokens=tokens,
        model_info=meta.model,
        tokens_evaluated=meta.tokens_evaluated,
        device=meta.device,
        wall_s=meta.wall_s,
        environment=dict(meta.environment),
        sequence_means=means,
        lens=meta.tuned_lens,
        timings_s=dict(meta.timings_s),
        memory=msgspec.structs.asdict(meta.memory) if meta.memory is not None else {},
    )


def ingest(store: Store, body: bytes, run_id: int | None) -> IngestSummary:
    result = decode(body)
    try:
        return ingest_result(store, result, run_id=run_id)
    except RunNotFoundError as exc:
        raise NotFoundHttpError(str(exc)) from None


def delivery_kind(body: bytes) -> str:
    """`stability` for a refit family's stability, else `run` (read from the first stream's
    schema metadata only)."""
    try:
        with ipc.open_stream(pa.BufferReader(pa.py_buffer(body))) as reader:
            raw = (reader.schema.metadata or {}).get(METADATA_KEY)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError):
        return "run"  # `decode` says what is wrong with it
    if raw is None:
        return "run"
    try:
        meta = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return "run"
    return "stability" if isinstance(meta, dict) and meta.get("kind") == "stability" else "run"


def deliver(
    store: Store, jobs: JobService | None, body: bytes, *, run_id: int | None, job_id: int | None
) -> IngestSummary:
    """Store a delivery of either kind: a run's results (`ingest_result`, or the job service's
    `deliver` for a job's), or a family's stability (`ingest_stability`, or the family jobs'
    `deliver`)."""
    if delivery_kind(body) == "stability":
        from service.api.queries.stability_ingest import decode_stability

        if run_id is not None:
            raise UnprocessableHttpError("stability results are delivered with job_id, not run_id")
        source = pa.BufferReader(pa.py_buffer(body))
        records = _read_stream(source, "records")
        if source.tell() < len(body):
            raise UnprocessableHttpError("stability results are one Arrow stream, not several")
        result = decode_stability(records, (records.schema.metadata or {})[METADATA_KEY])
        if job_id is not None and jobs is not None:
            summary = jobs.families.deliver(result, job_id)
        else:
            summary = ingest_stability(store, result)
        return IngestSummary(
            summary.run_id, summary.anchor_model_id, summary.replaced, summary.results, 0, 0, 0
        )
    if job_id is not None and jobs is not None:
        return jobs.deliver(decode(body), job_id)
    return ingest(store, body, run_id)
