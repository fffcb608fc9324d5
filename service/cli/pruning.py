"""`strata pruning ...`: a model's pruning plan for a budget of n blocks, and how well the
pruning predictors rank the measured drops, from a running service (`--url`)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import click

from service.cli.http import call, url_option


@click.group()
def pruning() -> None:
    """Layer pruning: the plan for a budget of blocks, and the predictors' scores."""


def _num(value: Any, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _cost(row: dict[str, Any], metric: str) -> str:
    if row[metric] is None:
        return "-"
    return f"{_num(row[metric])} ± {_num(row[f'{metric}_stderr'], 2)}"


def _scores_text(scores: list[dict[str, Any]]) -> list[str]:
    lines = []
    for s in scores:
        verdict = {True: "predicts", False: "does not predict", None: "?"}[s["predicts"]]
        lines.append(
            f"  {s['predictor']:<22} n={s['n']}  rho {_num(s['rho'], 3)} "
            f"[{_num(s['low'], 3)}, {_num(s['high'], 3)}] ({s['level']:.0%}, "
            f"{s['n_sequences']} sequences): {verdict}"
        )
    return lines


@pruning.command("plan")
@click.option("--model", required=True, help="registered model name or id")
@click.option("--n", "n", type=int, default=1, show_default=True, help="blocks to remove")
@click.option("--run-id", type=int, default=None, help="read this run (default: canonical)")
@click.option("--json", "as_json", is_flag=True, help="print the API's JSON answer")
@url_option
def plan(model: str, n: int, run_id: int | None, as_json: bool, url: str | None) -> None:
    """The measured best block(s) to remove for a budget of n, what Block Influence's and
    Gromov's rules would remove, and what each choice measurably costs."""
    params: dict[str, Any] = {"n": n}
    if run_id is not None:
        params["run_id"] = run_id
    answer = call(url, "GET", f"/api/v1/models/{quote(model, safe='')}/pruning-plan", params=params)
    if as_json:
        click.echo(json.dumps(answer, indent=2))
        return
    m, run = answer["model"], answer["run"]
    click.echo(
        f"{m['name']} ({m['n_layers']} blocks), budget n={answer['n']} "
        f"(measured: n = {', '.join(map(str, answer['widths']))}); run {run['id']} "
        f"({run['selected_by']}, {run['n_sequences']} sequences)"
    )
    if answer["costs_from"] != "pruning_drops":
        click.echo(
            f"  costs from the {answer['costs_from']} family's single-block drops (no run with "
            "pruning_drops; wider budgets need it)"
        )
    for row in answer["rows"]:
        blocks = "-" if row["blocks"] is None else ",".join(map(str, row["blocks"]))
        click.echo(
            f"  {row['choice']:<22} blocks {blocks:<10} KL {_cost(row, 'kl')}  "
            f"top-1 {_cost(row, 'top1_agreement')}  loss delta {_cost(row, 'loss_delta')}"
        )
        if row["note"]:
            click.echo(f"    {row['note']}")
    wanted = {answer["n"], 1}
    click.echo("rank correlation with the measured KL:")
    for line in _scores_text([s for s in answer["scores"] if s["n"] in wanted]):
        click.echo(line)


@pruning.command("scores")
@click.option("--models", required=True, help="comma-separated model names or ids")
@click.option("--predictor", default=None, help="block_influence, angular_distance(_last)")
@click.option("--n", "n", type=int, default=None, help="one width only")
@click.option("--json", "as_json", is_flag=True, help="print the API's JSON answer")
@url_option
def scores(
    models: str, predictor: str | None, n: int | None, as_json: bool, url: str | None
) -> None:
    """Does each predictor rank the blocks as their measured drops do? Per model: Spearman's
    rho with the measured KL, and its bootstrap interval over sequences."""
    params: dict[str, Any] = {"models": models}
    if predictor is not None:
        params["predictor"] = predictor
    if n is not None:
        params["n"] = n
    answer = call(url, "GET", "/api/v1/pruning-scores", params=params)
    if as_json:
        click.echo(json.dumps(answer, indent=2))
        return
    for m in answer["models"]:
        rows = [r for r in answer["rows"] if r["model_id"] == m["id"]]
        where = "no run with pruning_drops" if m["run_id"] is None else f"run {m['run_id']}"
        click.echo(f"{m['name']}: {where}")
        for line in _scores_text(rows):
            click.echo(line)
