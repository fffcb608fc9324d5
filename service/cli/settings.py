"""`strata settings`: every setting with its environment variable, default and meaning (read
from the settings model by `service.settings_doc`)."""

from __future__ import annotations

import json

import click
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from service.settings_doc import current_value, iter_settings, markdown, render_value, shown


@click.command("settings")
@click.option(
    "--markdown",
    "as_markdown",
    is_flag=True,
    help="print docs/settings.md (defaults only, no values from this environment)",
)
@click.option("--json", "as_json", is_flag=True, help="one JSON object per setting, one a line")
def settings(as_markdown: bool, as_json: bool) -> None:
    """Every setting: environment variable, default, value in force and meaning."""
    from service.settings import Settings

    if as_markdown:
        click.echo(markdown(Settings), nl=False)
        return
    try:
        loaded: BaseSettings | None = Settings()
    except ValueError as exc:  # an invalid value in the environment: still list the settings
        click.echo(f"warning: the environment does not validate: {exc}", err=True)
        loaded = None
    for s in iter_settings(Settings):
        value = current_value(s, loaded) if loaded is not None else PydanticUndefined
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "env": s.env[0],
                        "aliases": list(s.env[1:]),
                        "type": s.type,
                        "default": render_value(s.default),
                        "value": shown(s, value),
                        "meaning": s.description,
                    }
                )
            )
            continue
        default = render_value(s.default)
        now = shown(s, value)
        differs = "" if now == shown(s, s.default) else f"  [now: {now}]"
        click.echo(f"{s.env[0]}={'' if default.startswith('(') else default}{differs}")
        if s.description:
            click.echo(f"    {s.description}")
