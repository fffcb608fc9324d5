"""The Celery app, built from the settings: `celery -A service.worker.app ...` (Flower too).

Broker: `STRATA_BROKER_URL` (Redis or RabbitMQ), or — when empty — Celery's filesystem transport
under `STRATA_DATA_DIR/broker`, which needs no service. Tasks are acknowledged late (after they
ran), one at a time per process (prefetch 1), and re-queued when the process running them dies;
the API's leases cover the brokers that cannot do that (the filesystem transport drops a message
once a worker takes it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from celery import Celery
from kombu import Exchange, Queue

from service.jobs.broker import COMPUTE_QUEUE, COMPUTE_TASK, OPS_QUEUE, RECONCILE_TASK
from service.settings import Settings, get_settings

# How long a new pool process may take to report that it is up (see `make_app`).
PROC_ALIVE_TIMEOUT_S = 120.0
WORKER_LOST_WAIT_S = 2.0


def broker_options(settings: Settings) -> tuple[str, dict[str, Any]]:
    """The broker URL and transport options of these settings."""
    timeout = settings.jobs.publish_timeout_s
    if settings.broker_url:
        options: dict[str, Any] = {
            "max_retries": 2,
            "interval_start": 0,
            "interval_step": 0.5,
            "interval_max": 1,
        }
        if settings.broker_url.startswith(("redis", "rediss")):
            options |= {
                "socket_connect_timeout": timeout,
                "socket_timeout": timeout * 4,
                "visibility_timeout": settings.worker.time_limit_s + 600,
            }
        return settings.broker_url, options
    folder = filesystem_broker_dir(settings)
    return "filesystem://", {
        "data_folder_in": str(folder / "queue"),
        "data_folder_out": str(folder / "queue"),
        "processed_folder": str(folder / "processed"),
        "control_folder": str(folder / "control"),
        "store_processed": False,
        "polling_interval": 0.2,
    }


def filesystem_broker_dir(settings: Settings, *, create: bool = False) -> Path:
    """The filesystem broker's folder (made by the processes that use it, not on import)."""
    folder = settings.data_dir.resolve() / "broker"
    if create:
        for sub in ("queue", "processed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
    return folder


def make_app(settings: Settings, *, create_broker_dir: bool = False) -> Celery:
    """The Celery app of these settings; `create_broker_dir` for a process that will use the
    filesystem broker (importing this module creates nothing)."""
    if not settings.broker_url and create_broker_dir:
        filesystem_broker_dir(settings, create=True)
    url, options = broker_options(settings)
    app = Celery("strata", broker=url, include=["service.worker.tasks"])
    if url == "filesystem://":
        app.conf.broker_transport = "service.worker.transport:Transport"
    app.conf.update(
        broker_transport_options=options,
        broker_connection_timeout=settings.jobs.publish_timeout_s,
        broker_connection_retry_on_startup=True,
        task_queues=[
            Queue(name, Exchange(name, type="direct"), routing_key=name)
            for name in (COMPUTE_QUEUE, OPS_QUEUE)
        ],
        task_default_queue=OPS_QUEUE,
        task_routes={COMPUTE_TASK: {"queue": COMPUTE_QUEUE}, RECONCILE_TASK: {"queue": OPS_QUEUE}},
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        worker_prefetch_multiplier=1,
        # Celery's prefork pool, whose blocking pool (the filesystem broker's) releases the
        # queue locks a child killed by a signal held: otherwise its replacement waits on them
        # forever and the worker never claims a job again (service/worker/pool.py).
        worker_pool="service.worker.pool:TaskPool",
        # A new pool process reports "up" after its warm-up (`tasks._warm_child`: a model load,
        # ~0.6 s of CPU, seconds on a busy machine; it was ~6 s while each child still imported
        # TransformerLens itself). Celery's default of 4 s killed and replaced it on a busy
        # machine, over and over, so the worker never took a job again.
        worker_proc_alive_timeout=PROC_ALIVE_TIMEOUT_S,
        # How long a dead pool child's job waits for a result it may have sent before it died,
        # before it counts as lost (and, acknowledged late, is sent again). The result travels
        # over a local pipe; Celery's 10 s held every crash, and every warm shutdown that
        # abandons a job, 10 s longer.
        worker_lost_wait=WORKER_LOST_WAIT_S,
        worker_max_tasks_per_child=settings.worker.max_tasks_per_child,
        worker_max_memory_per_child=settings.worker.max_memory_mb * 1024 or None,
        task_soft_time_limit=settings.worker.soft_time_limit_s,
        task_time_limit=settings.worker.time_limit_s,
        worker_hijack_root_logger=False,
        # Task events feed Flower; the filesystem transport has no fanout to carry them.
        worker_send_task_events=bool(settings.broker_url),
        task_send_sent_event=bool(settings.broker_url),
        beat_schedule={
            "reconcile": {
                "task": RECONCILE_TASK,
                "schedule": settings.jobs.reconcile_interval_s,
                "options": {"queue": OPS_QUEUE, "expires": settings.jobs.reconcile_interval_s},
            }
        },
        beat_schedule_filename=str(settings.data_dir.resolve() / "beat-schedule"),
        timezone="UTC",
    )
    return app


app = make_app(get_settings())
