"""`strata stages`: the three stage boundaries of a model, from its computed metrics."""

from __future__ import annotations

import json
from pathlib import Path

import click

from compute.errors import StrataError
from service.cli.errors import exit_code_of, fail
from service.cli.outputs import out_format


@click.command()
@click.option(
    "--results",
    "results_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="output of `strata compute` (.parquet, .json, .csv or .arrow)",
)
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False),
    help="write boundary records here (default: print boundaries as JSON)",
)
def stages(results_path: str, out_path: str | None) -> None:
    """Place the three stage boundaries of a model from its computed metrics, with evidence."""
    from compute.records import records_to_table, validate_records
    from compute.stages import infer_stages, n_layers_of, stage_records
    from service.exports import read_records, write_atomic

    results = Path(results_path)
    # the per-sequence means `strata compute --out` writes beside the results: intervals
    side = results.with_name(f"{results.stem}.sequence_means{results.suffix}")
    try:
        frame = read_records(results)
        n_layers = n_layers_of(frame)
        boundaries = infer_stages(frame, n_layers, read_records(side) if side.exists() else None)
    except StrataError as exc:
        fail(str(exc), exit_code_of(exc))
    evidence = [
        {
            "boundary": b.index,
            "ends_stage": b.index,
            "layer": b.layer,
            "relative_depth": b.relative_depth,
            "clear": b.clear,
            "rule": b.rule,
            "evidence": b.evidence,
        }
        for b in boundaries
    ]
    if out_path is None:
        click.echo(json.dumps({"n_layers": n_layers, "boundaries": evidence}, indent=2))
        return
    out = Path(out_path)
    fmt = out_format(out)
    table = validate_records(records_to_table(stage_records(boundaries, n_layers)))
    write_atomic(out, fmt.encode(table, {"n_layers": n_layers, "boundaries": evidence}))
    for b in evidence:
        where = f"layer {b['layer']}" if b["clear"] else "no clear boundary"
        click.echo(f"boundary {b['boundary']}: {where}", err=True)
