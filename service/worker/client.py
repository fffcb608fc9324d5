"""The worker's side of the HTTP conversation with the API (the database's one owner), on the
shared transport (`service.client.transport`) and decoded with the API's schemas.

Every call retries connection failures and 5xx answers with exponential backoff (capped), for
as long as its deadline allows: results finished while the API is down are delivered once it is
back (the API makes each of these calls idempotent: claims by dispatch, ingest by configuration
hash). A 4xx answer is final and raised as the `ApiError` of its status, with the API's `detail`;
an exhausted deadline as `UnreachableError` (both `service.client.errors`).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from service.client.transport import READS, RetryPolicy, Transport, decode
from service.schemas.jobs import Claimed, HeartbeatAnswer, Reconciled
from service.schemas.runs import IngestSummary

ARROW = "application/vnd.apache.arrow.stream"
V1 = "/api/v1"


def until(deadline_s: float) -> RetryPolicy:
    """The worker's policy: every method, 5xx included, from 0.2 s doubling to 10 s, until
    `deadline_s` has passed; a 429 is final like any 4xx (not waited out)."""
    return RetryPolicy(
        methods=READS | {"POST"},
        attempts=None,
        deadline_s=deadline_s,
        backoff_s=0.2,
        max_backoff_s=10.0,
        server_errors=True,
        rate_limit_wait_s=0.0,
    )


class ApiClient:
    """The API at `url`, with the worker's key; a context manager that closes its connections."""

    def __init__(self, url: str, key: str | None, timeout_s: float = 30.0) -> None:
        self.url, self.key, self.timeout_s = url, key, timeout_s

    @cached_property
    def _transport(self) -> Transport:
        return Transport(self.url, self.key, timeout=self.timeout_s)

    def close(self) -> None:
        if "_transport" in self.__dict__:
            self._transport.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def claim(self, job_id: int, dispatch: int, worker: str, device: str) -> Claimed:
        answer = self._transport.request(
            "POST",
            f"{V1}/jobs/{job_id}/claim",
            policy=until(600),
            json={"dispatch": dispatch, "worker": worker, "device": device},
        )
        return decode(answer, Claimed)

    def heartbeat(self, job_id: int, dispatch: int, worker: str, **progress: Any) -> bool:
        """True: stop (cancelled, or the job was handed to another dispatch)."""
        answer = self._transport.request(
            "POST",
            f"{V1}/jobs/{job_id}/heartbeat",
            policy=until(5),
            json={"dispatch": dispatch, "worker": worker, **progress},
        )
        return decode(answer, HeartbeatAnswer).stop

    def fail(self, job_id: int, dispatch: int, worker: str, error: str, deadline_s: float) -> None:
        self._transport.request(
            "POST",
            f"{V1}/jobs/{job_id}/fail",
            policy=until(deadline_s),
            json={"dispatch": dispatch, "worker": worker, "error": error},
        )

    def deliver(self, job_id: int, body: bytes, deadline_s: float) -> IngestSummary:
        answer = self._transport.request(
            "POST",
            f"{V1}/runs/ingest",
            policy=until(deadline_s),
            content=body,
            params={"job_id": job_id},
            headers={"Content-Type": ARROW},
        )
        return decode(answer, IngestSummary)

    def reconcile(self) -> list[int]:
        answer = self._transport.request("POST", f"{V1}/jobs/reconcile", policy=until(60))
        return decode(answer, Reconciled).queued

    def worker_alive(self, **about: Any) -> None:
        self._transport.request("POST", f"{V1}/workers/heartbeat", policy=until(2), json=about)
