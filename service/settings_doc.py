"""Every setting described: its environment variable, type, default and meaning — what
`strata settings` lists and docs/settings.md holds.

The list is read from the settings model itself (`service.settings.Settings`), walked
generically: a field whose type is a pydantic model is a section, and its fields are read from
`STRATA_<SECTION>__<FIELD>` (pydantic-settings' nested delimiter). A field added to the model
appears here, and in docs/settings.md, with no other change; `strata settings --markdown`
regenerates that file and a unit test fails when the two differ.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import PurePath
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import AliasChoices, AliasPath, BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

# Names that mark a value as secret: never printed, only "set" / "unset".
SECRET_WORDS = ("key", "password", "secret", "token", "credential")

MARKDOWN_HEADER = """\
# Settings

Every setting of the Strata service, read from the environment (or a `.env`-style file that your
process manager loads, e.g. `deploy/strata.env.example`). Nested sections use a double
underscore: `STRATA_API__PUBLIC_READS=false`. Lists are JSON: `STRATA_API__CORS_ORIGINS='["https://a.example"]'`.
Command-line options (e.g. `strata serve --port`) override the environment for that command.

`strata settings` prints the same list with the values in force (secrets shown only as
set/unset); `strata settings --json` gives it to tools.

This file is generated from the settings model (`service/settings.py`) by
`strata settings --markdown > docs/settings.md`; a unit test fails when the two differ.
"""


@dataclass(frozen=True)
class Setting:
    """One leaf setting: where it lives in the model and how the environment names it."""

    path: tuple[str, ...]  # ("api", "public_reads")
    env: tuple[str, ...]  # every environment variable that sets it, preferred first
    type: str
    default: Any  # the default value, or PydanticUndefined when required
    description: str
    section: str  # "" for the top level, else the section's field name
    secret: bool

    @property
    def required(self) -> bool:
        return self.default is PydanticUndefined


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (also through `X | None`), or None for a plain value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(models) == 1:
            return _model_of(models[0])
    return None


def _type_name(annotation: Any) -> str:
    if annotation is None or annotation is type(None):
        return "None"
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " | ".join(json.dumps(m.value) for m in annotation)
    return getattr(annotation, "__name__", str(annotation))


def _default(info: FieldInfo) -> Any:
    if info.default is not PydanticUndefined:
        return info.default
    if info.default_factory is not None:
        try:
            return info.default_factory()  # type: ignore[call-arg]
        except TypeError:  # a factory that takes the validated data: no static default
            return PydanticUndefined
    return PydanticUndefined


def _alias_names(info: FieldInfo) -> list[str]:
    alias = info.validation_alias or info.alias
    if isinstance(alias, str):
        return [alias]
    if isinstance(alias, AliasChoices):
        return [c for c in alias.choices if isinstance(c, str)]
    if isinstance(alias, AliasPath):
        return []
    return []


def _is_secret(name: str, annotation: Any) -> bool:
    if annotation is SecretStr or SecretStr in typing.get_args(annotation):
        return True
    return any(word in name.lower() for word in SECRET_WORDS)


def iter_settings(model: type[BaseSettings]) -> Iterator[Setting]:
    """Every leaf setting of a pydantic-settings model, sections expanded, in declaration order
    (top-level values first, then each section)."""
    config = model.model_config
    prefix = config.get("env_prefix", "") or ""
    delimiter = config.get("env_nested_delimiter") or "__"
    sections: list[tuple[str, type[BaseModel], FieldInfo]] = []
    for name, info in model.model_fields.items():
        section = _model_of(info.annotation)
        if section is not None:
            sections.append((name, section, info))
            continue
        aliases = _alias_names(info)  # pydantic-settings applies no prefix to an alias
        env = tuple(a.upper() for a in aliases) or (f"{prefix}{name}".upper(),)
        yield Setting(
            (name,),
            env,
            _type_name(info.annotation),
            _default(info),
            info.description or "",
            "",
            _is_secret(name, info.annotation),
        )
    for name, section, _info in sections:
        yield from _section_settings(section, (name,), f"{prefix}{name}".upper(), delimiter)


def _section_settings(
    model: type[BaseModel], path: tuple[str, ...], env_stem: str, delimiter: str
) -> Iterator[Setting]:
    for name, info in model.model_fields.items():
        env = f"{env_stem}{delimiter}{name}".upper()
        inner = _model_of(info.annotation)
        if inner is not None:
            yield from _section_settings(inner, (*path, name), env, delimiter)
            continue
        yield Setting(
            (*path, name),
            (env,),
            _type_name(info.annotation),
            _default(info),
            info.description or "",
            path[0],
            _is_secret(name, info.annotation),
        )


def render_value(value: Any) -> str:
    """A value as one writes it in the environment."""
    if value is PydanticUndefined:
        return "(required)"
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    if isinstance(value, list | tuple | set | frozenset | dict):
        return json.dumps(value if isinstance(value, dict) else list(value), default=str)
    return str(value)


def _mask_url(text: str) -> str:
    """A URL with its password replaced (redis://:secret@host -> redis://:***@host)."""
    try:
        parts = urlsplit(text)
    except ValueError:
        return text
    if parts.password:
        user = parts.username or ""
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        return urlunsplit(parts._replace(netloc=f"{user}:***@{host}{port}"))
    return text


def current_value(setting: Setting, settings: BaseSettings) -> Any:
    value: Any = settings
    for part in setting.path:
        value = getattr(value, part, None) if value is not None else None
    return value


def shown(setting: Setting, value: Any) -> str:
    """What `strata settings` prints for a value in force: secrets only as set / unset."""
    if setting.secret:
        return "(set)" if value not in (None, "", PydanticUndefined) else "(unset)"
    return _mask_url(render_value(value))


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(model: type[BaseSettings]) -> str:
    """docs/settings.md: the header, then one table per section. Depends only on the model."""
    out = [MARKDOWN_HEADER]
    rows = list(iter_settings(model))
    for section in dict.fromkeys(s.section for s in rows):
        if section:
            field = model.model_fields[section]
            inner = _model_of(field.annotation)
            title = (
                field.description or (inner.__doc__ or "").strip().split("\n")[0]
                if inner is not None
                else ""
            )
            out.append(f"## `{section}` section\n")
            if title:
                out.append(f"{title}\n")
        else:
            out.append("## Top level\n")
        out.append("| variable | type | default | meaning |")
        out.append("| --- | --- | --- | --- |")
        for s in rows:
            if s.section != section:
                continue
            env = " or ".join(f"`{e}`" for e in s.env)
            default = render_value(s.default)
            default_cell = (
                f"`{_md_cell(default)}`"
                if default and not default.startswith("(")
                else default or "(empty)"
            )
            out.append(
                f"| {env} | {_md_cell(s.type)} | {default_cell} | "
                f"{_md_cell(s.description) or '(undocumented)'} |"
            )
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"
