"""`strata jobs ...`: submit, follow and cancel computations on a running service (`--url`,
default STRATA_API_URL; see `service/cli/http.py`)."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from service.cli.errors import EXIT_JOB
from service.cli.http import call, url_option
from service.cli.outputs import format_rate

FINAL = ("succeeded", "failed", "cancelled")


def _describe(job: dict[str, Any]) -> str:
    line = f"job {job['id']} {job['state']}: {job['model']} [{', '.join(job['families'])}]"
    p = job.get("progress")
    if job["state"] == "running" and p:
        eta = f", ETA {p['eta_s']:.0f} s" if p.get("eta_s") is not None else ""
        line += (
            f" {100 * p['fraction']:.0f}% ({p['done']}/{p['total']}, "
            f"{format_rate(p['tokens_per_s'])}{eta})"
        )
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
@click.option(
    "--tokens", default=None, help="builtin, corpus:<path>, source:<stored token source id> or pile"
)
@click.option("--n-sequences", type=int, default=None)
@click.option("--seq-len", type=int, default=None)
@click.option("--device", default=None)
@click.option("--dtype", default=None)
@click.option("--force", is_flag=True, help="compute again even if results exist")
@click.option(
    "--queue", default=None, help="broker queue (default gpu; e.g. a queue of big-GPU workers)"
)
@click.option(
    "--lens",
    "lens_key",
    default=None,
    help="tuned_lens: evaluate this stored lens (`strata lens list`) instead of training one",
)
@click.option(
    "--lens-steps", type=int, default=None, help="tuned_lens: training steps (default 250)"
)
@click.option(
    "--lens-train-sequences",
    type=int,
    default=None,
    help="tuned_lens: training windows of the token source, never evaluated (default 256)",
)
@click.option("--watch", "watch_it", is_flag=True, help="then follow it with a progress bar")
@url_option
def submit(
    model: str,
    metrics: str | None,
    tokens: str | None,
    n_sequences: int | None,
    seq_len: int | None,
    device: str | None,
    dtype: str | None,
    force: bool,
    queue: str | None,
    lens_key: str | None,
    lens_steps: int | None,
    lens_train_sequences: int | None,
    watch_it: bool,
    url: str | None,
) -> None:
    """Queue a computation; prints the job as JSON. The --lens options set the tuned lens of a
    job with tuned_lens in --metrics (the API's `tuned_lens` object)."""
    body: dict[str, Any] = {"model": model, "force": force}
    if metrics is not None:
        body["metrics"] = [m.strip() for m in metrics.split(",") if m.strip()]
    for key, value in (
        ("tokens", tokens),
        ("n_sequences", n_sequences),
        ("seq_len", seq_len),
        ("device", device),
        ("dtype", dtype),
        ("queue", queue),
    ):
        if value is not None:
            body[key] = value
    lens = {
        k: v
        for k, v in (
            ("lens", lens_key),
            ("steps", lens_steps),
            ("train_sequences", lens_train_sequences),
        )
        if v is not None
    }
    if lens:
        body["tuned_lens"] = lens
    job = call(url, "POST", "/api/v1/jobs", json=body)
    click.echo(json.dumps(job, indent=2))
    if job.get("estimate"):  # on stderr: stdout stays the job's JSON
        click.echo(f"job {job['id']} estimate: {job['estimate']['summary']}", err=True)
    if watch_it:
        _watch(url, int(job["id"]))


@jobs.command("status")
@click.argument("job_id", type=int)
@url_option
def status(job_id: int, url: str | None) -> None:
    """One job, as JSON."""
    click.echo(json.dumps(call(url, "GET", f"/api/v1/jobs/{job_id}"), indent=2))


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
    page = call(url, "GET", "/api/v1/jobs", params=params)
    for job in page["items"]:
        click.echo(_describe(job))
    click.echo(f"({len(page['items'])} of {page['total']})", err=True)


@jobs.command("cancel")
@click.argument("job_id", type=int)
@url_option
def cancel(job_id: int, url: str | None) -> None:
    """Cancel a queued or running job."""
    click.echo(_describe(call(url, "DELETE", f"/api/v1/jobs/{job_id}")))


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
            job = call(url, "GET", f"/api/v1/jobs/{job_id}")
            p = job.get("progress")
            if p:
                bar.total = p["total"]
                bar.set_postfix_str(format_rate(p["tokens_per_s"]), refresh=False)
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
    if job.get("run_id") is not None:
        measured = _measured(call(url, "GET", f"/api/v1/runs/{job['run_id']}"), job)
        if measured:
            click.echo(measured)


def _measured(run: dict[str, Any], job: dict[str, Any]) -> str | None:
    """What the job took, as its worker measured it, to hold beside the estimate printed before
    it ran: its wall time and the run's peak memory (None for a run stored without them)."""
    resources = run.get("resources")
    if not resources:
        return None
    parts = []
    if job.get("wall_s") is not None:
        parts.append(f"{job['wall_s']:.1f} s")
    host = resources.get("host_peak_rss_mib")
    if host is not None:
        scope = "" if resources.get("host_peak_scope") == "run" else " (the worker's lifetime)"
        parts.append(f"peak resident memory {host / 1024:.2f} GiB{scope}")
    device = resources.get("device_peak_allocated_mib")
    if device is not None:
        parts.append(f"peak GPU allocation {device / 1024:.2f} GiB")
    return "  measured: " + ", ".join(parts) if parts else None
