"""One settings object for the whole service (environment prefix STRATA_), built once.

Nested sections use a double underscore: `STRATA_API__PUBLIC_READS=false`,
`STRATA_API__CORS_ORIGINS='["https://dash.example.org"]'`. The write keys are
`STRATA_API_KEYS` (comma-separated).
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class ApiSettings(BaseModel):
    """The HTTP API (`strata serve`)."""

    public_reads: bool = Field(True, description="reads need no API key (writes always do)")
    cors_origins: list[str] = Field(
        default_factory=list, description="origins allowed by CORS; empty: no CORS headers"
    )
    max_page_size: int = Field(500, ge=1, description="largest `limit` of a list endpoint")
    ingest_max_mb: int = Field(4096, ge=1, description="largest ingest body, MiB")
    checkpoint_roots: list[Path] = Field(
        default_factory=list,
        description="folders under which checkpoint directories and GGUF files may be "
        "registered over HTTP (zoo models and TransformerLens names are always allowed); "
        "empty: see local_checkpoints",
    )
    local_checkpoints: bool | None = Field(
        None,
        description="whether checkpoints anywhere on this machine may be registered over "
        "HTTP; unset: yes while the service listens on a loopback address only (only this "
        "machine's users reach it) and no checkpoint_roots are set, else only under "
        "checkpoint_roots",
    )
    register_load_max_mb: int = Field(
        2048,
        ge=0,
        description="checkpoints up to this size are loaded at registration to "
        "record their architecture numbers; larger ones are not",
    )
    cache_max_age: int = Field(
        300, ge=0, description="Cache-Control max-age, seconds, of results pinned to a finished run"
    )
    row_cache_rows: int = Field(
        2_000_000, ge=0, description="record rows of recently read runs kept in memory"
    )
    response_cache_mb: int = Field(64, ge=0, description="encoded answers kept in memory, MiB")
    gzip_min_bytes: int = Field(
        1024, ge=0, description="responses from this size are gzipped when the client accepts it"
    )
    duckdb_threads: int | None = Field(
        None, ge=1, description="DuckDB threads per query (default: all cores)"
    )
    read_rate_limit: str = Field(
        "12000/minute",
        description="reads (GET) allowed per client "
        "address, `N/second|minute|hour|day` in a fixed window; "
        "beyond it 429 with Retry-After; empty: no limit",
    )
    write_rate_limit: str = Field(
        "600/minute",
        description="writes allowed per API key, in "
        "the same form; the workers' claims, heartbeats, failure "
        "reports and deliveries are never limited; empty: no limit",
    )

    @field_validator("read_rate_limit", "write_rate_limit")
    @classmethod
    def _rate(cls, value: str) -> str:
        """`N/unit`, checked when the settings are read (not at the first request)."""
        value = value.strip()
        if value and not re.fullmatch(r"[1-9]\d*\s*/\s*(second|minute|hour|day)", value):
            raise ValueError(
                f"{value!r} is not a rate such as 600/minute (N/second, "
                "N/minute, N/hour or N/day; empty for no limit)"
            )
        return value


class WorkerSettings(BaseModel):
    """A Celery worker (`strata worker`): what it runs on and how it is recycled."""

    device: str = Field(
        "cpu",
        description="device of a worker started without --gpus "
        "(cpu; `strata worker --gpus 0,1` sets cuda)",
    )
    dtype: str = Field(
        "float32", description="dtype of jobs that name none (float32, bfloat16, float16)"
    )
    model_cache_size: int = Field(
        2, ge=0, description="loaded models kept per worker process (LRU by model spec)"
    )
    max_tasks_per_child: int = Field(
        20, ge=1, description="a worker process is replaced after this many jobs (frees GPU memory)"
    )
    max_memory_mb: int = Field(
        0,
        ge=0,
        description="a worker process is replaced after a job "
        "that left it above this resident size, "
        "MiB (0: no bound)",
    )
    memory_budget_mb: int | None = Field(
        None,
        ge=64,
        description="memory a job's sweep may "
        "use beyond the weights, MiB, when the job sets none "
        "(None: on a GPU 85% of what is free after loading, "
        "on a CPU half the weights' size, at least 64)",
    )
    tokens_per_batch: int | None = Field(
        None,
        ge=1,
        description="on a CPU worker, about this "
        "many tokens per batch when the job sets none (None: "
        "the measured best, 1024)",
    )
    soft_time_limit_s: int = Field(
        6 * 3600, ge=1, description="a job running longer fails (cleanly)"
    )
    time_limit_s: int = Field(
        6 * 3600 + 300, ge=1, description="a job running longer is killed with its process"
    )
    heartbeat_s: float = Field(
        5.0,
        gt=0,
        description="seconds between a worker's heartbeats (progress and lease) to the API",
    )
    delivery_timeout_s: int = Field(
        7 * 24 * 3600,
        ge=1,
        description="how long a worker keeps "
        "retrying to deliver finished results while the API is "
        "unreachable",
    )


class JobsSettings(BaseModel):
    """Jobs, their leases, and the default run that reconciliation computes for every model."""

    lease_s: float = Field(
        30.0,
        gt=0,
        description="a running job whose worker sent no "
        "heartbeat for this long is re-queued (its worker is presumed lost)",
    )
    max_attempts: int = Field(
        3, ge=1, description="a job whose worker was lost this many times fails"
    )
    maintenance_interval_s: float = Field(
        2.0,
        gt=0,
        description="how often the API checks leases, undelivered dispatches and the watch folder",
    )
    reconcile_interval_s: float = Field(
        60.0,
        gt=0,
        description="how often beat asks for reconciliation (missing or outdated default results)",
    )
    family_settle_s: float = Field(
        10.0,
        ge=0,
        description="reconciliation queues a refit family's stability only once its members "
        "have been unchanged this long, so edits in a row (create, add, remove) make one job "
        "for the membership they settle on (0: at once); a queued job whose membership was "
        "changed is cancelled either way",
    )
    reconcile: bool = Field(
        True,
        description="queue the default run of every registered model "
        "that lacks current results: at start, at each registration, and on "
        "beat's schedule (false: only what is submitted is computed)",
    )
    auto_run_max_tflop: float | None = Field(
        20.0,
        ge=0,
        description="a default run estimated above this many TFLOP (compute.flops; 20: about "
        "20 minutes on a CPU worker, SmolLM2-135M's is 278) is queued only when asked — "
        "`strata models add --compute`, POST /api/v1/models with default_run true, or "
        "`strata jobs submit --model NAME` — not by a registration or reconciliation on their "
        "own, nor is one whose cost is unknown (its numbers are not known before loading); "
        "unset: every default run is queued automatically",
    )
    register_zoo: bool = Field(
        True,
        description="on the first start with an empty store, "
        "register the shipped zoo models (so their default runs are "
        "computed)",
    )
    progress_log_s: float = Field(
        10.0,
        ge=0,
        description="how often `strata serve` prints the "
        "jobs' progress while any are queued or running (0: never)",
    )
    families: list[str] = Field(
        default_factory=lambda: [
            "intervention",
            "logit_lens",
            "neurons",
            "similarity",
            "attention",
            "norms",
            "heads",
        ],
        description="metric families of the default run",
    )
    tokens: str = Field("builtin", description="token source of the default run")
    n_sequences: int = Field(32, ge=1, description="sequences of the default run")
    seq_len: int = Field(
        128,
        ge=3,
        description="tokens per sequence of the default run (capped at the model's context)",
    )
    dtype: str = Field("float32", description="dtype of the default run and of jobs that name none")
    devices: list[str] = Field(
        default_factory=list,
        description="devices the deployment's workers have (empty: learnt from worker heartbeats)",
    )
    corpus_roots: list[Path] = Field(
        default_factory=list,
        description="folders under which a job may name a corpus path (empty: none)",
    )
    watch_dir: Path | None = Field(
        None,
        description="checkpoint folders appearing here are "
        "registered (under their folder name) and computed",
    )
    publish_timeout_s: float = Field(
        3.0, gt=0, description="how long submitting waits for the broker before answering 503"
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STRATA_", env_nested_delimiter="__")

    database: Path = Field(Path("strata.duckdb"), description="the DuckDB file (one writer)")
    api_keys: str = Field("", description="comma-separated keys allowed to write")
    host: str = Field(
        "127.0.0.1", description="address `strata serve` listens on (--host overrides)"
    )
    port: int = Field(
        8000, ge=0, le=65535, description="port `strata serve` listens on (--port overrides)"
    )
    api: ApiSettings = Field(default_factory=ApiSettings)
    broker_url: str = Field(
        "",
        description="Celery broker (redis://..., amqp://...); empty: "
        "Celery's filesystem broker under data_dir, and `strata serve` "
        "starts a local worker and beat",
    )
    data_dir: Path = Field(
        Path(".strata"),
        description="local state: the filesystem broker, beat's schedule, the generated API key",
    )
    api_url: str = Field(
        "http://127.0.0.1:8000", description="where workers, beat and the CLI reach the API"
    )
    api_key: str = Field(
        "",
        description="the key workers and the CLI send (default: the key "
        "file in data_dir that `strata serve` writes when no keys are set)",
    )
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    jobs: JobsSettings = Field(default_factory=JobsSettings)

    def write_keys(self) -> tuple[str, ...]:
        """The API keys from `api_keys`, blanks dropped."""
        return tuple(k.strip() for k in self.api_keys.split(",") if k.strip())

    @property
    def key_file(self) -> Path:
        """Where `strata serve` keeps the key it generates when no keys are configured."""
        return self.data_dir / "api-key"

    def registration_roots(self) -> list[Path] | None:
        """The folders checkpoints registered over HTTP must lie under; None: anywhere on this
        machine (`api.local_checkpoints`)."""
        local = self.api.local_checkpoints
        if local is None:
            local = not self.api.checkpoint_roots and is_loopback(self.host)
        return None if local else list(self.api.checkpoint_roots)

    def client_key(self) -> str | None:
        """The key this process sends: `api_key`, else the generated key file, else none."""
        if self.api_key:
            return self.api_key
        try:
            return self.key_file.read_text().strip() or None
        except OSError:
            return None


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address (127.0.0.0/8, ::1) or `localhost`."""
    import ipaddress

    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: not known to be loopback
        return False


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    settings = Settings()
    use_data_dir(settings)
    return settings


def use_data_dir(settings: Settings) -> None:
    """Point compute's file caches at the data directory: GGUF files are dequantized once into
    `<data_dir>/gguf/<sha256>/` and tuned lenses are kept in `<data_dir>/lenses/` (every process
    of a deployment that shares data_dir shares them)."""
    from compute.gguf import set_cache_dir
    from compute.lens.config import set_lens_dir

    set_cache_dir(settings.data_dir / "gguf")
    set_lens_dir(settings.data_dir / "lenses")
