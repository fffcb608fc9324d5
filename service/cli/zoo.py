"""`strata zoo ...`: the tiny model zoo (`compute/zoo/`): list, show, train."""

from __future__ import annotations

import json
from pathlib import Path

import click

from compute.errors import StrataError
from service.cli.errors import EXIT_BAD_INPUT, exit_code_of, fail


@click.group()
def zoo() -> None:
    """The tiny model zoo: list the shipped checkpoints, train new ones."""


@zoo.command("list")
def zoo_list() -> None:
    """Zoo models: trained checkpoints with their validation loss, and planted controls."""
    from compute.models import zoo_names
    from compute.zoo.describe import zoo_line

    for name in zoo_names():
        click.echo(zoo_line(name))


@zoo.command("show")
@click.argument("name")
def zoo_show(name: str) -> None:
    """One zoo model as JSON: how it was trained, or for a planted control the answer it
    encodes (the values Strata's metrics should find)."""
    from compute.zoo.describe import zoo_entry

    try:
        entry = zoo_entry(name)
    except StrataError as exc:
        fail(str(exc), exit_code_of(exc))
    if "loss_curve" in entry:  # hundreds of points: summarised, the file has them all
        curve = entry.pop("loss_curve")
        entry["loss_curve"] = f"{len(curve)} points, first {curve[0]}, last {curve[-1]}"
    click.echo(json.dumps(entry, indent=2))


@zoo.command("train")
@click.option("--name", help="name prefix (default: tiny-<L>l-<optimizer>); -s<seed> is appended")
@click.option("--n-layers", type=click.IntRange(1, 6), default=4, show_default=True)
@click.option("--d-model", type=click.IntRange(8), default=128, show_default=True)
@click.option("--n-heads", type=click.IntRange(1), default=4, show_default=True)
@click.option("--n-ctx", type=click.IntRange(4), default=128, show_default=True)
@click.option("--seeds", default="0", show_default=True, help="comma-separated seeds (refits)")
@click.option(
    "--optimizer",
    type=click.Choice(["adamw", "adam"]),
    default="adamw",
    show_default=True,
    help="adamw uses weight decay 0.1, adam none",
)
@click.option("--lr", type=float, default=2e-3, show_default=True)
@click.option("--steps", type=click.IntRange(1), default=500, show_default=True)
@click.option("--batch-size", type=click.IntRange(1), default=32, show_default=True)
@click.option(
    "--repeat-fraction",
    type=click.FloatRange(0.0, 1.0, max_open=True),
    default=0.0,
    show_default=True,
    help="fraction of each batch replaced by synthetic repeated "
    "random sequences (lets induction heads form)",
)
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="where checkpoints go (default: the zoo's checkpoints folder)",
)
def zoo_train(
    name: str | None,
    n_layers: int,
    d_model: int,
    n_heads: int,
    n_ctx: int,
    seeds: str,
    optimizer: str,
    lr: float,
    steps: int,
    batch_size: int,
    repeat_fraction: float,
    out_dir: str | None,
) -> None:
    """Train tiny GPT-2-style models on the built-in corpus, one per seed (a refit family)."""
    from pydantic import ValidationError

    from compute.zoo.paths import ZOO_DIR
    from compute.zoo.train import ZooModelConfig, train_family

    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        fail(f"--seeds {seeds!r}: give comma-separated integers", EXIT_BAD_INPUT)
    try:
        base = ZooModelConfig(
            name=name or f"tiny-{n_layers}l-{optimizer}",
            n_layers=n_layers,
            d_model=d_model,
            n_heads=n_heads,
            n_ctx=n_ctx,
            optimizer=optimizer,
            lr=lr,
            steps=steps,
            batch_size=batch_size,
            repeat_fraction=repeat_fraction,
        )
    except ValidationError as exc:
        fail(f"bad zoo configuration: {exc.errors()[0]['msg']}", EXIT_BAD_INPUT)
    for path in train_family(base, seed_list, Path(out_dir) if out_dir else ZOO_DIR):
        meta = json.loads((path / "strata_zoo.json").read_text())
        click.echo(f"{path.name}: val_loss={meta.get('val_loss')} nats/token -> {path}")
