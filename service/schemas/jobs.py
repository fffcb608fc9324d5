"""Jobs: submissions, their state and live progress; what workers send and are told."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import msgspec

Family = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]


class LensOptions(msgspec.Struct, forbid_unknown_fields=True):
    """How the job's tuned lens is trained (the `tuned_lens` family; docs/metrics.md), or the
    stored lens it evaluates instead. Omitted fields take the recipe's defaults. Every field but
    `lens` is part of the lens's key and of the run's identity."""

    lens: (
        Annotated[
            str,
            msgspec.Meta(
                min_length=1,
                max_length=64,
                description="key of a stored lens to evaluate instead of training one "
                "(`strata lens list`; checked against the model at submission)",
            ),
        ]
        | None
    ) = None
    steps: (
        Annotated[int, msgspec.Meta(ge=1, le=1_000_000, description="optimizer steps (250)")] | None
    ) = None
    sequences_per_step: (
        Annotated[int, msgspec.Meta(ge=1, le=1_000_000, description="sequences per step (8)")]
        | None
    ) = None
    train_sequences: (
        Annotated[
            int,
            msgspec.Meta(
                ge=1,
                le=1_000_000,
                description="training windows of the token source, never evaluated (256)",
            ),
        ]
        | None
    ) = None
    lr: Annotated[float, msgspec.Meta(gt=0, description="SGD learning rate (1.0)")] | None = None
    momentum: Annotated[float, msgspec.Meta(ge=0, lt=1, description="(0.9)")] | None = None
    weight_decay: Annotated[float, msgspec.Meta(ge=0, description="(0.001)")] | None = None
    warmup_steps: (
        Annotated[int, msgspec.Meta(ge=0, le=1_000_000, description="linear warm-up (0)")] | None
    ) = None
    clip_grad_norm: Annotated[float, msgspec.Meta(gt=0, description="(1.0)")] | None = None
    seed: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] | None = None


class SubmitJob(msgspec.Struct, forbid_unknown_fields=True):
    """Compute a registered model's metrics. Omitted fields take the deployment's defaults
    (`STRATA_JOBS__*`)."""

    model: Annotated[
        str, msgspec.Meta(min_length=1, max_length=1000, description="registered model name or id")
    ]
    metrics: (
        Annotated[
            list[Family],
            msgspec.Meta(
                min_length=1, max_length=32, description=("metric families (default: all)")
            ),
        ]
        | None
    ) = None
    tokens: (
        Annotated[
            str,
            msgspec.Meta(
                min_length=1,
                max_length=4096,
                description=(
                    "builtin, corpus:<path under a configured root>, "
                    "source:<stored token source id>, or pile"
                ),
            ),
        ]
        | None
    ) = None
    n_sequences: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] | None = None
    seq_len: (
        Annotated[
            int,
            msgspec.Meta(
                ge=3,
                le=1_000_000,
                description=("tokens per sequence, BOS included; at most the model's context"),
            ),
        ]
        | None
    ) = None
    device: (
        Annotated[
            str,
            msgspec.Meta(
                max_length=16, description=("cpu or cuda (default: whichever worker takes it)")
            ),
        ]
        | None
    ) = None
    dtype: (
        Annotated[str, msgspec.Meta(max_length=16, description=("float32, bfloat16 or float16"))]
        | None
    ) = None
    force: bool = False
    queue: Annotated[
        str,
        msgspec.Meta(
            min_length=1,
            max_length=64,
            pattern=r"^[A-Za-z0-9._-]+$",
            description=(
                "the broker queue (default gpu): route big models to the workers started with "
                "`strata worker --queues <name>` on big GPUs"
            ),
        ),
    ] = "gpu"
    tuned_lens: (
        Annotated[
            LensOptions,
            msgspec.Meta(
                description="the tuned lens's training settings or a stored lens's key (needs "
                "tuned_lens in metrics)"
            ),
        ]
        | None
    ) = None


class JobProgress(msgspec.Struct):
    """Units of work done of total, throughput and the time left, as the worker last said."""

    done: int
    total: int
    fraction: float
    tokens_per_s: float
    eta_s: float | None


class WorkerTime(msgspec.Struct):
    """How long a run would take on one worker that could take it: `overhead_s` plus the run's
    FLOPs at `flops_per_s`, its measured rate in the run's dtype (the estimated FLOPs of its last
    finished jobs in that dtype over the seconds their runs spent computing; `overhead_s` is the
    median of their other seconds: loading the model, delivering the results); null without
    one, and `note` says why."""

    worker: str
    device: str
    flops_per_s: float | None
    seconds: float | None
    jobs_measured: int
    note: str
    overhead_s: float | None = None
    # the largest FLOPs among the jobs the rate was measured on: a run more than ten times that
    # is timed by extrapolation (`note` and the estimate's `summary` say so)
    largest_job_flops: float | None = None


class Estimate(msgspec.Struct):
    """What a run would cost (`service.jobs.estimate`): FLOPs (`compute.flops`), peak device
    memory — weights plus the batch's working set — and the host's while loading
    (`compute.memory`), and its time on each worker that could take it (`seconds`: the fastest
    with a measured rate; null when none has one). Null where the model's numbers are not known
    before loading; `notes` say what is not counted or known."""

    flops: float | None
    peak_memory_bytes: int | None
    weights_bytes: int | None
    bytes_per_sequence: int | None
    load_peak_host_bytes: int | None
    seconds: float | None
    workers: list[WorkerTime]
    notes: list[str]
    summary: str = ""  # the estimate in one line, as the CLI prints it


class Job(msgspec.Struct):
    id: int
    state: str
    model: str
    model_id: int
    run_id: int | None
    config_hash: str
    metric_version: str
    families: list[str]
    device: str | None
    dtype: str
    reason: str
    queue: str
    forced: bool
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    wall_s: float | None
    progress: JobProgress | None
    worker: str | None
    attempts: int
    error: str | None
    config: dict[str, Any]
    # what it would cost: in the answer to its submission (null in other answers)
    estimate: Estimate | None = None


class JobPage(msgspec.Struct):
    items: list[Job]
    total: int


class Claim(msgspec.Struct, forbid_unknown_fields=True):
    dispatch: Annotated[int, msgspec.Meta(ge=0)]
    worker: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    device: Annotated[str, msgspec.Meta(min_length=1, max_length=32)]


class Claimed(msgspec.Struct):
    config: dict[str, Any]
    device: str | None
    attempt: int


class Heartbeat(msgspec.Struct, forbid_unknown_fields=True):
    dispatch: Annotated[int, msgspec.Meta(ge=0)]
    worker: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    done: Annotated[int, msgspec.Meta(ge=0)] = 0
    total: Annotated[int, msgspec.Meta(ge=0)] = 0
    tokens_per_s: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    elapsed_s: Annotated[float, msgspec.Meta(ge=0)] = 0.0


class HeartbeatAnswer(msgspec.Struct):
    stop: bool


class Failure(msgspec.Struct, forbid_unknown_fields=True):
    dispatch: Annotated[int, msgspec.Meta(ge=0)]
    worker: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    error: Annotated[str, msgspec.Meta(min_length=1, max_length=100_000)]


class Reconciled(msgspec.Struct):
    queued: list[int]


class WorkerBeat(msgspec.Struct, forbid_unknown_fields=True):
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    device: Annotated[str, msgspec.Meta(min_length=1, max_length=32)]
    dtype: Annotated[str, msgspec.Meta(min_length=1, max_length=16)]
    queues: list[Annotated[str, msgspec.Meta(max_length=64)]]
    host: Annotated[str, msgspec.Meta(max_length=255)]
    pid: int


class Worker(msgspec.Struct):
    name: str
    device: str
    dtype: str
    queues: list[str]
    host: str
    pid: int
    seen_s_ago: float
