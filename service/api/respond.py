"""Turning an `Answer` into a response: format, ETag (304 without reading), Cache-Control."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
from litestar import Request, Response
from litestar.openapi.datastructures import ResponseSpec

from service.api.caching import cache_control, etag, matches
from service.api.errors import ErrorBody
from service.api.formats import MEDIA_TYPES, encode, negotiate
from service.api.queries.answers import Answer, run_header
from service.api.queries.cache import Reader, Responses, RunRows
from service.api.queries.index import Snapshot, StoreIndex
from service.jobs.service import JobService
from service.settings import Settings
from service.store import Store

_REASONS = {
    400: "a parameter or body does not match the schema",
    401: "no API key, or a wrong one",
    403: "writes are switched off (no API keys configured)",
    404: "no such model, run or family, or no results for it",
    406: "none of the formats the client accepts",
    409: "the request contradicts what is stored",
    413: "the body is larger than the route's limit (the detail names it)",
    422: "well-formed but not meaningful (unknown metric, component, source, ...)",
    503: "a service it needs (the job broker) is unavailable; nothing was changed",
}


def errors(*codes: int) -> dict[int, ResponseSpec]:
    """OpenAPI entries for the error answers a handler gives (all with `ErrorBody`)."""
    return {
        code: ResponseSpec(
            data_container=ErrorBody, description=_REASONS[code], generate_examples=False
        )
        for code in codes
    }


# Every data answer names the runs it was read from, and why, in every format (docs/api.md).
RUN_HEADER = "X-Strata-Run"

# What a data endpoint can answer besides 200: bad/unknown input, no such model, bad format.
DATA_ERRORS = errors(400, 404, 406, 422)


@dataclass
class ApiContext:
    """What every handler works with: the store this process owns, the settings, the in-memory
    index of models and runs, and the caches of run rows and encoded answers."""

    store: Store
    settings: Settings
    index: StoreIndex
    reader: Reader
    responses: Responses
    jobs: JobService | None = None

    @classmethod
    def build(cls, store: Store, settings: Settings, jobs: JobService | None = None) -> ApiContext:
        return cls(
            store,
            settings,
            StoreIndex(store, settings),
            Reader(store, RunRows(settings.api.row_cache_rows)),
            Responses(settings.api.response_cache_mb * 2**20),
            jobs,
        )

    def snapshot(self) -> Snapshot:
        return self.index.snapshot()


async def respond(
    request: Request[Any, Any, Any],
    ctx: ApiContext,
    build: Callable[[Snapshot], Answer],
    format_param: str | None,
    *,
    build_in_thread: bool = False,
) -> Response[Any]:
    """Answer a data request. The cheap part runs on the event loop: resolving the model and
    run from the in-memory index, the ETag, a 304 or an answer from the response cache. Reading
    rows and encoding them (and rebuilding the index after a write) run in a worker thread.

    `build` makes the `Answer` from a snapshot of the index; `build_in_thread` when it reads the
    database itself."""
    snap = ctx.index.current()
    if snap is None or build_in_thread:
        answer = await anyio.to_thread.run_sync(lambda: build(ctx.snapshot()))
    else:
        answer = build(snap)
    fmt = negotiate(format_param, request.headers.get("accept"))
    picks = answer.chosen()
    # why each run was read is part of the answer (a run pinned or unpinned changes it)
    tag = etag(
        request,
        fmt,
        [(r.id, r.finished_at) for r in answer.runs],
        [f"{p.run.id}:{p.basis}:{p.canonical}" for p in picks],
    )
    headers = {
        "ETag": tag,
        RUN_HEADER: run_header(picks),
        "Vary": "Accept",
        "Cache-Control": cache_control(
            pinned=answer.pinned,
            public=ctx.settings.api.public_reads,
            max_age=ctx.settings.api.cache_max_age,
        ),
    }
    if matches(request, tag):
        return Response(b"", status_code=304, headers=headers)
    cached = ctx.responses.get(tag)
    if cached is not None:
        return Response(cached[1], media_type=cached[0], headers=headers)
    body = await anyio.to_thread.run_sync(
        lambda: encode(fmt, answer.context, answer.load(), answer.columns)
    )
    ctx.responses.put(tag, MEDIA_TYPES[fmt], body)
    return Response(body, media_type=MEDIA_TYPES[fmt], headers=headers)
