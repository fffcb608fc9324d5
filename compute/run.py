"""A run: its configuration (and identity), and computing it end to end.

A run is defined by its configuration — model spec, token spec, metric families, engine options
and `METRIC_VERSION`. `config_hash` is the SHA-256 of its canonical JSON: same hash, same run.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import torch
from pydantic import BaseModel, ConfigDict

from compute.engine import Progress, ProgressFn, auto_batch_size, sweep
from compute.lens.config import LensTraining
from compute.lens.store import LensStore, lens_key, provide_lens
from compute.memory import peak_memory, reset_peak_memory
from compute.metrics import DEFAULT_FAMILIES, families_named
from compute.metrics.base import (
    PERFORMANCE_OPTIONS,
    SEQUENCE_MEANS_SCHEMA,
    EngineOptions,
    NeuronTokens,
)
from compute.models import LoadedModel, ModelSpec, load_model
from compute.records import records_to_table, validate_records
from compute.tokens import TokenSpec, load_tokens, resolve_token_spec

# Bumped whenever a definition in docs/metrics.md changes meaning. 2: the sequence is the unit of
# every mean's stderr and n (1: the token); intervention.swap_minus_drop_*; per-sequence means.
METRIC_VERSION = "2"
CODE_VERSION = "0.1.0"

NEURON_TOKENS_SCHEMA = pa.schema(
    [
        ("layer", pa.int32()),
        ("neuron", pa.int32()),
        ("neuron_class", pa.string()),
        ("direction", pa.string()),
        ("rank", pa.int32()),
        ("token_id", pa.int64()),
        ("token", pa.string()),
        ("cosine", pa.float64()),
    ]
)


def stderr_basis(metric_version: str) -> str:
    """What a run's `stderr` and `n` count: "token" under metric version 1 and older (every
    token an independent sample), "sequence" from version 2 (the mean of per-sequence means,
    n = sequences). Stored runs keep the basis of the version they were computed under."""
    try:
        return "token" if int(metric_version) < 2 else "sequence"
    except ValueError:  # not a number: not one of ours before version 2
        return "sequence"


class RunConfig(BaseModel):
    """Everything that determines a run's numbers."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    model: ModelSpec
    tokens: TokenSpec
    families: tuple[str, ...] = DEFAULT_FAMILIES
    options: EngineOptions = EngineOptions()
    metric_version: str = METRIC_VERSION

    def canonical_json(self) -> str:
        # batch_size changes throughput, not numbers (beyond float rounding): not identity.
        data = self.model_dump(mode="json")
        for name in PERFORMANCE_OPTIONS:
            data["options"].pop(name, None)
        if "tuned_lens" not in self.families:  # runs without the lens keep their hashes
            data["options"].pop("tuned_lens", None)
        if "pruning_drops" not in self.families:  # runs without the drops keep their hashes
            data["options"].pop("drop_widths", None)
        if "heads_screen" not in self.families:  # runs without the screen keep their hashes
            data["options"].pop("screen_steps", None)
            data["options"].pop("screen_samples", None)
            data["options"].pop("screen_top_k", None)
            data["options"].pop("screen_calibration", None)
        elif data["options"].get("screen_calibration") == 0:  # screens from before it existed
            data["options"].pop("screen_calibration")
        data["families"] = sorted(data["families"])
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    def config_hash(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()


@dataclass
class RunResult:
    config: RunConfig
    config_hash: str
    records: pa.Table
    neuron_tokens: pa.Table
    model_info: dict[str, Any]
    tokens_evaluated: int
    device: str
    wall_s: float
    environment: dict[str, str] = field(default_factory=dict)
    # per-sequence means of every per-layer mean (SEQUENCE_MEANS_SCHEMA): the bootstrap's input
    sequence_means: pa.Table = field(default_factory=SEQUENCE_MEANS_SCHEMA.empty_table)
    # the tuned lens the run evaluated: its key, whether this run trained it, the budget used
    lens: dict[str, Any] | None = None
    # where wall_s went, in seconds: "load" (model and tokens), "lens_training" where the run
    # trained its lens, "clean_pass" and each family (`compute.engine.SweepResult.family_s`)
    timings_s: dict[str, float] = field(default_factory=dict)
    # the run's peak memory, measured (`compute.memory.peak_memory`): host resident MiB and its
    # scope, and PyTorch's peak allocation on a CUDA device
    memory: dict[str, Any] = field(default_factory=dict)


def sweep_units(lm: LoadedModel, tokens: torch.Tensor, config: RunConfig) -> int:
    """The units of work `compute.engine.sweep` will report as its total for these tokens (its
    batching, as it plans it), known before it starts: what a run's one progress total adds
    the tuned lens's training steps to."""
    families = families_named(list(config.families))
    n_seq, seq_len = int(tokens.shape[0]), int(tokens.shape[1])
    batch = min(auto_batch_size(lm, seq_len, config.options, families), n_seq)
    n_batches = -(-n_seq // batch)
    return sum(f.units_per_batch(lm) for f in families) * n_batches + sum(
        f.units_at_finish(lm, config.options) for f in families
    )


class RunProgress:
    """One progress for a whole run: the tuned lens's training steps (when this run trains
    one), then the sweep's units, against one total — so a progress bar and a job's ETA (time
    so far x units left / units done) follow one run, not two phases that each restart at 0.
    A training step counts as one unit, as a sweep unit does (a step costs more: an ETA taken
    during training overestimates, one taken during the sweep is the sweep's own). Elapsed time
    runs from the start of the training. Should the sweep plan another total than
    `sweep_units` foresaw (a GPU's free memory changed its batching), its own total is adopted
    at its first report."""

    def __init__(self, progress: ProgressFn, *, training_steps: int, sweep_total: int) -> None:
        self.progress = progress
        self.training_steps = training_steps
        self.sweep_total = sweep_total
        self.start = time.perf_counter()

    @property
    def total(self) -> int:
        return self.training_steps + self.sweep_total

    def _elapsed(self) -> float:
        return time.perf_counter() - self.start

    def training(self, p: Progress) -> None:
        done = min(p.done, self.training_steps)
        self.progress(Progress(done, self.total, p.tokens_done, p.tokens_per_s, self._elapsed()))

    def sweeping(self, p: Progress) -> None:
        self.sweep_total = p.total
        self.progress(
            Progress(
                self.training_steps + p.done,
                self.total,
                p.tokens_done,
                p.tokens_per_s,
                self._elapsed(),
            )
        )


def _will_train(
    lm: LoadedModel, tokens: TokenSpec, training: LensTraining, store: LensStore
) -> bool:
    return training.lens is None and not store.has(lens_key(lm.spec, tokens, training))


def neuron_tokens_table(rows: list[NeuronTokens]) -> pa.Table:
    columns = {name: [getattr(r, name) for r in rows] for name in NEURON_TOKENS_SCHEMA.names}
    return pa.table(columns, schema=NEURON_TOKENS_SCHEMA)


def compute_run(
    config: RunConfig,
    *,
    device: str = "cpu",
    progress: ProgressFn | None = None,
    lm: LoadedModel | None = None,
    lenses: LensStore | None = None,
) -> RunResult:
    """Load the model and tokens a configuration names, sweep, validate and return the records.

    With the tuned_lens family the run's lens is loaded from `lenses` (default: the lens folder,
    `compute.lens.store.lens_dir()`) or, when none is stored under its key, trained first on the
    token source's training split. Progress is one total for the whole run: the training's
    steps, then the sweep's units (`RunProgress`).
    Validation happens before any output exists: on error nothing is returned at all.
    """
    families_named(list(config.families))  # fail on unknown families before loading anything
    if lm is None:
        _refuse_families_before_loading(config)
    start = time.perf_counter()
    fresh_peak = reset_peak_memory(device)
    lm = lm or load_model(config.model, device)
    token_spec = resolve_token_spec(config.tokens)
    tokens = load_tokens(
        token_spec, lm.tokenizer, bos_token_id=lm.bos_token_id, d_vocab=lm.d_vocab, n_ctx=lm.n_ctx
    )
    config = config.model_copy(update={"tokens": token_spec})
    loaded = time.perf_counter()
    lens, lens_info = None, None
    store = lenses or LensStore()
    training = config.options.tuned_lens
    trains = "tuned_lens" in config.families and _will_train(lm, token_spec, training, store)
    phases = (
        RunProgress(
            progress,
            training_steps=training.steps if trains else 0,
            sweep_total=sweep_units(lm, tokens, config),
        )
        if progress is not None
        else None
    )
    if "tuned_lens" in config.families:
        lens, lens_info = provide_lens(
            lm, token_spec, training, store, phases.training if phases else None
        )
    trained = time.perf_counter()
    with lm.using_lens(lens):
        result = sweep(
            lm, tokens, list(config.families), config.options, phases.sweeping if phases else None
        )
    table = validate_records(records_to_table(result.records), n_layers=lm.n_layers)
    return RunResult(
        config=config,
        config_hash=config.config_hash(),
        records=table,
        neuron_tokens=neuron_tokens_table(result.neuron_tokens),
        model_info=lm.describe(),
        tokens_evaluated=result.tokens_evaluated,
        device=device,
        wall_s=time.perf_counter() - start,
        environment={
            "torch": torch.__version__,
            "python": platform.python_version(),
            "strata": CODE_VERSION,
        },
        sequence_means=result.sequence_means,
        lens=lens_info,
        timings_s={
            "load": round(loaded - start, 3),
            **({"lens_training": round(trained - loaded, 3)} if trains else {}),
            **result.family_s,
        },
        memory=peak_memory(device, since_reset=fresh_peak),
    )


def _refuse_families_before_loading(config: RunConfig) -> None:
    """A run whose families are all refused on its checkpoint's architecture
    (`compute.models.refusals.REFUSED_FAMILIES`) is refused from config.json alone, before
    any weight is read (the sweep refuses it too, for sources read only by loading)."""
    from pathlib import Path

    from compute.errors import UnsupportedArchitectureError
    from compute.models.refusals import refused_families
    from compute.models.sources import checkpoint_architecture
    from compute.zoo.paths import zoo_path

    spec = config.model
    if spec.source not in ("hf_dir", "zoo"):
        return
    path = zoo_path(spec.name) if spec.source == "zoo" else Path(spec.name)
    if not (path / "config.json").is_file():
        return  # a planted zoo model: no checkpoint
    architecture = checkpoint_architecture(path)
    refused = refused_families(architecture)
    asked = list(dict.fromkeys(config.families))
    if asked and all(family in refused for family in asked):
        raise UnsupportedArchitectureError(
            f"{architecture}: {', '.join(asked)} refused on this architecture: "
            + "; ".join(dict.fromkeys(refused[f] for f in asked))
        )


def result_metadata(result: RunResult) -> dict[str, Any]:
    """Run and model identity, which travel beside the rows (docs/metrics.md: record format)."""
    return {
        "config": json.loads(result.config.canonical_json()),
        "config_hash": result.config_hash,
        "model": result.model_info,
        "tokens_evaluated": result.tokens_evaluated,
        "device": result.device,
        "wall_s": round(result.wall_s, 3),
        **({"timings_s": result.timings_s} if result.timings_s else {}),
        **({"memory": result.memory} if result.memory else {}),
        "environment": result.environment,
        "metric_version": result.config.metric_version,
        "stderr_basis": stderr_basis(result.config.metric_version),
        **({"tuned_lens": result.lens} if result.lens is not None else {}),
    }
