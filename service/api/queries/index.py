"""What the service knows by heart about the store: models by name, runs, canonical runs.

Every data request starts by resolving a model reference and picking a run. Both are small
lookups over the `models`, `runs` and `run_pins` tables, so the service keeps them in memory and
rebuilds them when `Store.generation` moves — after any committed write, all of which go through
this process (it is the database's one writer). A request therefore resolves "model `gpt2`'s
canonical run for `intervention`" without a query, and then reads only the rows it needs.

A model's canonical run for a metric family (`Snapshot.canonical`), in this order:

1. `pinned`: the run an operator pinned for the family (`POST /models/{model}/pins`);
2. `default`: the run of the model's default configuration (`service.jobs.configs.
   default_config`, the run reconciliation computes), if it computed the family;
3. `latest`: only where neither exists — a model whose default run is not computed (yet), or a
   family the default configuration does not compute — its latest succeeded run that computed
   the family. Such an answer says so (`selected_by: "latest"`, `canonical: false`).

A newer run of another configuration (a small job, a run in another dtype) therefore never
replaces a pinned or default run; it is read by `?run_id=`, or pinned.
"""

from __future__ import annotations

import difflib
import json
import logging
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from compute.errors import SpecError
from compute.run import METRIC_VERSION, RunConfig
from service.api.errors import NotFoundHttpError
from service.jobs.configs import default_config
from service.settings import Settings
from service.store import Store
from service.store import pins as pin_rows
from service.store import repositories as repo

log = logging.getLogger("strata.api")

Basis = Literal["pinned", "default", "latest", "run_id"]
# The families whose runs infer stage boundaries; a pin of one of them picks the staged run.
STAGE_FAMILIES = ("intervention", "logit_lens", "neurons")


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
    config_hash: str = ""
    dtype: str | None = None
    tokens: str | None = None  # the token source's kind: builtin, corpus, npy, pile
    n_sequences: int | None = None
    seq_len: int | None = None
    tokens_evaluated: int | None = None

    @property
    def order(self) -> tuple[datetime, int]:
        return (self.finished_at or datetime.min, self.id)


@dataclass(frozen=True)
class Pick:
    """A run chosen for an answer, and why: `pinned`, `default` or `latest` (the model's
    canonical choice, see the module docstring) or `run_id` (the request named it).
    `canonical`: the run is the model's canonical run for the family (pinned or default)."""

    run: RunEntry
    basis: Basis
    canonical: bool


@dataclass(frozen=True)
class PinEntry:
    run_id: int
    actor: str
    recorded_at: datetime


@dataclass
class Snapshot:
    generation: int
    models: dict[int, ModelEntry]
    by_name: dict[str, list[int]]
    runs: dict[int, RunEntry]
    pins: dict[tuple[int, str], PinEntry] = field(default_factory=dict)
    # model id -> its default configuration (None: the defaults do not fit it)
    defaults: dict[int, RunConfig | None] = field(default_factory=dict)
    succeeded: dict[tuple[int, str], list[RunEntry]] = field(default_factory=dict)
    _default_hashes: dict[tuple[int, str], str | None] = field(default_factory=dict)

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

    def default_hash(self, model_id: int, metric_version: str = METRIC_VERSION) -> str | None:
        """The configuration hash of the model's default run under `metric_version`."""
        key = (model_id, metric_version)
        if key not in self._default_hashes:
            config = self.defaults.get(model_id)
            if config is not None and config.metric_version != metric_version:
                config = config.model_copy(update={"metric_version": metric_version})
            self._default_hashes[key] = None if config is None else config.config_hash()
        return self._default_hashes[key]

    def default_run(self, model_id: int, metric_version: str = METRIC_VERSION) -> RunEntry | None:
        """The model's succeeded run of its default configuration under `metric_version`."""
        wanted = self.default_hash(model_id, metric_version)
        if wanted is None:
            return None
        for run in self.succeeded.get((model_id, metric_version), ()):
            if run.config_hash == wanted:
                return run
        return None

    def canonical(
        self,
        model_id: int,
        *,
        family: str | None = None,
        metric_version: str = METRIC_VERSION,
        staged: bool = False,
    ) -> Pick | None:
        """The run a model's answers read for `family` (and, with `staged`, one with stage
        boundaries) under `metric_version`: pinned, else default, else latest (the module
        docstring). The one place this is decided."""

        def fits(run: RunEntry) -> bool:
            return (family is None or family in run.families) and (not staged or run.has_stages)

        pinned_families = (family,) if family is not None else STAGE_FAMILIES if staged else ()
        for name in pinned_families:
            pin = self.pins.get((model_id, name))
            run = self.runs.get(pin.run_id) if pin is not None else None
            if run is not None and run.metric_version == metric_version and fits(run):
                return Pick(run, "pinned", True)
        default = self.default_run(model_id, metric_version)
        if default is not None and fits(default):
            return Pick(default, "default", True)
        for run in self.succeeded.get((model_id, metric_version), ()):
            if fits(run):
                return Pick(run, "latest", False)
        return None

    def current_run(
        self,
        model_id: int,
        *,
        family: str | None = None,
        metric_version: str = METRIC_VERSION,
        staged: bool = False,
    ) -> RunEntry | None:
        """The run of `canonical`, without the reason."""
        pick = self.canonical(model_id, family=family, metric_version=metric_version, staged=staged)
        return None if pick is None else pick.run

    def canonical_runs(self, model_id: int) -> dict[str, Pick]:
        """Metric family -> the model's canonical pick for it under the current metric
        version, for every family some succeeded run computed: what the model answers tell
        clients (`Model.current_runs`, `Model.current_run_basis`)."""
        families = {
            f for run in self.succeeded.get((model_id, METRIC_VERSION), ()) for f in run.families
        }
        picked = {f: self.canonical(model_id, family=f) for f in sorted(families)}
        return {f: pick for f, pick in picked.items() if pick is not None}

    def current_runs(self, model_id: int) -> dict[str, int]:
        """Metric family -> id of the model's canonical run for it (`canonical_runs`)."""
        return {f: pick.run.id for f, pick in self.canonical_runs(model_id).items()}

    def model_pins(self, model_id: int) -> dict[str, PinEntry]:
        """The model's pins in force, by family."""
        return {f: pin for (m, f), pin in sorted(self.pins.items()) if m == model_id}

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
    """The current `Snapshot` of a store, rebuilt when the store's generation moves.

    Each model's default configuration is worked out from its stored spec and the deployment's
    job defaults (`settings.jobs`), once per model and spec: resolving the built-in token
    source reads its text once per process."""

    def __init__(self, store: Store, settings: Settings | None = None) -> None:
        self.store = store
        self.settings = settings
        self._snapshot: Snapshot | None = None
        self._lock = threading.Lock()
        self._defaults: dict[tuple[int, str, int | None], RunConfig | None] = {}

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

    def _default(self, model_id: int, spec: str, n_ctx: int | None) -> RunConfig | None:
        if self.settings is None:
            return None
        key = (model_id, spec, n_ctx)
        if key not in self._defaults:
            try:
                self._defaults[key] = default_config(json.loads(spec), n_ctx, self.settings)
            except (SpecError, ValueError) as exc:  # the defaults do not fit this model
                log.info("model %s has no default configuration: %s", model_id, exc)
                self._defaults[key] = None
        return self._defaults[key]

    def _build(self, generation: int) -> Snapshot:
        cursor = self.store.cursor()
        models: dict[int, ModelEntry] = {}
        defaults: dict[int, RunConfig | None] = {}
        for r in repo.model_index(cursor).iter_rows(named=True):
            model_id = int(r["id"])
            models[model_id] = ModelEntry(model_id, r["name"], r["n_layers"])
            defaults[model_id] = self._default(model_id, r["spec"], r["n_ctx"])
        by_name: dict[str, list[int]] = defaultdict(list)
        for entry in models.values():
            by_name[entry.name].append(entry.id)
        runs = {int(r["id"]): _run_entry(r) for r in repo.run_index(cursor).iter_rows(named=True)}
        pins = {
            (int(r["model_id"]), r["family"]): PinEntry(
                int(r["run_id"]), r["actor"], r["recorded_at"]
            )
            for r in pin_rows.in_force(cursor).iter_rows(named=True)
        }
        return Snapshot(generation, models, dict(by_name), runs, pins, defaults)


def _run_entry(r: dict[str, Any]) -> RunEntry:
    return RunEntry(
        int(r["id"]),
        int(r["model_id"]),
        r["status"],
        r["metric_version"],
        frozenset(r["families"] or ()),
        r["finished_at"],
        r["refit_family"],
        bool(r["has_stages"]),
        r["config_hash"],
        r["dtype"],
        r["tokens"],
        r["n_sequences"],
        r["seq_len"],
        r["tokens_evaluated"],
    )
