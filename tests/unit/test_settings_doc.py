"""docs/settings.md is generated from the settings model; `strata settings` reads the same model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.cli import main
from service.settings import Settings
from service.settings_doc import iter_settings, markdown

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "settings.md"


def test_settings_doc_is_generated_from_the_model() -> None:
    expected = markdown(Settings)
    assert DOC.read_text() == expected, (
        "docs/settings.md is out of date: regenerate it with "
        "`strata settings --markdown > docs/settings.md`")


def test_markdown_command_prints_the_doc() -> None:
    result = CliRunner().invoke(main, ["settings", "--markdown"])
    assert result.exit_code == 0, result.output
    assert result.output == markdown(Settings)


def test_markdown_ignores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_PORT", "9999")
    monkeypatch.setenv("STRATA_API__MAX_PAGE_SIZE", "7")
    assert markdown(Settings) == DOC.read_text()


def test_every_setting_is_listed_with_its_variable() -> None:
    listed = {s.env[0] for s in iter_settings(Settings)}
    for name, info in Settings.model_fields.items():
        sub = info.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            for inner in sub.model_fields:
                assert f"STRATA_{name}__{inner}".upper() in listed
        else:
            assert any(e.startswith("STRATA_") and e.endswith(name.upper()) for e in listed)
    for env in listed:
        assert f"`{env}`" in DOC.read_text()


def test_every_setting_has_a_meaning() -> None:
    missing = [s.env[0] for s in iter_settings(Settings) if not s.description]
    assert not missing, f"give these settings a Field(description=...): {missing}"


def test_env_names_really_set_the_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """The documented variable is the one pydantic-settings reads (nested delimiter included)."""
    for s in iter_settings(Settings):
        if s.type == "int":
            monkeypatch.setenv(s.env[0], "3")
            value = Settings()
            for part in s.path:
                value = getattr(value, part)
            assert value == 3, s.env[0]
            monkeypatch.delenv(s.env[0])


class _Inner(BaseModel):
    """An inner section."""

    depth: int = Field(2, description="how deep")
    token: str = Field("", description="a secret")


class _Toy(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TOY_", env_nested_delimiter="__")
    url: str = Field("redis://:pw@h:6379/0", description="a broker")
    names: list[str] = Field(default_factory=lambda: ["a"], description="names")
    inner: _Inner = Field(default_factory=_Inner)


def test_generic_walk_of_a_new_model() -> None:
    rows = {s.env[0]: s for s in iter_settings(_Toy)}
    assert set(rows) == {"TOY_URL", "TOY_NAMES", "TOY_INNER__DEPTH", "TOY_INNER__TOKEN"}
    assert rows["TOY_INNER__TOKEN"].secret
    text = markdown(_Toy)
    assert "## `inner` section" in text
    assert "An inner section." in text
    assert '`["a"]`' in text


def test_plain_listing_hides_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_API_KEYS", "very-secret-value")
    result = CliRunner().invoke(main, ["settings"])
    assert result.exit_code == 0, result.output
    assert "very-secret-value" not in result.output
    assert "STRATA_API_KEYS=" in result.output
    assert "(set)" in result.output
    lines = CliRunner().invoke(main, ["settings", "--json"]).output.splitlines()
    rows = [json.loads(line) for line in lines]
    assert {r["env"] for r in rows} == {s.env[0] for s in iter_settings(Settings)}
    assert all("very-secret-value" not in line for line in lines)


def test_broker_password_is_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_BROKER_URL", "redis://:hunter2-secret@redis:6379/0")
    result = CliRunner().invoke(main, ["settings"])
    assert result.exit_code == 0, result.output
    assert "hunter2-secret" not in result.output
    assert "redis://:***@redis:6379/0" in result.output


def test_an_invalid_environment_still_lists_the_settings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_PORT", "not-a-port")
    result = CliRunner().invoke(main, ["settings"])
    assert result.exit_code == 0, result.output
    assert "STRATA_DATABASE=" in result.output


def test_checkpoints_anywhere_only_on_a_loopback_service_without_roots(tmp_path: Path) -> None:
    """Over HTTP, a checkpoint anywhere on the machine may be registered by default only while
    the service listens on loopback and no roots are configured; otherwise under the roots."""
    from service.settings import ApiSettings, Settings, is_loopback

    def roots(host: str, **api: Any) -> list[Path] | None:
        return Settings(host=host, api=ApiSettings(**api)).registration_roots()

    assert roots("127.0.0.1") is None
    assert roots("localhost") is None
    assert roots("::1") is None
    assert roots("0.0.0.0") == []
    assert roots("10.1.2.3") == []
    assert roots("strata.lab.example") == []
    assert roots("127.0.0.1", checkpoint_roots=[tmp_path]) == [tmp_path]
    assert roots("0.0.0.0", local_checkpoints=True) is None
    assert roots("127.0.0.1", local_checkpoints=False) == []
    assert is_loopback("127.8.9.10")
    assert not is_loopback("0.0.0.0")
