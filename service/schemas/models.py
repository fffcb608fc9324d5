"""Registered models."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import msgspec

from service.schemas.jobs import Estimate


class AppliedProcessing(msgspec.Struct):
    """The weight processing actually applied (null until the model has been loaded)."""

    fold_ln: bool | None
    center_writing_weights: bool | None
    center_unembed: bool | None
    fold_value_biases: bool | None
    notes: list[str]


CurrentRuns = Annotated[
    dict[str, int],
    msgspec.Meta(
        description=(
            "metric family -> id of the run the data endpoints read for it by default, the "
            "model's canonical run: the run pinned for the family, else its default "
            "configuration's run, else (neither exists) its latest succeeded run that computed "
            "the family; all under the current metric version"
        )
    ),
]
CurrentRunBasis = Annotated[
    dict[str, str],
    msgspec.Meta(
        description=(
            "metric family -> why `current_runs` names that run: pinned, default or latest "
            "(latest: the model has no pinned or default run for the family, docs/api.md)"
        )
    ),
]


class ParityReport(msgspec.Struct):
    """Evidence that the model Strata runs is the model given (docs/metrics.md, "Parity"):
    Strata's forward against the Hugging Face model's own float32 forward on fixed token ids,
    and below float32 the noise floor. `reference` is null where the model has no Hugging Face
    original (planted controls, random weights), with the reason in `note`."""

    reference: str | None
    dtype: str
    tolerance: float
    tokens: int
    block_paths: list[str]
    max_abs_logprob_diff: float | None
    kl_to_reference: float | None
    kl_tolerance: float
    noise_floor_kl: float | None
    noise_floor_max_abs_logprob_diff: float | None
    passed: bool
    note: str = ""
    # A model split over several devices: where its blocks were, its device_map and
    # max_memory, and its forward against the host's (docs/performance.md); null on one device.
    placement: dict[str, Any] | None = None


class Model(msgspec.Struct):
    """A registered model: the weights and how they are processed. Architecture numbers are
    null while unknown (registered from a name whose configuration is not available offline).
    `current_runs`: which run is current for each metric family (the service decides; clients
    read it rather than working it out from the runs)."""

    id: int
    name: str
    source: str
    revision: str | None
    spec: dict[str, Any]
    architecture: str | None
    n_layers: int | None
    d_model: int | None
    n_heads: int | None
    d_mlp: int | None
    d_vocab: int | None
    d_vocab_real: int | None
    n_ctx: int | None
    n_params: int | None
    normalization_type: str | None
    parallel_attn_mlp: bool | None
    processing: AppliedProcessing
    refit_families: list[str]
    registered_at: datetime
    # The parity report of the model's float32 load; null until it has been loaded.
    parity: ParityReport | None = None
    n_experts: int | None = None  # experts per MLP layer (1: dense); null until loaded
    current_runs: CurrentRuns = {}
    current_run_basis: CurrentRunBasis = {}


class ModelDetail(Model):
    """A model with its runs: how many, its current run (its default run, else its latest),
    its default run, the families pinned to another run, and other registrations of its name."""

    n_runs: int = 0
    current_run_id: int | None = None
    same_name_ids: list[int] = []
    default_run_id: int | None = None
    pinned: dict[str, int] = {}


class DefaultRun(msgspec.Struct):
    """A registration's default run: whether it was queued (`job_id` when the registration
    queued it itself; reconciliation queues it a moment later otherwise), what it would cost,
    and in words why it was or was not queued and how to ask for it."""

    queued: bool
    job_id: int | None
    estimate: Estimate | None
    detail: str


class Registered(Model):
    """A registration's answer: the model, and its default run (null without a job system)."""

    default_run: DefaultRun | None = None


class ModelPage(msgspec.Struct):
    items: list[Model]
    total: int
    limit: int
    offset: int
    next_offset: int | None


class ProcessingRequest(msgspec.Struct, forbid_unknown_fields=True):
    fold_ln: bool = True
    center_writing_weights: bool = True
    center_unembed: bool = True
    fold_value_biases: bool = True


ModelName = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=200,
        pattern=r"^(?!\d+$)[A-Za-z0-9][A-Za-z0-9._+-]*$",
        description="letters, digits, `._+-`; not all digits (ids are numbers)",
    ),
]


class RegisterModel(msgspec.Struct, forbid_unknown_fields=True):
    """Register a model without computing anything."""

    source: Annotated[
        str,
        msgspec.Meta(
            min_length=1,
            max_length=1000,
            description="a TransformerLens official name (e.g. gpt2), a zoo model (zoo:tiny-4l-s0) "
            "or a checkpoint directory under a configured checkpoint root",
        ),
    ]
    name: ModelName | None = None  # default: the checkpoint folder's name, or the source's
    revision: str | None = None
    processing: ProcessingRequest | None = None
    default_run: Annotated[
        bool,
        msgspec.Meta(
            description="true: queue the model's default run now, whatever it costs; false "
            "(default): queued automatically when its estimate is within "
            "STRATA_JOBS__AUTO_RUN_MAX_TFLOP and reconciliation is on, else only when asked"
        ),
    ] = False
