"""Two in-memory caches that make repeated reads cheap, both safe by construction.

A succeeded run's rows change only when the run is ingested again, which gives it a new finish
time, and every write goes through this process (the database's one writer). So:

- `RunRows` keeps the per-layer and per-head rows of recently read runs as Polars frames, one per
  metric, keyed by (run id, finish time). Any query on a cached run — one metric at one model,
  a 10-model compare, per-stage aggregates — filters memory instead of asking DuckDB. Bounded
  by rows (`STRATA_API__ROW_CACHE_ROWS`), least recently used first out.
- `Responses` keeps encoded answers by ETag. The ETag is a digest of the request (path, query,
  format) and of the (id, finish time) of every run the answer reads (`caching.py`), so an entry
  can never be served for data that changed: a new run gives new tags, old entries age out.
  Bounded by bytes (`STRATA_API__RESPONSE_CACHE_MB`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import polars as pl

from service.api.queries.index import RunEntry
from service.store import Store
from service.store import repositories as repo


class RunRows:
    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self._entries: OrderedDict[tuple[int, datetime | None], dict[str, pl.DataFrame]] = (
            OrderedDict()
        )
        self._sizes: dict[tuple[int, datetime | None], int] = {}
        self._rows = 0
        self._lock = threading.Lock()

    def _run(
        self, cursor: Any, run_id: int, finished_at: datetime | None
    ) -> dict[str, pl.DataFrame]:
        key = (run_id, finished_at)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                return entry
        frame = repo.all_rows_of_run(cursor, run_id)
        entry = {
            str(name[0]): part
            for name, part in frame.partition_by(
                "metric", as_dict=True, maintain_order=True
            ).items()
        }
        if frame.height <= self.max_rows:
            with self._lock:
                if key not in self._entries:
                    self._entries[key] = entry
                    self._sizes[key] = frame.height
                    self._rows += frame.height
                while self._rows > self.max_rows and self._entries:
                    old, _ = self._entries.popitem(last=False)
                    self._rows -= self._sizes.pop(old)
        return entry

    def rows(
        self,
        cursor: Any,
        runs: Sequence[tuple[int, datetime | None]],
        metrics: Sequence[str],
        *,
        component: str | None = None,
        layer_min: int | None = None,
        layer_max: int | None = None,
        heads: bool = False,
    ) -> pl.DataFrame:
        """What `repositories.rows_of_runs` answers, from memory."""
        if self.max_rows == 0:  # caching switched off: ask DuckDB for exactly these rows
            return repo.rows_of_runs(
                cursor,
                sorted(r for r, _ in runs),
                sorted(set(metrics)),
                component=component,
                layer_min=layer_min,
                layer_max=layer_max,
                heads=heads,
            )
        parts = []
        for run_id, finished_at in sorted(runs, key=lambda r: r[0]):
            by_metric = self._run(cursor, run_id, finished_at)
            parts += [by_metric[m] for m in sorted(set(metrics)) if m in by_metric]
        if not parts:
            return repo.rows_of_runs(cursor, [], [])
        frame = pl.concat(parts) if len(parts) > 1 else parts[0]
        keep = pl.col("head").is_not_null() if heads else pl.col("head").is_null()
        if component is not None:
            keep &= pl.col("component") == component
        if layer_min is not None:
            keep &= pl.col("layer") >= layer_min
        if layer_max is not None:
            keep &= pl.col("layer") <= layer_max
        return frame.filter(keep)


@dataclass
class Reader:
    """Where the query functions read: the store (ORM reads, DuckDB cursor) and the run cache."""

    store: Store
    run_rows: RunRows

    def cursor(self) -> Any:
        return self.store.cursor()

    def rows(
        self,
        runs: Sequence[RunEntry],
        metrics: Sequence[str],
        *,
        component: str | None = None,
        layer_min: int | None = None,
        layer_max: int | None = None,
        heads: bool = False,
    ) -> pl.DataFrame:
        """Per-layer (or per-head) rows of `metrics` in `runs`, with run_id and relative depth."""
        return self.run_rows.rows(
            self.cursor(),
            [(r.id, r.finished_at) for r in runs],
            metrics,
            component=component,
            layer_min=layer_min,
            layer_max=layer_max,
            heads=heads,
        )


class Responses:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, tuple[str, bytes]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, tag: str) -> tuple[str, bytes] | None:
        with self._lock:
            entry = self._entries.get(tag)
            if entry is not None:
                self._entries.move_to_end(tag)
            return entry

    def put(self, tag: str, media_type: str, body: bytes) -> None:
        if len(body) > self.max_bytes // 8:  # a few huge answers must not flush the rest
            return
        with self._lock:
            if tag in self._entries:
                return
            self._entries[tag] = (media_type, body)
            self._bytes += len(body)
            while self._bytes > self.max_bytes and self._entries:
                _, (_, old) = self._entries.popitem(last=False)
                self._bytes -= len(old)
