"""`strata serve`: the service process — the API, the job system's upkeep and, on the
one-machine default, a local worker and beat.

    store (opened here: this process is the database's one writer)
      └── JobService (decisions) ── CeleryBroker (sends) ── Board (progress, leases, workers)
      └── Upkeep thread (lost workers, unsent jobs, the watch folder)
      └── Litestar app (HTTP)
    LocalProcesses (no STRATA_BROKER_URL): `strata worker` + `strata beat`, restarted if they die
"""

from __future__ import annotations

import io
import logging
import os
import secrets
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from service.settings import Settings

if TYPE_CHECKING:
    from litestar import Litestar

    from service.store import Store

log = logging.getLogger("strata.serve")


class _ConsoleFilter(logging.Filter):
    """The console shows Strata's own log lines, and errors from anyone."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name.split(".")[0] == "strata" or record.levelno >= logging.ERROR


# Seconds an idle keep-alive connection stays open. Longer than HTTP clients keep theirs idle
# (httpx: 5 s): at uvicorn's default, also 5 s, both ends expire together, and a request a client
# sends on its pooled connection as the server closes it is reset ("Connection reset by peer",
# seen in the suite). A client then opens a new connection before the server closes the old.
KEEP_ALIVE_S = 65


def configure_logging(settings: Settings, log_level: str) -> Path:
    """Every log record goes to `<data_dir>/logs/api.log` (third-party libraries at their own
    level: TransformerLens's model loading, kombu's and Celery's warnings, uvicorn's access
    log); the console gets Strata's own lines and errors. Returns the log file."""
    log_dir = settings.data_dir.resolve() / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_file = log_dir / "api.log"
    to_file = logging.FileHandler(log_file, encoding="utf-8")
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    console.addFilter(_ConsoleFilter())
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(to_file)
    root.addHandler(console)
    root.setLevel(log_level.upper())
    logging.captureWarnings(True)  # `warnings.warn` from libraries: into the file too
    # Loading models prints: TransformerLens's print() calls and transformers' progress bars.
    # The former go to the file (Strata itself writes its console lines to stderr), the
    # latter are switched off.
    sys.stdout = _LogStream(logging.getLogger("stdout"))
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # also for the local worker and beat
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    return log_file


class _LogStream(io.TextIOBase):
    """A text stream whose lines become INFO records of a logger."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self._pending = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        lines = (self._pending + text).split("\n")
        self._pending = lines.pop()
        for line in lines:
            if line.strip():
                self.logger.info(line.rstrip())
        return len(text)

    def flush(self) -> None:
        if self._pending.strip():
            self.logger.info(self._pending.rstrip())
        self._pending = ""


def ensure_key(settings: Settings) -> Settings:
    """With no API keys configured, the one-machine default makes one (kept in the data folder,
    readable only by its owner) so the local worker and the CLI can write; said on the console."""
    if settings.write_keys():
        return settings
    key_file = settings.key_file
    key = key_file.read_text().strip() if key_file.is_file() else ""
    if not key:
        key_file.parent.mkdir(parents=True, exist_ok=True)
        key = secrets.token_urlsafe(24)
        key_file.write_text(key + "\n")
        key_file.chmod(0o600)
    return settings.model_copy(update={"api_keys": key})


def run_service(
    settings: Settings,
    *,
    host: str | None,
    port: int | None,
    local_worker: bool | None,
    access_log: bool,
    log_level: str,
) -> None:
    import uvicorn

    from service.store import Store
    from service.store.migrate import ensure_current
    from service.worker.launch import LocalProcesses

    log_file = configure_logging(settings, log_level)
    host = host or settings.host
    # what registration's loopback rule reads (settings.registration_roots): the address served
    settings = settings.model_copy(update={"host": host})
    port = settings.port if port is None else port
    local = (not settings.broker_url) if local_worker is None else local_worker
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    if local:
        settings = ensure_key(settings)
    store = Store.open(settings.database, threads=settings.api.duckdb_threads)
    processes: LocalProcesses | None = None
    try:
        ensure_current(store)
        if settings.jobs.register_zoo:
            register_zoo(store, settings)
        url = f"http://{host}:{port}"
        if local:
            processes = LocalProcesses(
                api_url=url,
                api_key=settings.write_keys()[0],
                device=settings.worker.device,
                log_dir=str(settings.data_dir / "logs"),
            )
        # Stopped from the app's shutdown hook: uvicorn re-raises SIGTERM/SIGINT once it has
        # shut down, so code after uvicorn.run() does not run on a signal.
        app = build_app(
            settings, store, on_shutdown=[processes.stop] if processes is not None else []
        )
        if processes is not None:
            processes.start()
        _announce(settings, url, local, log_file)
        # log_config=None: uvicorn's loggers keep to the handlers of `configure_logging`.
        uvicorn.run(
            app,
            host=host,
            port=port,
            log_level=log_level,
            access_log=access_log,
            workers=1,
            log_config=None,
            timeout_keep_alive=KEEP_ALIVE_S,
        )
    finally:
        if processes is not None:
            processes.stop()
        store.close()


def build_app(
    settings: Settings, store: Store, *, on_shutdown: Sequence[Callable[[], None]] = ()
) -> Litestar:
    """The service's app on an open store at the current schema, as `strata serve` runs it:
    the job service on the configured broker (Celery's filesystem transport when none is),
    and the upkeep thread (leases, reconciliation, the watch folder). Tests serve this same
    app in their own process."""
    from service.api.app import create_app
    from service.jobs.board import Board
    from service.jobs.broker import CeleryBroker
    from service.jobs.service import JobService
    from service.jobs.upkeep import Upkeep
    from service.jobs.watch import WatchFolder
    from service.worker.app import make_app

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    jobs = JobService(
        store,
        settings,
        CeleryBroker(make_app(settings, create_broker_dir=True), settings.jobs.publish_timeout_s),
        Board(settings.jobs.lease_s),
    )
    watch = None
    if settings.jobs.watch_dir is not None:
        watch_root = settings.jobs.watch_dir
        roots = [*settings.api.checkpoint_roots, watch_root]

        def register_folder(folder: Path) -> bool:
            from service.store.registration import Registration, register, usable_name

            name = folder.stem if folder.is_file() else folder.name  # x.gguf -> x
            _, created = register(
                store,
                Registration(str(folder.resolve()), name=usable_name(name)),
                checkpoint_roots=roots,
                load_max_mb=settings.api.register_load_max_mb,
            )
            if created:
                log.info("watch folder: registered %s", folder.name)
            return created

        watch = WatchFolder(watch_root, register_folder)
    upkeep = Upkeep(jobs, watch, say=lambda line: click.echo(line, err=True))
    return create_app(settings, store, jobs=jobs, upkeep=upkeep, on_shutdown=on_shutdown)


def register_zoo(store: Any, settings: Settings) -> None:
    """First start (no model registered yet): register every shipped zoo model."""
    import sqlalchemy as sa

    from service.store.registration import Registration, register
    from service.store.tables import RegisteredModelRow

    with store.read() as conn:
        if conn.execute(sa.select(sa.func.count()).select_from(RegisteredModelRow)).scalar():
            return
    from compute.models import zoo_names

    names = zoo_names()
    for name in names:
        register(
            store,
            Registration(f"zoo:{name}"),
            checkpoint_roots=settings.api.checkpoint_roots,
            load_max_mb=settings.api.register_load_max_mb,
        )
    click.echo(
        f"first start: registered the {len(names)} zoo models ({', '.join(names)}); "
        "their default runs are queued",
        err=True,
    )


def _announce(settings: Settings, url: str, local: bool, log_file: Path) -> None:
    lines = [
        f"Strata: serving {settings.database} on {url}",
        f"  web page:  {url}/",
        f"  API docs:  {url}/schema",
        f"  jobs:      {url}/api/v1/jobs  (strata jobs list)",
    ]
    if local:
        lines += [
            f"  broker:    filesystem, {settings.data_dir.resolve() / 'broker'} (a local "
            "worker and beat run beside the API)",
            f"  logs:      {log_file.parent} (api.log, worker.log, beat.log)",
        ]
        if settings.key_file.is_file() and not settings.api_key:
            lines.append(f"  API key:   in {settings.key_file} (the CLI reads it from there)")
    else:
        where = (
            settings.broker_url.split("@")[-1]
            or f"filesystem, {settings.data_dir.resolve() / 'broker'}"
        )
        lines += [
            f"  broker:    {where} (start workers with `strata worker`, one `strata beat`)",
            f"  log:       {log_file}",
        ]
    click.echo("\n".join(lines), err=True)
    sys.stderr.flush()
