"""`strata families ...`: make, grow, shrink and list refit families on a running service, and
queue their stability as a worker's job (`--url`, default STRATA_API_URL; see
`service/cli/http.py`). `strata stability --store` is the local path over the same code, for
when no service runs."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import click

from service.cli.http import call, url_option
from service.cli.jobs import _watch

V1 = "/api/v1/families"


def _seg(value: str) -> str:
    return quote(value, safe="")


def _describe(family: dict[str, Any]) -> str:
    s = family.get("settings") or {}
    lines = [
        f"{family['name']}: anchor {family['anchor']['name']}, {len(family['members'])} members"
        + (
            f" ({s['n_prompts']} prompts x {s['prompt_len']} tokens, {s['n_null']} null models)"
            if s
            else ""
        )
    ]
    for member in family.get("member_states", []):
        mark = " (anchor)" if member["anchor"] else ""
        lines.append(f"  {member['model']['name']}{mark}: {member['state']}")
    if family.get("stability_run_id") is not None:
        lines.append(f"  stability: run {family['stability_run_id']}")
    job = family.get("job")
    if job:
        lines.append(f"  newest job: {job['id']} {job['state']} ({job['reason']})")
    return "\n".join(lines)


def _members(values: tuple[str, ...]) -> list[str]:
    return [m.strip() for v in values for m in v.split(",") if m.strip()]


@click.group()
def families() -> None:
    """Refit families on a running service: make, grow, shrink, list, compute."""


@families.command("list")
@url_option
def list_families(url: str | None) -> None:
    """Every family, with its members' state ("no families", and how to make one, if none)."""
    found = call(url, "GET", V1)
    if not found:
        click.echo("no families: make one with `strata families create NAME --member A --member B`")
    for family in found:
        click.echo(_describe(family))


@families.command("show")
@click.argument("name")
@url_option
def show(name: str, url: str | None) -> None:
    """One family, as JSON."""
    click.echo(json.dumps(call(url, "GET", f"{V1}/{_seg(name)}"), indent=2))


@families.command("create")
@click.argument("name")
@click.option(
    "--member",
    "members",
    multiple=True,
    required=True,
    help="registered model names or ids, comma-separated or with the option repeated",
)
@click.option("--anchor", default=None, help="the member compared against (default: the first)")
@click.option("--n-prompts", type=int, default=None, help="prompts of the built-in corpus (32)")
@click.option("--prompt-len", type=int, default=None, help="tokens per prompt (64)")
@click.option("--n-null", type=int, default=None, help="random models for the null (3)")
@click.option("--seed", type=int, default=None, help="which prompts are drawn (0)")
@click.option("--cka-tokens", type=int, default=None, help="residual rows CKA compares (1024)")
@click.option("--description", default=None)
@url_option
def create(
    name: str,
    members: tuple[str, ...],
    anchor: str | None,
    n_prompts: int | None,
    prompt_len: int | None,
    n_null: int | None,
    seed: int | None,
    cka_tokens: int | None,
    description: str | None,
    url: str | None,
) -> None:
    """Make a refit family of registered models of one architecture."""
    body: dict[str, Any] = {"name": name, "members": _members(members)}
    for key, value in (
        ("anchor", anchor),
        ("n_prompts", n_prompts),
        ("prompt_len", prompt_len),
        ("n_null", n_null),
        ("seed", seed),
        ("cka_tokens", cka_tokens),
        ("description", description),
    ):
        if value is not None:
            body[key] = value
    click.echo(_describe(call(url, "POST", V1, json=body)))


@families.command("add")
@click.argument("name")
@click.argument("members", nargs=-1, required=True)
@url_option
def add(name: str, members: tuple[str, ...], url: str | None) -> None:
    """Add registered models to a family."""
    family = call(url, "POST", f"{V1}/{_seg(name)}/members", json={"members": _members(members)})
    click.echo(_describe(family))


@families.command("remove")
@click.argument("name")
@click.argument("member")
@url_option
def remove(name: str, member: str, url: str | None) -> None:
    """Take a member out of a family."""
    click.echo(_describe(call(url, "DELETE", f"{V1}/{_seg(name)}/members/{_seg(member)}")))


@families.command("compute")
@click.argument("name")
@click.option("--force", is_flag=True, help="compute again even if it is stored")
@click.option("--device", default=None)
@click.option("--queue", default=None, help="broker queue (default gpu)")
@click.option("--watch", "watch_it", is_flag=True, help="then follow it with a progress bar")
@url_option
def compute(
    name: str,
    force: bool,
    device: str | None,
    queue: str | None,
    watch_it: bool,
    url: str | None,
) -> None:
    """Queue the family's stability as a worker's job; prints the job as JSON."""
    body: dict[str, Any] = {"force": force}
    if device is not None:
        body["device"] = device
    if queue is not None:
        body["queue"] = queue
    job = call(url, "POST", f"{V1}/{_seg(name)}/stability", json=body)
    click.echo(json.dumps(job, indent=2))
    if watch_it:
        _watch(url, int(job["id"]))
