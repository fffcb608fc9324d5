"""The worker's side of the HTTP conversation with the API (the database's one owner).

Every call retries connection failures and 5xx answers with exponential backoff (capped), for
as long as its deadline allows: results finished while the API is down are delivered once it is
back. A 4xx answer is final and raised as `RefusedError` with the API's message.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx

log = logging.getLogger("strata.worker")

ARROW = "application/vnd.apache.arrow.stream"


def error_detail(answer: httpx.Response) -> str:
    """What an error answer says to fix: the `detail` of the API's error body, else its text."""
    try:
        return str(answer.json().get("detail", answer.text))
    except ValueError:
        return answer.text


class RefusedError(Exception):
    """The API answered 4xx: the request will not succeed by repeating it."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{status}: {detail}")
        self.status, self.detail = status, detail


class UnreachableError(Exception):
    """The API did not answer within the deadline."""


@dataclass
class ApiClient:
    url: str
    key: str | None
    timeout_s: float = 30.0

    def _headers(self) -> dict[str, str]:
        return {"X-API-Key": self.key} if self.key else {}

    def call(self, method: str, path: str, *, deadline_s: float, json: Any = None,
             content: bytes | None = None, params: dict[str, Any] | None = None,
             content_type: str | None = None) -> Any:
        """One API call, retried on connection errors and 5xx until `deadline_s` has passed."""
        headers = self._headers()
        if content_type:
            headers["Content-Type"] = content_type
        end, delay = time.monotonic() + deadline_s, 0.2
        while True:
            try:
                answer = httpx.request(method, f"{self.url.rstrip('/')}{path}", json=json,
                                       content=content, params=params, headers=headers,
                                       timeout=self.timeout_s)
                if answer.status_code < 500:
                    break
                problem = f"HTTP {answer.status_code}"
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if time.monotonic() + delay > end:
                raise UnreachableError(f"{method} {path}: {problem}")
            log.info("API %s %s not answered (%s); retrying in %.1f s", method, path, problem,
                     delay)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)
        if answer.status_code >= 400:
            raise RefusedError(answer.status_code, error_detail(answer))
        return answer.json() if answer.content else None

    def claim(self, job_id: int, dispatch: int, worker: str, device: str) -> dict[str, Any]:
        return dict(self.call("POST", f"/api/v1/jobs/{job_id}/claim", deadline_s=600,
                              json={"dispatch": dispatch, "worker": worker, "device": device}))

    def heartbeat(self, job_id: int, dispatch: int, worker: str, **progress: Any) -> bool:
        """True: stop (cancelled, or the job was handed to another dispatch)."""
        answer = self.call("POST", f"/api/v1/jobs/{job_id}/heartbeat", deadline_s=5,
                           json={"dispatch": dispatch, "worker": worker, **progress})
        return bool(answer["stop"])

    def fail(self, job_id: int, dispatch: int, worker: str, error: str, deadline_s: float
             ) -> None:
        self.call("POST", f"/api/v1/jobs/{job_id}/fail", deadline_s=deadline_s,
                  json={"dispatch": dispatch, "worker": worker, "error": error})

    def deliver(self, job_id: int, body: bytes, deadline_s: float) -> dict[str, Any]:
        return dict(self.call("POST", "/api/v1/runs/ingest", deadline_s=deadline_s,
                              content=body, params={"job_id": job_id}, content_type=ARROW))

    def reconcile(self) -> list[int]:
        return list(self.call("POST", "/api/v1/jobs/reconcile", deadline_s=60)["queued"])

    def worker_alive(self, **about: Any) -> None:
        self.call("POST", "/api/v1/workers/heartbeat", deadline_s=2, json=about)
