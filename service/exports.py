"""Export formats of record tables: one registry shared by the CLI and the API.

Every format carries the same columns (docs/metrics.md: record format). Files are written
atomically: to a temporary file beside the target, then renamed, so a failed run leaves no
partial output.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.ipc as ipc
import pyarrow.parquet as pq


@dataclass(frozen=True)
class ExportFormat:
    name: str
    suffixes: tuple[str, ...]
    media_type: str
    encode: Callable[[pa.Table, dict[str, Any] | None], bytes]


def _parquet(table: pa.Table, meta: dict[str, Any] | None) -> bytes:
    if meta is not None:
        table = table.replace_schema_metadata({b"strata": json.dumps(meta).encode()})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def _arrow(table: pa.Table, meta: dict[str, Any] | None) -> bytes:
    if meta is not None:
        table = table.replace_schema_metadata({b"strata": json.dumps(meta).encode()})
    sink = io.BytesIO()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _csv(table: pa.Table, meta: dict[str, Any] | None) -> bytes:
    buf = io.BytesIO()
    pacsv.write_csv(table, buf)
    return buf.getvalue()


def _json(table: pa.Table, meta: dict[str, Any] | None) -> bytes:
    body: dict[str, Any] = {"records": table.to_pylist()}
    if meta is not None:
        body = {"run": meta, **body}
    return json.dumps(body, allow_nan=False).encode()


FORMATS: dict[str, ExportFormat] = {
    f.name: f
    for f in (
        ExportFormat("json", (".json",), "application/json", _json),
        ExportFormat("csv", (".csv",), "text/csv", _csv),
        ExportFormat("parquet", (".parquet",), "application/vnd.apache.parquet", _parquet),
        ExportFormat("arrow", (".arrow", ".arrows"), "application/vnd.apache.arrow.stream", _arrow),
    )
}


def format_for_path(path: Path) -> ExportFormat | None:
    for fmt in FORMATS.values():
        if path.suffix.lower() in fmt.suffixes:
            return fmt
    return None


def require_format(path: Path) -> ExportFormat:
    """The format a file's suffix names; `SpecError` naming the choices if none does."""
    fmt = format_for_path(path)
    if fmt is None:
        from compute.errors import SpecError

        raise SpecError(f"{path}: unknown format; use .parquet, .json, .csv or .arrow")
    return fmt


def write_atomic(path: Path, data: bytes) -> None:
    """Write bytes to `path` so that readers see the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_records(path: Path) -> Any:
    """Read a record file written by `strata compute` into a Polars frame."""
    import polars as pl

    from compute.errors import SpecError

    fmt = require_format(path)
    try:
        if fmt.name == "parquet":
            return pl.read_parquet(path)
        if fmt.name == "csv":
            return pl.read_csv(path)
        if fmt.name == "arrow":
            return pl.read_ipc_stream(path)
        return pl.DataFrame(json.loads(path.read_text())["records"])
    except (OSError, ValueError, KeyError, pl.exceptions.PolarsError) as exc:
        raise SpecError(f"cannot read records from {path}: {exc}") from exc
