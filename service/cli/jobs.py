"""`strata jobs ...` and `strata models ...`: the job API and model registration from the shell.

They talk to a running service (`--url`, default STRATA_API_URL) with the key from
STRATA_API_KEY (or the key file `strata serve` writes). `strata models add` with no service
running registers into the database file directly (the CLI is then its one writer).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click
import httpx

from service.cli_errors import (
    EXIT_BAD_INPUT,
    EXIT_JOB,
    EXIT_UNREACHABLE,
    exit_code_of,
    fail,
)
from service.settings import get_settings
from service.worker.client import error_detail

FINAL = ("succeeded", "failed", "cancelled")
url_option = click.option("--url", default=None,
                          help="the service (default: STRATA_API_URL, http://127.0.0.1:8000)")


# How long one command waits out the service's rate limit (429 + Retry-After) before giving up.
RATE_LIMIT_WAIT_S = 60.0


def _call(url: str | None, method: str, path: str, **kwargs: Any) -> Any:
    """One request; exits 6 if the service cannot be reached, 2 with the API's message on a
    4xx, 6 on a 503 (the broker is down). A 429 is retried after its Retry-After while the
    waits add up to at most `RATE_LIMIT_WAIT_S`; then it exits 6."""
    settings = get_settings()
    key = settings.client_key()
    headers = {"X-API-Key": key} if key else {}
    waited = 0.0
    while True:
        try:
            answer = httpx.request(method, f"{(url or settings.api_url).rstrip('/')}{path}",
                                   headers=headers, timeout=60, **kwargs)
        except httpx.HTTPError as exc:
            fail(f"the service at {url or settings.api_url} cannot be reached ({exc}); start "
                 "it with `strata serve` or give --url", EXIT_UNREACHABLE)
        pause = _retry_after(answer) if answer.status_code == 429 else None
        if pause is None or waited + pause > RATE_LIMIT_WAIT_S:
            break
        click.echo(f"rate limited by the service; retrying in {pause:g} s", err=True)
        time.sleep(pause)
        waited += pause
    if answer.status_code == 429:
        fail(f"{error_detail(answer)} (HTTP 429)", EXIT_UNREACHABLE)
    if answer.status_code >= 400:
        fail(f"{error_detail(answer)} (HTTP {answer.status_code})",
             EXIT_UNREACHABLE if answer.status_code >= 500 else EXIT_BAD_INPUT)
    return answer.json() if answer.content else None


def _retry_after(answer: httpx.Response) -> float | None:
    try:
        return max(float(answer.headers["Retry-After"]), 0.0)
    except (KeyError, ValueError):
        return None


def _describe(job: dict[str, Any]) -> str:
    line = f"job {job['id']} {job['state']}: {job['model']} [{', '.join(job['families'])}]"
    p = job.get("progress")
    if job["state"] == "running" and p:
        eta = f", ETA {p['eta_s']:.0f} s" if p.get("eta_s") is not None else ""
        line += f" {100 * p['fraction']:.0f}% ({p['done']}/{p['total']}, " \
                f"{p['tokens_per_s']:,.0f} tok/s{eta})"
    if job.get("run_id") is not None:
        line += f" -> run {job['run_id']}"
    if job.get("error"):
        line += f"\n  error: {job['error']}"
    return line


@click.group()
def jobs() -> None:
    """Submit, follow and cancel computations on a running service."""


@jobs.command("submit")
@click.option("--model", required=True, help="registered model name or id")
@click.option("--metrics", default=None, help="comma-separated families (default: all)")
@click.option("--tokens", default=None,
              help="builtin, corpus:<path>, source:<stored token source id> or pile")
@click.option("--n-sequences", type=int, default=None)
@click.option("--seq-len", type=int, default=None)
@click.option("--device", default=None)
@click.option("--dtype", default=None)
@click.option("--force", is_flag=True, help="compute again even if results exist")
@click.option("--queue", default=None, help="broker queue (default gpu; e.g. a queue of big-GPU "
              "workers)")
@click.option("--watch", "watch_it", is_flag=True, help="then follow it with a progress bar")
@url_option
def submit(model: str, metrics: str | None, tokens: str | None, n_sequences: int | None,
           seq_len: int | None, device: str | None, dtype: str | None, force: bool,
           queue: str | None, watch_it: bool, url: str | None) -> None:
    """Queue a computation; prints the job as JSON."""
    body: dict[str, Any] = {"model": model, "force": force}
    if metrics is not None:
        body["metrics"] = [m.strip() for m in metrics.split(",") if m.strip()]
    for key, value in (("tokens", tokens), ("n_sequences", n_sequences), ("seq_len", seq_len),
                       ("device", device), ("dtype", dtype), ("queue", queue)):
        if value is not None:
            body[key] = value
    job = _call(url, "POST", "/api/v1/jobs", json=body)
    click.echo(json.dumps(job, indent=2))
    if watch_it:
        _watch(url, int(job["id"]))


@jobs.command("status")
@click.argument("job_id", type=int)
@url_option
def status(job_id: int, url: str | None) -> None:
    """One job, as JSON."""
    click.echo(json.dumps(_call(url, "GET", f"/api/v1/jobs/{job_id}"), indent=2))


@jobs.command("list")
@click.option("--state", default=None)
@click.option("--model", default=None)
@click.option("--limit", type=int, default=50, show_default=True)
@url_option
def list_jobs(state: str | None, model: str | None, limit: int, url: str | None) -> None:
    """Jobs, newest first, one line each."""
    params: dict[str, Any] = {"limit": limit}
    if state:
        params["state"] = state
    if model:
        params["model"] = model
    page = _call(url, "GET", "/api/v1/jobs", params=params)
    for job in page["items"]:
        click.echo(_describe(job))
    click.echo(f"({len(page['items'])} of {page['total']})", err=True)


@jobs.command("cancel")
@click.argument("job_id", type=int)
@url_option
def cancel(job_id: int, url: str | None) -> None:
    """Cancel a queued or running job."""
    click.echo(_describe(_call(url, "DELETE", f"/api/v1/jobs/{job_id}")))


@jobs.command("watch")
@click.argument("job_id", type=int)
@url_option
def watch(job_id: int, url: str | None) -> None:
    """Follow a job with a progress bar until it ends (exit 7 if it failed or was cancelled)."""
    _watch(url, job_id)


def _watch(url: str | None, job_id: int) -> None:
    import sys

    from tqdm import tqdm

    bar = tqdm(total=1, unit="step", desc=f"job {job_id}", dynamic_ncols=True, file=sys.stderr)
    try:
        while True:
            job = _call(url, "GET", f"/api/v1/jobs/{job_id}")
            p = job.get("progress")
            if p:
                bar.total = p["total"]
                bar.set_postfix_str(f"{p['tokens_per_s']:,.0f} tok/s", refresh=False)
                bar.update(p["done"] - bar.n)
            bar.set_description(f"job {job_id} {job['state']}")
            if job["state"] in FINAL:
                if job["state"] == "succeeded":
                    bar.update(bar.total - bar.n)
                break
            time.sleep(0.5)
    finally:
        bar.close()
    click.echo(_describe(job))
    if job["state"] != "succeeded":
        raise SystemExit(EXIT_JOB)


@click.group()
def models() -> None:
    """Register and list models."""


@models.command("add")
@click.argument("source")
@click.option("--name", default=None, help="the model's name in URLs (default: the checkpoint "
              "folder's name, or the source's)")
@click.option("--revision", default=None)
@url_option
def add(source: str, name: str | None, revision: str | None, url: str | None) -> None:
    """Register a model (zoo:NAME, a checkpoint folder, a TransformerLens name). With a service
    running, through it (its default run is then queued); otherwise into the database file."""
    path = Path(source)
    ref = str(path.resolve()) if (path / "config.json").is_file() else source
    body = {"source": ref, **({"name": name} if name else {}),
            **({"revision": revision} if revision else {})}
    settings = get_settings()
    if url is not None or _service_up(settings.api_url):
        model = _call(url, "POST", "/api/v1/models", json=body)
    else:
        model = _register_locally(body, path)
    click.echo(f"registered {model['name']} (id {model['id']}, {model['source']})")


def _service_up(api_url: str) -> bool:
    try:
        return httpx.get(f"{api_url.rstrip('/')}/api/v1/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _register_locally(body: dict[str, Any], path: Path) -> dict[str, Any]:
    import msgspec

    from compute.errors import StrataError
    from service.api.queries.registration import as_model, register
    from service.api.schemas.models import RegisterModel
    from service.store import Store
    from service.store.migrate import ensure_current

    settings = get_settings()
    if path.is_dir():  # a local folder named on the command line is allowed as it is
        roots = [*settings.api.checkpoint_roots, path.resolve().parent]
        settings = settings.model_copy(update={"api": settings.api.model_copy(
            update={"checkpoint_roots": roots})})
    try:
        request = msgspec.convert(body, RegisterModel)
    except msgspec.ValidationError as exc:
        fail(f"{exc}", EXIT_BAD_INPUT)
    try:
        with Store.open(settings.database) as store:
            ensure_current(store)
            model, _ = register(store, settings, request)
            return dict(msgspec.to_builtins(as_model(model)))
    except StrataError as exc:
        detail = getattr(exc, "detail", str(exc))
        fail(detail, exit_code_of(exc) if exit_code_of(exc) != 1 else EXIT_BAD_INPUT)


@models.command("list")
@url_option
def list_models(url: str | None) -> None:
    """Registered models (from the running service)."""
    page = _call(url, "GET", "/api/v1/models", params={"limit": 500})
    for m in page["items"]:
        click.echo(f"{m['id']}\t{m['name']}\t{m['source']}\tlayers={m['n_layers']}")
