"""One settings object for the whole service (environment prefix STRATA_), built once."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STRATA_", env_nested_delimiter="__")

    database: Path = Field(Path("strata.duckdb"), description="the DuckDB file (one writer)")
    device: str = "cpu"
    api_keys: str = Field("", description="comma-separated keys allowed to write")
    host: str = "127.0.0.1"
    port: int = 8000


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
