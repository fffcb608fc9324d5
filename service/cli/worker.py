"""`strata worker` and `strata beat`: the Celery processes (see `service/worker/launch.py`)."""

from __future__ import annotations

import os

import click

from service.cli.errors import EXIT_BAD_INPUT, fail
from service.jobs.broker import COMPUTE_QUEUE
from service.worker.launch import WARM_SHUTDOWN_S


def _apply(api_url: str | None) -> None:
    """Options that are settings travel as the environment (child processes inherit it)."""
    if api_url:
        os.environ["STRATA_API_URL"] = api_url


@click.command()
@click.option(
    "--gpus",
    default=None,
    help="comma-separated GPU indices: one worker process "
    "per GPU, each seeing only its own (sets --device cuda)",
)
@click.option(
    "--device",
    default=None,
    help="device of a single worker process (default: STRATA_WORKER__DEVICE, cpu)",
)
@click.option(
    "--queues",
    default=COMPUTE_QUEUE,
    show_default=True,
    help="comma-separated queues to consume (route big models to big GPUs by giving "
    "them their own queue)",
)
@click.option("--api-url", default=None, help="where the API runs (default: STRATA_API_URL)")
@click.option("--name", default=None, help="worker name prefix (default: the device)")
@click.option(
    "--max-tasks-per-child",
    type=click.IntRange(1),
    default=None,
    help="replace the worker process after this many jobs",
)
@click.option(
    "--max-memory-mb",
    type=click.IntRange(0),
    default=None,
    help="replace the worker process after a job that left it above this size",
)
@click.option(
    "--warm-shutdown-s",
    type=click.FloatRange(min=0),
    default=WARM_SHUTDOWN_S,
    show_default=True,
    help="on SIGTERM the running job may finish for this long; "
    "then it is abandoned (the API sends it again) and the worker exits",
)
@click.option("--loglevel", default="INFO", show_default=True)
def worker(
    gpus: str | None,
    device: str | None,
    queues: str,
    api_url: str | None,
    name: str | None,
    max_tasks_per_child: int | None,
    max_memory_mb: int | None,
    warm_shutdown_s: float,
    loglevel: str,
) -> None:
    """Run computations: a Celery worker per GPU (or one on the CPU), one job at a time each.
    Results go to the API over HTTP; the worker never opens the database."""
    import socket

    from service.worker.launch import gpu_children, run_celery, worker_argv

    _apply(api_url)
    if max_tasks_per_child is not None:
        os.environ["STRATA_WORKER__MAX_TASKS_PER_CHILD"] = str(max_tasks_per_child)
    if max_memory_mb is not None:
        os.environ["STRATA_WORKER__MAX_MEMORY_MB"] = str(max_memory_mb)
    queue_list = [q.strip() for q in queues.split(",") if q.strip()]
    if not queue_list:
        fail("--queues names no queue", EXIT_BAD_INPUT)
    if gpus is not None:
        if device not in (None, "cuda"):
            fail("--gpus runs on cuda; give --gpus or --device, not both", EXIT_BAD_INPUT)
        try:
            indices = [int(g) for g in gpus.split(",") if g.strip()]
        except ValueError:
            fail(f"--gpus {gpus!r}: give comma-separated GPU indices, e.g. 0,1", EXIT_BAD_INPUT)
        if not indices:
            fail("--gpus names no GPU", EXIT_BAD_INPUT)
        raise SystemExit(gpu_children(indices, queue_list, name, {}, warm_shutdown_s))
    if device is not None:
        if device.split(":")[0] not in ("cpu", "cuda", "mps"):
            fail(f"--device {device!r}: give cpu, cuda or mps", EXIT_BAD_INPUT)
        os.environ["STRATA_WORKER__DEVICE"] = device
    if device == "cpu":
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    from service.settings import get_settings

    get_settings.cache_clear()
    kind = get_settings().worker.device
    label = (
        os.environ.get("STRATA_WORKER_NAME")
        or f"{name or kind.split(':')[0]}@{socket.gethostname()}"
    )
    os.environ["STRATA_WORKER_NAME"] = label
    run_celery(
        worker_argv(queue_list, f"{label}-{os.getpid()}", loglevel), warm_shutdown_s=warm_shutdown_s
    )


@click.command()
@click.option("--api-url", default=None, help="where the API runs (default: STRATA_API_URL)")
@click.option("--loglevel", default="INFO", show_default=True)
def beat(api_url: str | None, loglevel: str) -> None:
    """The deployment's one scheduler: asks the API to reconcile every
    STRATA_JOBS__RECONCILE_INTERVAL_S seconds, and consumes the light `ops` queue. Run exactly
    one per deployment."""
    import socket

    from service.worker.launch import beat_argv, run_celery

    _apply(api_url)
    run_celery(beat_argv(f"beat@{socket.gethostname()}-{os.getpid()}", loglevel))
