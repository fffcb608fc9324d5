"""`strata lens ...`: the stored tuned lenses (`compute.lens.store`): list, export, import.

Lenses live in `<data_dir>/lenses/` (STRATA_DATA_DIR); `strata compute --metrics tuned_lens`
and jobs train one there when the run's key has none, and reuse it after.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from compute.errors import StrataError
from service.cli.errors import exit_code_of, fail
from service.settings import get_settings

if TYPE_CHECKING:
    from compute.lens.store import LensStore


def _store() -> LensStore:
    from compute.lens.store import LensStore

    return LensStore(get_settings().data_dir / "lenses")


@click.group()
def lens() -> None:
    """Tuned lenses: the trained translators the tuned_lens family evaluates."""


@lens.command("list")
def lens_list() -> None:
    """One JSON line per stored lens: key, model, basis, training and the budget it used."""
    store = _store()
    try:
        infos = store.list()
    except StrataError as exc:
        fail(str(exc), exit_code_of(exc))
    for info in infos:
        entry = {
            "key": info.key,
            "model": info.model.get("name"),
            "n_layers": info.n_layers,
            "d_model": info.d_model,
            "basis": info.basis,
            "tokens": info.tokens,
            "training": info.training,
            "report": info.report,
        }
        click.echo(json.dumps(entry))


@lens.command("export")
@click.argument("key")
@click.argument("dest", type=click.Path(dir_okay=False))
def lens_export(key: str, dest: str) -> None:
    """Copy the stored lens KEY to DEST (safetensors, its identity in the metadata)."""
    store = _store()
    try:
        path = store.export(key, Path(dest))
    except StrataError as exc:
        fail(str(exc), exit_code_of(exc))
    click.echo(f"exported lens {key} to {path}", err=True)


@lens.command("import")
@click.option("--model", "model_ref", required=True, help="the model the lens is for")
@click.option(
    "--no-processing",
    is_flag=True,
    help="the model unprocessed (a Hugging Face-basis lens of a LayerNorm model needs it)",
)
@click.argument("path", type=click.Path(dir_okay=False))
def lens_import(model_ref: str, no_processing: bool, path: str) -> None:
    """Import a safetensors lens for a model: a Strata export, or a tuned-lens package lens
    saved as safetensors (`<i>.weight`, `<i>.bias`). Prints its key, for `strata compute
    --lens KEY`. Refused (exit 2) when its shapes or keys do not fit the model."""
    from compute.lens.store import import_lens
    from compute.models import Processing, load_model, resolve_model_spec

    store = _store()
    processing = Processing.none() if no_processing else Processing()
    try:
        lm = load_model(resolve_model_spec(model_ref, processing=processing))
        imported = import_lens(Path(path), lm, store)
    except StrataError as exc:
        fail(str(exc), exit_code_of(exc))
    click.echo(imported.info.key)
