"""`strata stability`: head stability and residual CKA across refits (`compute.refits`),
written to a file and/or stored as a refit family."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from compute.errors import StrataError
from service.cli.db import check_store_writable
from service.cli.errors import EXIT_BAD_INPUT, exit_code_of, fail
from service.cli.outputs import NO_OUTPUT, out_format, out_option
from service.settings import get_settings

if TYPE_CHECKING:
    from compute.refits import FamilyStability


@click.command()
@click.option(
    "--family",
    "members",
    multiple=True,
    required=True,
    help="refit models (zoo names, checkpoint dirs, GGUF files, TransformerLens names such as "
    "EleutherAI/pythia-160m-seed1), comma-separated or with the option repeated, or one folder "
    "holding refit checkpoint folders",
)
@click.option("--anchor", default=None, help="the refit compared against (default: the first)")
@click.option("--n-prompts", type=int, default=32, show_default=True)
@click.option("--prompt-len", type=int, default=64, show_default=True)
@click.option(
    "--n-null",
    type=int,
    default=3,
    show_default=True,
    help="randomly initialised models for the null baseline",
)
@click.option("--device", default="cpu", show_default=True)
@out_option
@click.option(
    "--store",
    is_flag=True,
    help="also store the comparison in the results store (STRATA_DATABASE), as the "
    "refit family --name",
)
@click.option(
    "--name",
    "family_name",
    default=None,
    help="the refit family's name in the store (default: the members' common name "
    "prefix, e.g. tiny-4l for tiny-4l-s0, tiny-4l-s1)",
)
def stability(
    members: tuple[str, ...],
    anchor: str | None,
    n_prompts: int,
    prompt_len: int,
    n_null: int,
    device: str,
    out_path: str | None,
    store: bool,
    family_name: str | None,
) -> None:
    """Attention-head stability and residual CKA across refits of one architecture."""
    import time

    from compute.refits import family_name as common_name
    from compute.refits import family_stability
    from service.exports import write_atomic

    if out_path is None and not store:
        fail(NO_OUTPUT, EXIT_BAD_INPUT)
    out = Path(out_path) if out_path else None
    fmt = out_format(out) if out is not None else None
    try:
        if store:  # fail before computing if the results could not be stored
            check_store_writable(get_settings())
        start = time.perf_counter()
        result = family_stability(
            list(members),
            anchor=anchor,
            n_prompts=n_prompts,
            prompt_len=prompt_len,
            n_null=n_null,
            device=device,
        )
        wall_s = time.perf_counter() - start
    except StrataError as exc:
        fail(str(exc), exit_code_of(exc))
    if out is not None and fmt is not None:
        write_atomic(out, fmt.encode(result.records, result.metadata()))
        click.echo(f"wrote {result.records.num_rows} records to {out}", err=True)
    if store:
        name = family_name or common_name([spec.name for spec, _ in result.members])
        try:
            summary = _store(name, result, device, wall_s)
        except StrataError as exc:
            fail(str(exc), exit_code_of(exc))
        click.echo(
            f"stored refit family {name!r} (stability run {summary.run_id}) in "
            f"{get_settings().database}",
            err=True,
        )


def _store(name: str, result: FamilyStability, device: str, wall_s: float) -> Any:
    from service.store import Store
    from service.store.migrate import ensure_current
    from service.store.stability import StabilityResult, ingest_stability

    stored = StabilityResult(
        family=name,
        anchor=result.anchor,
        members=result.members,
        records=result.records,
        options=result.options.model_dump(mode="json"),
        prompts=result.prompts,
        device=device,
        wall_s=wall_s,
        environment=result.environment,
    )
    with Store.open(get_settings().database) as opened:
        ensure_current(opened)
        return ingest_stability(opened, stored)
