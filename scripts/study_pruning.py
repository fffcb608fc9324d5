"""Layer pruning on the real models: Block Influence's and Gromov et al.'s choices against the
measured best, and how well each predictor ranks the measured drops (issue 51, item 7).

    .venv/bin/python scripts/study_pruning.py --url http://127.0.0.1:8000 --out results/pruning \
        SmolLM2-135M-Instruct.Q4_1 gemma-3-270m-q4_k_m qwen2.5-coder-0.5b-instruct-q4_k_m

Reads each model's pruning plan for every budget n its run measured
(`GET /models/{m}/pruning-plan?n=`, `service.api.queries.pruning`) and the predictors' rank
correlations (`GET /pruning-scores`), from a service whose store holds, per model, one run with
both `pruning` and `pruning_drops` (`strata compute --metrics pruning,pruning_drops`). Nothing is
computed here: every number is the service's, by the rules fixed in docs/metrics.md before this
study was run.

Fixed before the results (this file's first commit precedes them):
- the models: every real checkpoint the project ships whose run exists; the sequences: the first
  N windows of the built-in corpus, N stated per model (the same seeded order as every run);
- per budget n, the four choices and their rules as the plan defines them (measured best:
  lowest mean KL; block_influence: the n lowest BI; angular_distance_last / angular_distance:
  argmin over l of d(l, n)); the comparison is each predictor's `kl_excess` (its choice's
  measured KL above the measured best's, nats) and whether it picked the measured best;
- a predictor "predicts" the ranking on a model where its Spearman interval (percentile
  bootstrap over sequences, 95%, as `compute.metrics.pruning_scores` computes) lies above 0;
  no correction across models and widths is applied and none is claimed: each row is read on
  its own, and with few sequences the intervals are wide (their width is reported).
No verdict beyond these is drawn here; anything else in the write-up is labelled exploratory.

Writes OUT/plans.json (every plan row and score row as the API gave them) and OUT/plans.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import polars as pl

from service.client import Client

CHOICES = ("measured", "block_influence", "angular_distance_last", "angular_distance")


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def study(client: Client, models: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"models": {}}
    for model in models:
        first = client.pruning_plan(model, 1)
        widths = first.widths
        plans = {}
        for n in widths:
            plan = first if n == 1 else client.pruning_plan(model, n)
            plans[n] = plan.choices.to_dicts()
        scores = first.scores.to_dicts()
        out["models"][model] = {
            "widths": widths,
            "run": first.context.get("run"),
            "predictor_run": first.context.get("predictor_run"),
            "plans": {str(n): rows for n, rows in plans.items()},
            "scores": scores,
        }
    return out


def markdown(found: dict[str, Any]) -> str:
    lines = ["# Layer pruning: predictors' choices against the measured best", ""]
    for model, entry in found["models"].items():
        run = entry["run"] or {}
        lines += [
            f"## {model}",
            "",
            f"Run {run.get('id')}, selected by {run.get('selected_by')}: "
            f"{run.get('n_sequences')} x {run.get('seq_len')} tokens, {run.get('dtype')}, "
            f"families {run.get('families')}.",
        ]
        n_seq = None
        lines += [
            "",
            "| n | choice | blocks | KL (nats) ± stderr | top-1 agreement | loss delta (nats) "
            "| KL above the best |",
            "|---|---|---|---|---|---|---|",
        ]
        for n, rows in entry["plans"].items():
            by = {row["choice"]: row for row in rows}
            for choice in CHOICES:
                row = by.get(choice)
                if row is None:
                    continue
                n_seq = row.get("n_sequences") or n_seq
                blocks = row["blocks"]
                kl = (
                    "not measured (not consecutive)"
                    if not row["measured"]
                    else f"{_fmt(row['kl'])} ± {_fmt(row['kl_stderr'])}"
                )
                lines.append(
                    f"| {n} | {choice} | {blocks} | {kl} | {_fmt(row['top1_agreement'])} "
                    f"| {_fmt(row['loss_delta'])} | {_fmt(row['kl_excess'])} |"
                )
        lines += [
            "",
            f"Sequences: {n_seq}. Rank correlation with the measured drops of width n "
            "(Spearman over the starts, 95% bootstrap interval over sequences):",
            "",
            "| predictor | n | rho | 95% interval | predicts (interval above 0) |",
            "|---|---|---|---|---|",
        ]
        scores = pl.DataFrame(entry["scores"]) if entry["scores"] else None
        if scores is not None and scores.height:
            for row in scores.sort(["predictor", "n"]).to_dicts():
                lines.append(
                    f"| {row['predictor']} | {row['n']} | {_fmt(row['rho'], 2)} "
                    f"| [{_fmt(row['low'], 2)}, {_fmt(row['high'], 2)}] | {row['predicts']} |"
                )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("models", nargs="+")
    args = parser.parse_args()
    client = Client(args.url)
    found = study(client, args.models)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "plans.json").write_text(json.dumps(found, indent=1, default=str) + "\n")
    (args.out / "plans.md").write_text(markdown(found))
    print(markdown(found))


if __name__ == "__main__":
    main()
