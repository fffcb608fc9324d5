"""The formats a data endpoint answers in, chosen per request, and encoding its table.

Every data endpoint returns one table of rows plus a little context (which model, which run).
JSON (the default) is the context with the rows under `rows`; CSV, Parquet and Arrow IPC (stream)
carry the same rows with the same columns, in the same order — Parquet and Arrow with the context
as JSON in the schema metadata key `strata`, CSV without it. In CSV, list columns (a neuron's top
tokens) are JSON strings.

The format is `?format=json|csv|parquet|arrow` or, without it, the best match of the `Accept`
header (q-values honoured; `*/*` or no header: JSON). Encoders for CSV, Parquet and Arrow are the
export registry that `strata compute --out` uses (`service.exports.FORMATS`).
"""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec
import polars as pl
import pyarrow as pa

from service.api.errors import NotAcceptableHttpError
from service.exports import FORMATS

FormatName = Literal["json", "csv", "parquet", "arrow"]
FORMAT_NAMES: tuple[str, ...] = ("json", "csv", "parquet", "arrow")
MEDIA_TYPES: dict[str, str] = {name: FORMATS[name].media_type for name in FORMAT_NAMES}
_ACCEPTED: dict[str, str] = {
    "application/json": "json",
    "application/*": "json",
    "*/*": "json",
    "text/csv": "csv",
    "text/*": "csv",
    "application/vnd.apache.parquet": "parquet",
    "application/x-parquet": "parquet",
    "application/parquet": "parquet",
    "application/vnd.apache.arrow.stream": "arrow",
}


def negotiate(format_param: str | None, accept: str | None) -> str:
    """The format to answer in: `?format=` first, else the `Accept` header's best match."""
    if format_param is not None:
        return format_param  # checked against FormatName by the parameter's schema
    if not accept or not accept.strip():
        return "json"
    offers: list[tuple[float, int, str]] = []
    for position, part in enumerate(accept.split(",")):
        media, *params = (p.strip() for p in part.split(";"))
        quality = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        name = _ACCEPTED.get(media.lower())
        if name is not None and quality > 0:
            # prefer higher q, then specific types over wildcards, then the client's order
            specific = 0 if "*" in media else 1
            offers.append((quality + specific * 1e-3, -position, name))
    if not offers:
        raise NotAcceptableHttpError(
            f"none of the accepted types ({accept[:200]}) is offered; this "
            "endpoint answers " + ", ".join(MEDIA_TYPES.values())
        )
    return max(offers)[2]


def _jsonable_columns(table: pa.Table) -> pa.Table:
    """List and struct columns as JSON strings (CSV has no nested values)."""
    for index, field in enumerate(table.schema):
        if (
            pa.types.is_list(field.type)
            or pa.types.is_large_list(field.type)
            or pa.types.is_struct(field.type)
        ):
            text = [None if v is None else json.dumps(v) for v in table.column(index).to_pylist()]
            table = table.set_column(index, field.name, pa.array(text, pa.string()))
    return table


def encode(
    fmt: str, context: msgspec.Struct, rows: pl.DataFrame, columns: tuple[str, ...]
) -> bytes:
    """The body of a data answer: `context` with `rows` (JSON), or the rows alone (tabular).

    `columns` are the row type's fields, in order; the frame must hold exactly those.
    """
    frame = rows.select(list(columns))
    if fmt == "json":
        return msgspec.json.encode(msgspec.structs.replace(context, rows=frame.to_dicts()))
    table = frame.to_arrow()
    if fmt == "csv":
        return FORMATS["csv"].encode(_jsonable_columns(table), None)
    meta: dict[str, Any] = msgspec.to_builtins(context)
    meta.pop("rows", None)
    return FORMATS[fmt].encode(table, meta)
