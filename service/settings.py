"""One settings object for the whole service (environment prefix STRATA_), built once.

Nested sections use a double underscore: `STRATA_API__PUBLIC_READS=false`,
`STRATA_API__CORS_ORIGINS='["https://dash.example.org"]'`. The write keys are
`STRATA_API_KEYS` (comma-separated).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ApiSettings(BaseModel):
    """The HTTP API (`strata serve`)."""

    public_reads: bool = Field(True, description="reads need no API key (writes always do)")
    cors_origins: list[str] = Field(default_factory=list,
                                    description="origins allowed by CORS; empty: no CORS headers")
    max_page_size: int = Field(500, ge=1, description="largest `limit` of a list endpoint")
    ingest_max_mb: int = Field(4096, ge=1, description="largest ingest body, MiB")
    checkpoint_roots: list[Path] = Field(
        default_factory=list,
        description="folders under which checkpoint directories may be registered over HTTP "
                    "(empty: none; zoo models and TransformerLens names are always allowed)")
    register_load_max_mb: int = Field(
        2048, ge=0, description="checkpoints up to this size are loaded at registration to "
                                "record their architecture numbers; larger ones are not")
    cache_max_age: int = Field(300, ge=0, description="Cache-Control max-age, seconds, of "
                                                      "results pinned to a finished run")
    row_cache_rows: int = Field(2_000_000, ge=0, description="record rows of recently read "
                                                           "runs kept in memory")
    response_cache_mb: int = Field(64, ge=0, description="encoded answers kept in memory, MiB")
    gzip_min_bytes: int = Field(1024, ge=0, description="responses from this size are gzipped "
                                                        "when the client accepts it")
    duckdb_threads: int | None = Field(None, ge=1, description="DuckDB threads per query "
                                                               "(default: all cores)")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STRATA_", env_nested_delimiter="__")

    database: Path = Field(Path("strata.duckdb"), description="the DuckDB file (one writer)")
    device: str = "cpu"
    api_keys: str = Field("", description="comma-separated keys allowed to write")
    host: str = "127.0.0.1"
    port: int = 8000
    api: ApiSettings = Field(default_factory=ApiSettings)

    def write_keys(self) -> tuple[str, ...]:
        """The API keys from `api_keys`, blanks dropped."""
        return tuple(k.strip() for k in self.api_keys.split(",") if k.strip())


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
