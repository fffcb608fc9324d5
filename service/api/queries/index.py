"""What the service knows by heart about the store: models by name, runs, current runs.

Every data request starts by resolving a model reference and picking a run. Both are small
lookups over the `models` and `runs` tables, so the service keeps them in memory and rebuilds
them when `Store.generation` moves — after any committed write, all of which go through this
process (it is the database's one writer). A request therefore resolves "model `gpt2`'s current
run for `intervention`" without a query, and then reads only the rows it needs.
"""

from __future__ import annotations

import difflib
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from compute.run import METRIC_VERSION
from service.api.errors import NotFoundHttpError
from service.store import Store
from service.store import repositories as repo


@dataclass(frozen=True)
class ModelEntry:
    id: int
    name: str
    n_layers: int | None


@dataclass(frozen=True)
class RunEntry:
    id: int
    model_id: int
    status: str
    metric_version: str
    families: frozenset[str]
    finished_at: datetime | None
    refit_family: str | None
    has_stages: bool

    @property
    def order(self) -> tuple[datetime, int]:
        return (self.finished_at or datetime.min, self.id)


@dataclass
class Snapshot:
    generation: int
    models: dict[int, ModelEntry]
    by_name: dict[str, list[int]]
    runs: dict[int, RunEntry]
    succeeded: dict[tuple[int, str], list[RunEntry]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        grouped: dict[tuple[int, str], list[RunEntry]] = defaultdict(list)
        for run in self.runs.values():
            if run.status == "succeeded":
                grouped[(run.model_id, run.metric_version)].append(run)
        self.succeeded = {
            k: sorted(v, key=lambda r: r.order, reverse=True) for k, v in grouped.items()
        }

    # ---- models

    def model(self, ref: str, model_id: int | None = None) -> ModelEntry:
        """A model by name or id. Several registrations of one name (other processing or
        revision): the latest, unless `model_id` picks one of them."""
        if model_id is not None:
            entry = self.models.get(model_id)
            if entry is None or ref not in (entry.name, str(entry.id)):
                raise NotFoundHttpError(
                    f"there is no model {ref!r} with id {model_id}" + self._same_name_hint(ref)
                )
            return entry
        if ref.isdigit() and ref.isascii() and int(ref) in self.models:
            return self.models[int(ref)]
        ids = self.by_name.get(ref)
        if ids:
            return self.models[ids[-1]]
        close = difflib.get_close_matches(ref, list(self.by_name), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise NotFoundHttpError(
            f"no model is registered as {ref!r}{hint} (GET /api/v1/models lists them)"
        )

    def _same_name_hint(self, ref: str) -> str:
        ids = self.by_name.get(ref)
        return f"; {ref!r} has ids {', '.join(map(str, ids))}" if ids else ""

    def models_named(self, refs: list[str]) -> list[ModelEntry]:
        seen: dict[int, ModelEntry] = {}
        for ref in refs:
            entry = self.model(ref)
            seen.setdefault(entry.id, entry)
        return list(seen.values())

    # ---- runs

    def current_run(
        self,
        model_id: int,
        *,
        family: str | None = None,
        metric_version: str = METRIC_VERSION,
        staged: bool = False,
    ) -> RunEntry | None:
        """The model's latest succeeded run under `metric_version` that computed `family`
        (and, with `staged`, has stage boundaries): the one place "current" is decided."""
        for run in self.succeeded.get((model_id, metric_version), ()):
            if (family is None or family in run.families) and (not staged or run.has_stages):
                return run
        return None

    def current_runs(self, model_id: int) -> dict[str, int]:
        """Metric family -> id of the model's current run for it (`current_run`), by family
        name: what the model answers tell clients (`Model.current_runs`)."""
        families = sorted(
            {f for run in self.succeeded.get((model_id, METRIC_VERSION), ()) for f in run.families}
        )
        picked = {f: self.current_run(model_id, family=f) for f in families}
        return {f: run.id for f, run in picked.items() if run is not None}

    def stability_runs(self, family: str, metric_version: str = METRIC_VERSION) -> list[RunEntry]:
        """The family's succeeded stability runs under `metric_version`, newest first."""
        runs = [
            r
            for r in self.runs.values()
            if r.refit_family == family
            and r.status == "succeeded"
            and r.metric_version == metric_version
        ]
        return sorted(runs, key=lambda r: r.order, reverse=True)


class StoreIndex:
    """The current `Snapshot` of a store, rebuilt when the store's generation moves."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._snapshot: Snapshot | None = None
        self._lock = threading.Lock()

    def current(self) -> Snapshot | None:
        """The snapshot if it is up to date (no write since it was built), else None; never
        touches the database."""
        snap = self._snapshot
        return snap if snap is not None and snap.generation == self.store.generation else None

    def snapshot(self) -> Snapshot:
        snap = self._snapshot
        generation = self.store.generation
        if snap is not None and snap.generation == generation:
            return snap
        with self._lock:
            snap = self._snapshot
            if snap is None or snap.generation != generation:
                snap = self._build(generation)
                self._snapshot = snap
        return snap

    def _build(self, generation: int) -> Snapshot:
        cursor = self.store.cursor()
        models = {
            int(r["id"]): ModelEntry(int(r["id"]), r["name"], r["n_layers"])
            for r in repo.model_index(cursor).iter_rows(named=True)
        }
        by_name: dict[str, list[int]] = defaultdict(list)
        for entry in models.values():
            by_name[entry.name].append(entry.id)
        runs = {
            int(r["id"]): RunEntry(
                int(r["id"]),
                int(r["model_id"]),
                r["status"],
                r["metric_version"],
                frozenset(r["families"] or ()),
                r["finished_at"],
                r["refit_family"],
                bool(r["has_stages"]),
            )
            for r in repo.run_index(cursor).iter_rows(named=True)
        }
        return Snapshot(generation, models, dict(by_name), runs)
