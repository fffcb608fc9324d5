"""The Celery tasks: thin, everything else is in `execute.py` and `compute`."""

from __future__ import annotations

import gc
import logging
import os
import socket
import threading

from celery import signals

from service.client.errors import ApiError, UnreachableError
from service.jobs.broker import COMPUTE_TASK, OPS_QUEUE, RECONCILE_TASK
from service.settings import get_settings
from service.worker.app import app
from service.worker.cache import process_cache
from service.worker.client import ApiClient
from service.worker.execute import Identity, run_job

log = logging.getLogger("strata.worker")


def client() -> ApiClient:
    settings = get_settings()
    return ApiClient(settings.api_url, settings.client_key())


def identity() -> Identity:
    """This worker: `strata worker` sets STRATA_WORKER_NAME; the device is its settings'."""
    settings = get_settings()
    name = os.environ.get("STRATA_WORKER_NAME") or f"worker@{socket.gethostname()}"
    return Identity(name, settings.worker.device)


@app.task(name=COMPUTE_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)
def compute_job(self: object, job_id: int, dispatch: int) -> str:
    settings = get_settings()
    with client() as api:
        return run_job(
            job_id,
            dispatch,
            settings=settings,
            client=api,
            me=identity(),
            cache=process_cache(settings.worker.model_cache_size),
        )


@app.task(name=RECONCILE_TASK)
def reconcile() -> list[int]:
    """Ask the API (the database's owner) to queue what registered models lack."""
    with client() as api:
        return api.reconcile()


def _queues(worker: object) -> list[str]:
    """The queues this worker process consumes (`sender` of Celery's worker signals)."""
    running = getattr(worker, "app", app)  # the app this worker process runs
    return sorted(running.amqp.queues.consume_from or {})


@signals.worker_init.connect
def _preload(sender: object = None, **_: object) -> None:
    """Import the engine before the pool forks: every child (a fresh one after each recycling
    too) starts with torch, transformers and TransformerLens loaded instead of spending seconds
    of its own importing them. Quiet the per-request log of the HTTP client."""
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if _queues(sender) == [OPS_QUEUE]:  # `strata beat`: its reconcile task is one HTTP call
        return
    import compute.run  # noqa: F401
    import service.exports  # noqa: F401
    from compute.corpus import builtin_corpus_documents
    from compute.models import import_engine

    # Imports only, and pure Python, cached, inherited by every child. No torch work happens
    # here: a parent that has run torch's thread pools before forking leaves its children
    # deadlocked.
    import_engine()
    builtin_corpus_documents()
    # What every pool child inherits lives as long as it does: frozen, a child's collections
    # (one after each checkpoint load) skip it (0.36 s a collection otherwise) and touch none
    # of its pages, so they stay shared with this process.
    gc.freeze()


@signals.worker_process_init.connect
def _warm_child(**_: object) -> None:
    """In each pool process, before it takes a job: the first model load of a process
    initialises the rest of transformers and TransformerLens; a tiny zoo model pays for it
    here instead of the first job, and stays in the process's model cache (a job on it then
    loads nothing)."""
    from celery.worker import state

    from compute.models import resolve_model_spec, zoo_names

    if state.should_stop is not None or state.should_terminate is not None:
        # Forked while the worker shuts down (billiard replaces a child killed by the warm
        # shutdown's deadline): this child takes no job, so it loads nothing.
        log.info("pool process %d started during shutdown: no warm-up", os.getpid())
        return
    settings = get_settings()
    if "tiny-2l-s0" in zoo_names():
        try:
            spec = resolve_model_spec("zoo:tiny-2l-s0")
            if settings.worker.device == "cpu":
                process_cache(settings.worker.model_cache_size).get(spec, "cpu")
            else:  # the cache is for the worker's device; warm up on the CPU beside it
                from compute.models import load_model

                load_model(spec, "cpu")
        except Exception as exc:  # a warm-up only: the worker works without it
            log.warning("warm-up load failed: %s", exc)
    log.info("pool process %d is warm", os.getpid())


@signals.worker_ready.connect
def _announce(sender: object = None, **_: object) -> None:
    """While this worker runs, tell the API every few seconds that it is alive and what it runs
    on (the API refuses jobs for devices no worker has)."""
    settings = get_settings()
    me, api = identity(), client()
    queues = _queues(sender)

    def loop() -> None:
        while True:
            try:
                api.worker_alive(
                    name=me.name,
                    device=me.device,
                    dtype=settings.worker.dtype,
                    queues=queues,
                    host=socket.gethostname(),
                    pid=os.getpid(),
                )
            except (ApiError, UnreachableError) as exc:
                log.debug("worker heartbeat not delivered: %s", exc)
            threading.Event().wait(settings.worker.heartbeat_s)

    threading.Thread(target=loop, name="strata-worker-alive", daemon=True).start()
