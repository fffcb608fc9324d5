"""`strata serve`: the API and the job system (`service.serve.run_service`)."""

from __future__ import annotations

import click

from compute.errors import StrataError
from service.cli.errors import exit_code_of, fail
from service.settings import get_settings


@click.command()
@click.option("--host", default=None, help="address to listen on (default: STRATA_HOST, 127.0.0.1)")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=None, help="port (default: STRATA_PORT, 8000)"
)
@click.option(
    "--local-worker/--no-local-worker",
    default=None,
    help="also run a worker and beat here, on Celery's filesystem broker (default: "
    "on when STRATA_BROKER_URL is empty)",
)
@click.option("--access-log", is_flag=True, help="log every request")
@click.option(
    "--log-level",
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
    default="info",
    show_default=True,
)
def serve(
    host: str | None, port: int | None, local_worker: bool | None, access_log: bool, log_level: str
) -> None:
    """Serve the results over HTTP (the API) and run the job system. This process holds the
    database for as long as it runs: workers and other processes send it work instead of
    opening the file. With no broker configured it also starts a local worker and beat."""
    from service.serve import run_service

    try:
        run_service(
            get_settings(),
            host=host,
            port=port,
            local_worker=local_worker,
            access_log=access_log,
            log_level=log_level,
        )
    except StrataError as exc:
        fail(str(exc), exit_code_of(exc))
