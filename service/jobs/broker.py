"""Sending jobs to the broker. The message carries only (job id, dispatch number): the worker
asks the API for the configuration when it starts (`claim`), so a message can never run a job
that was cancelled, finished, or re-sent meanwhile."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from service.jobs.errors import BrokerUnavailableError

log = logging.getLogger("strata.jobs")

COMPUTE_TASK = "strata.compute_job"
RECONCILE_TASK = "strata.reconcile"
COMPUTE_QUEUE = "gpu"
OPS_QUEUE = "ops"


class Broker(Protocol):
    def send(self, job_id: int, dispatch: int, queue: str = COMPUTE_QUEUE) -> None: ...


class CeleryBroker:
    """Publishes through a Celery app (the same configuration the workers use)."""

    def __init__(self, app: Any, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s

    def send(self, job_id: int, dispatch: int, queue: str = COMPUTE_QUEUE) -> None:
        """Publish to `queue`; raises `BrokerUnavailableError` if the broker does not take it in
        time."""
        try:
            self.app.send_task(
                COMPUTE_TASK,
                args=[job_id, dispatch],
                queue=queue,
                retry=True,
                retry_policy={
                    "max_retries": 2,
                    "interval_start": 0.0,
                    "interval_step": self.timeout_s / 4,
                    "interval_max": self.timeout_s / 2,
                },
            )
        except Exception as exc:  # kombu raises many types (OperationalError, OSError, ...)
            log.warning("broker refused job %s: %s", job_id, exc)
            raise BrokerUnavailableError(
                f"the job broker cannot be reached ({type(exc).__name__}: {exc}); nothing was "
                "queued. Results can still be read; submit again when the broker is back "
                "(STRATA_BROKER_URL)"
            ) from None
