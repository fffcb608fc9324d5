"""`strata models ...`: register and list models, and pin a model's canonical run. With a
service running, through its API (`service/cli/http.py`); `strata models add` with none
registers into the database file directly (`service.store.registration`: the CLI is then its one
writer)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import click

from compute.errors import StrataError
from service.cli.errors import EXIT_BAD_INPUT, exit_code_of, fail
from service.cli.http import call, service_up, url_option
from service.settings import get_settings


@click.group()
def models() -> None:
    """Register and list models."""


REGISTER_TIMEOUT_S = 1800.0


@models.command("add")
@click.argument("source")
@click.option(
    "--name",
    default=None,
    help="the model's name in URLs (default: the checkpoint folder's name, or the source's)",
)
@click.option("--revision", default=None)
@click.option(
    "--compute",
    "compute_default",
    is_flag=True,
    help="queue the model's default run now, whatever it costs (without it: automatically "
    "only when its estimate is within the service's STRATA_JOBS__AUTO_RUN_MAX_TFLOP)",
)
@url_option
def add(
    source: str,
    name: str | None,
    revision: str | None,
    compute_default: bool,
    url: str | None,
) -> None:
    """Register a model (zoo:NAME, a checkpoint folder, a TransformerLens name). With a service
    running, through it: prints what its default run would cost and whether it was queued
    (automatically only within STRATA_JOBS__AUTO_RUN_MAX_TFLOP; --compute to ask for it);
    otherwise into the database file."""
    path = Path(source)
    # A local checkpoint folder or GGUF file is sent as an absolute path: the service resolves
    # paths against its own working folder, not this shell's.
    local = (path / "config.json").is_file() or (path.is_file() and path.suffix.lower() == ".gguf")
    ref = str(path.resolve()) if local else source
    body: dict[str, Any] = {
        "source": ref,
        **({"name": name} if name else {}),
        **({"revision": revision} if revision else {}),
    }
    settings = get_settings()
    if url is not None or service_up(settings.api_url):
        if compute_default:
            body["default_run"] = True
        # Registration loads the model to measure its parity: a real model's GGUF is
        # dequantized and loaded in minutes on a CPU (Gemma 3 270M: 2-3), well past the
        # minute that other calls wait. Said while it waits, with the time so far.
        with _waiting(
            f"registering {source}: the service loads it to record its numbers and "
            "check its forward against Hugging Face's (minutes for a real model on "
            "a CPU)"
        ):
            model = call(url, "POST", "/api/v1/models", json=body, timeout=REGISTER_TIMEOUT_S)
    else:
        model = _register_locally(body, path)
    click.echo(f"registered {model['name']} (id {model['id']}, {model['source']})")
    plan = model.get("default_run")
    if plan:
        job = f" (job {plan['job_id']})" if plan.get("job_id") is not None else ""
        click.echo(f"default run{job}: {plan['detail']}")


@contextlib.contextmanager
def _waiting(what: str, every_s: float = 5.0) -> Iterator[None]:
    """Say on stderr what is being waited for, then every `every_s` seconds how long so far,
    until the block ends."""
    click.echo(f"{what} ...", err=True)
    done = threading.Event()
    start = time.monotonic()

    def tick() -> None:
        while not done.wait(every_s):
            click.echo(f"  still loading: {time.monotonic() - start:.0f} s", err=True)

    thread = threading.Thread(target=tick, name="strata-waiting", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _register_locally(body: dict[str, Any], path: Path) -> dict[str, str | int]:
    """Register into the database file; the body is checked as the API would check it."""
    import msgspec

    from service.schemas.models import RegisterModel
    from service.store import Store
    from service.store.migrate import ensure_current
    from service.store.registration import Registration, register

    settings = get_settings()
    roots = list(settings.api.checkpoint_roots)
    if path.is_dir() or path.is_file():  # a local folder or file named here is allowed as it is
        roots.append(path.resolve().parent)
    try:
        request = msgspec.convert(body, RegisterModel)
    except msgspec.ValidationError as exc:
        fail(f"{exc}", EXIT_BAD_INPUT)
    try:
        with Store.open(settings.database) as store:
            ensure_current(store)
            model, _ = register(
                store,
                Registration(request.source, name=request.name, revision=request.revision),
                checkpoint_roots=roots,
                load_max_mb=settings.api.register_load_max_mb,
            )
            return {"name": model.name, "id": model.id, "source": model.source}
    except StrataError as exc:  # refused, for whatever reason: bad input (a held file: 5)
        code = exit_code_of(exc)
        fail(str(exc), EXIT_BAD_INPUT if code == 1 else code)


@models.command("list")
@url_option
def list_models(url: str | None) -> None:
    """Registered models (from the running service)."""
    page = call(url, "GET", "/api/v1/models", params={"limit": 500})
    for m in page["items"]:
        click.echo(f"{m['id']}\t{m['name']}\t{m['source']}\tlayers={m['n_layers']}")


def _who() -> str:
    """The audit log's name for whoever runs this command: user@host."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"[:200]


def _families(values: tuple[str, ...]) -> list[str] | None:
    names = [f.strip() for v in values for f in v.split(",") if f.strip()]
    return names or None


def _show_pins(pins: dict[str, Any]) -> None:
    model = pins["model"]
    click.echo(f"{model['name']} (id {model['id']}): default run {pins['default_run_id']}")
    for family, run in sorted(pins["canonical"].items()):
        click.echo(
            f"  {family:<12} run {run['id']} ({run['selected_by']}; {run['tokens']}, "
            f"{run['n_sequences']} x {run['seq_len']} tokens, {run['dtype']})"
        )


_family_option = click.option(
    "--family",
    "families",
    multiple=True,
    help="metric family (repeat or comma-separate; default: every family the run computed)",
)


@models.command("pin")
@click.argument("model")
@click.argument("run_id", type=int)
@_family_option
@click.option("--note", default=None, help="why, for the audit log")
@url_option
def pin(
    model: str, run_id: int, families: tuple[str, ...], note: str | None, url: str | None
) -> None:
    """Make RUN_ID MODEL's canonical run (API key): every answer about MODEL reads it for its
    families until `strata models unpin`. Recorded with your user@host and the time."""
    body: dict[str, Any] = {"run_id": run_id, "by": _who()}
    if (names := _families(families)) is not None:
        body["families"] = names
    if note:
        body["note"] = note
    _show_pins(call(url, "POST", f"/api/v1/models/{quote(model, safe='')}/pins", json=body))


@models.command("unpin")
@click.argument("model")
@_family_option
@click.option("--note", default=None, help="why, for the audit log")
@url_option
def unpin(model: str, families: tuple[str, ...], note: str | None, url: str | None) -> None:
    """Unpin MODEL's pinned runs (API key; default: every pinned family): its default
    configuration's run is canonical again."""
    params: dict[str, Any] = {"by": _who()}
    if (names := _families(families)) is not None:
        params["family"] = ",".join(names)
    if note:
        params["note"] = note
    _show_pins(call(url, "DELETE", f"/api/v1/models/{quote(model, safe='')}/pins", params=params))


@models.command("pins")
@click.argument("model")
@click.option("--history", "with_history", is_flag=True, help="also every pin and unpin")
@url_option
def pins(model: str, with_history: bool, url: str | None) -> None:
    """MODEL's canonical run for each family (pinned, default or latest) and, with
    --history, the audit log of pins and unpins."""
    answer = call(url, "GET", f"/api/v1/models/{quote(model, safe='')}/pins")
    _show_pins(answer)
    if with_history:
        for event in answer["history"]:
            run = f" run {event['run_id']}" if event["run_id"] is not None else ""
            note = f": {event['note']}" if event["note"] else ""
            click.echo(
                f"  {event['at']} {event['action']} {event['family']}{run} by "
                f"{event['by']} ({event['key_id']}){note}"
            )


@models.command("check")
@click.argument("model")
@click.option(
    "--dtype",
    type=click.Choice(["float32", "bfloat16", "float16"]),
    default="float32",
    help="also measure the noise floor of this dtype against float32",
)
@click.option("--device", default="cpu", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
def check(model: str, dtype: str, device: str, as_json: bool) -> None:
    """Load MODEL (zoo:NAME, a checkpoint folder, a GGUF file, a TransformerLens name) as a run
    would and print its parity report: Strata's forward against the Hugging Face model's own
    float32 forward, which path its blocks take, and below float32 the noise floor. Exit 3 if
    the model is refused (its forward is not Hugging Face's, or a mechanism is unsupported)."""
    import json

    from compute.errors import ParityError
    from compute.models import load_model, resolve_model_spec

    get_settings()  # points the GGUF cache at <data_dir>/gguf, as every other command does
    try:
        spec = resolve_model_spec(model, dtype=dtype)  # type: ignore[arg-type]
        lm = load_model(spec, device)
        report = lm.parity.as_dict() if lm.parity is not None else {}
        architecture = lm.architecture
    except ParityError as exc:
        if exc.report:
            click.echo(json.dumps(exc.report, indent=2) if as_json else _report_text(exc.report))
        fail(str(exc), exit_code_of(exc))
    except StrataError as exc:
        fail(str(exc), exit_code_of(exc))
    speed = _dtype_speed(dtype, device)
    if as_json:
        click.echo(json.dumps({"architecture": architecture, **report, **speed}, indent=2))
    else:
        click.echo(f"{model}: {architecture}\n" + _report_text(report))
        if speed:
            rates = speed["matmul_gflops"]
            click.echo(
                f"  matmul speed     {dtype} {rates[dtype]:.1f} GFLOP/s, float32 "
                f"{rates['float32']:.1f} (one thread, this machine)"
            )
            if speed["dtype_warning"]:
                click.echo(f"warning: {speed['dtype_warning']}", err=True)


def _dtype_speed(dtype: str, device: str) -> dict[str, Any]:
    """Below float32: this machine's matmul rate in the dtype and in float32
    (compute.hardware), and the warning a run would print if the dtype is emulated here."""
    from compute.hardware import dtype_speed_warning, matmul_gflops

    if dtype == "float32":
        return {}
    rates = {dt: matmul_gflops(device, dt) for dt in (dtype, "float32")}
    return {"matmul_gflops": rates, "dtype_warning": dtype_speed_warning(dtype, device)}


def _report_text(report: dict[str, Any]) -> str:
    if report.get("reference") is None:
        return f"  no Hugging Face reference: {report.get('note', '')}"
    paths = sorted(set(report["block_paths"]))
    lines = [
        f"  reference        Hugging Face float32 forward, {report['tokens']} tokens",
        f"  max |Δ log p|    {report['max_abs_logprob_diff']:.3g} nats "
        f"(tolerance {report['tolerance']:g})",
        f"  KL(HF || Strata) {report['kl_to_reference']:.3g} nats "
        f"(tolerance {report['kl_tolerance']:g})",
        f"  blocks           {len(report['block_paths'])} on the {', '.join(paths)} path",
    ]
    if report.get("noise_floor_kl") is not None:
        lines.append(
            f"  noise floor      KL(float32 || {report['dtype']}) "
            f"{report['noise_floor_kl']:.3g} nats; max |Δ log p| "
            f"{report['noise_floor_max_abs_logprob_diff']:.3g}"
        )
    lines.append(f"  parity           {'passed' if report['passed'] else 'FAILED'}")
    return "\n".join(lines)
