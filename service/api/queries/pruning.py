"""Layer pruning as a query (Polars): a model's plan for a budget of n blocks, and how well each
predictor ranks the measured drops, per model.

The plan reads the model's canonical run for `pruning_drops` (the measured drops of n
consecutive blocks and the predictors' rank correlations with them) and, for the predictors,
that same run when it computed `pruning` too, else the model's canonical run for `pruning`.
For a budget n it gives four choices (`service.schemas.pruning.PruningChoice`):

- `measured`: argmin over l of the measured `pruning_drops.kl_<n>` at start l; exact ties go to
  the lowest l;
- `block_influence` (ShortGPT, Men et al. 2024): the n blocks of lowest `pruning.block_influence`
  (ties to the lower block). They need not be consecutive; only a consecutive set of a
  measured width was measured, so only then is its cost given — never an estimate;
- `angular_distance_last` (Gromov et al. 2024, their last-token definition) and
  `angular_distance` (all tokens): argmin over l of `pruning.angular_distance[_last]_<n>`, ties
  to the lowest l; always consecutive, so measured whenever width n was.

Each measured choice's cost is read at its first block from `pruning_drops.kl_<n>`,
`top1_agreement_<n>` and `loss_delta_<n>`, each with its stderr over sequences.

A model with no run of `pruning_drops` still has a plan for n = 1 when a run of it computed
`intervention` (every default run does): dropping one block is that family's `drop` kind, the
same measurement (`pruning_drops` itself reuses it for width 1: docs/metrics.md), so the costs
are `intervention.kl`, `top1_agreement` and `loss_delta` of component `drop`, and the plan says
so (`costs_from`). Wider budgets need the measured n-block drops.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from compute.metrics.pruning_scores import BOOTSTRAP_CI, PREDICTORS
from compute.run import METRIC_VERSION
from service.api.errors import NotFoundHttpError, UnprocessableHttpError
from service.api.queries.answers import (
    Answer,
    check_models,
    checked_run,
    chosen_runs,
    model_ref,
    run_ref,
)
from service.api.queries.cache import Reader
from service.api.queries.index import ModelEntry, Pick, RunEntry, Snapshot
from service.schemas.pruning import (
    SCORE_SCHEMA,
    PruningChoice,
    PruningPlan,
    PruningScore,
    PruningScores,
    ScoredModel,
)
from service.schemas.results import columns

DROPS = "pruning_drops"
SINGLE = "intervention"  # its `drop` kind is the width-1 drop (the plan's fallback for n = 1)
PREDICTOR_FAMILY = "pruning"
COSTS = ("kl", "top1_agreement", "loss_delta")
TIE_RULE = (
    "measured: the lowest mean KL, exact ties to the lowest start l; block_influence: the n "
    "lowest, ties to the lower block; angular distance: the lowest d(l, n), ties to the lowest l"
)
RULES = {
    "measured": "argmin over l of the measured KL of dropping blocks l..l+n-1",
    "block_influence": "ShortGPT: the n blocks of lowest block influence",
    "angular_distance_last": "Gromov et al.: argmin over l of d(l, n), last token",
    "angular_distance": "argmin over l of d(l, n), all tokens",
}
HOW = "strata jobs submit --model {model} --metrics pruning,pruning_drops"


def _how(model: ModelEntry) -> str:
    return (
        f"compute them with `{HOW.format(model=model.name)}` (or POST /api/v1/jobs with "
        '"metrics": ["pruning", "pruning_drops"])'
    )


def _max_width(model: ModelEntry) -> int:
    return max(1, (model.n_layers or 0) // 2)


def score_metrics(model: ModelEntry) -> list[str]:
    """Every stored rank-correlation metric name a run of the model can hold."""
    names = []
    for n in range(1, _max_width(model) + 1):
        for predictor in PREDICTORS:
            if predictor == "block_influence" and n != 1:
                continue
            base = f"{DROPS}.spearman_{predictor}_{n}"
            names += [base, f"{base}_low", f"{base}_high"]
    return names


def _scores(model: ModelEntry, run: RunEntry, rows: pl.DataFrame) -> pl.DataFrame:
    pattern = "|".join(sorted(PREDICTORS, key=len, reverse=True))
    named = (
        rows.filter(
            pl.col("run_id") == run.id, pl.col("metric").str.starts_with(f"{DROPS}.spearman_")
        )
        .select("metric", "value", "stderr", pl.col("n").alias("count"))
        .with_columns(
            pl.col("metric")
            .str.extract_groups(
                rf"^{DROPS}\.spearman_(?P<predictor>{pattern})_(?P<width>\d+)(?:_(?P<bound>low|high))?$"
            )
            .alias("parts")
        )
        .unnest("parts")
        .filter(pl.col("predictor").is_not_null())
        .with_columns(pl.col("width").cast(pl.Int64))
    )
    points = named.filter(pl.col("bound").is_null()).select(
        "predictor",
        pl.col("width").alias("n"),
        "metric",
        pl.col("value").alias("rho"),
        "stderr",
        pl.col("count").cast(pl.Int64).alias("n_sequences"),
    )
    bounds = (
        named.filter(pl.col("bound").is_not_null())
        .pivot(on="bound", index=["predictor", "width"], values="value")
        .rename({"width": "n"})
    )
    for bound in ("low", "high"):
        if bound not in bounds.columns:
            bounds = bounds.with_columns(pl.lit(None, pl.Float64).alias(bound))
    out = points.join(
        bounds.select("predictor", "n", "low", "high"), on=["predictor", "n"], how="left"
    )
    return out.with_columns(
        model=pl.lit(model.name),
        model_id=pl.lit(model.id, pl.Int64),
        target=pl.format(DROPS + ".kl_{}", pl.col("n")),
        level=pl.lit(BOOTSTRAP_CI),
        predicts=pl.when(pl.col("low").is_null()).then(None).otherwise(pl.col("low") > 0),
        run_id=pl.lit(run.id, pl.Int64),
    ).sort("n", "predictor")


def _empty_scores() -> pl.DataFrame:
    return pl.DataFrame(schema=SCORE_SCHEMA)


def _drops_pick(
    snap: Snapshot, model: ModelEntry, run_id: int | None, metric_version: str | None, n: int
) -> tuple[Pick, str]:
    """The run whose measured drops give the costs, and its family: `pruning_drops`, or for
    n = 1 `intervention` when no run of `pruning_drops` is there (module docstring)."""
    version = metric_version or METRIC_VERSION
    if run_id is not None:
        run = checked_run(snap, model, run_id, None)
        family = DROPS if DROPS in run.families else SINGLE if n == 1 else None
        if family is None or family not in run.families:
            raise UnprocessableHttpError(
                f"run {run_id} did not compute {DROPS} (it computed "
                f"{', '.join(sorted(run.families))}): a pruning plan needs the measured drops "
                f"({SINGLE}'s single drops serve n = 1 only); " + _how(model)
            )
        canonical = snap.canonical(model.id, family=family, metric_version=run.metric_version)
        ok = canonical is not None and canonical.canonical and canonical.run == run
        return Pick(run, "run_id", ok), family
    pick = snap.canonical(model.id, family=DROPS, metric_version=version)
    if pick is not None:
        return pick, DROPS
    single = snap.canonical(model.id, family=SINGLE, metric_version=version)
    if single is not None and n == 1:
        return single, SINGLE
    also = f" (its {SINGLE} runs serve a budget of n = 1 only)" if single is not None else ""
    raise NotFoundHttpError(
        f"model {model.name!r} (id {model.id}) has no succeeded run with {DROPS} under metric "
        f"version {version}: no measured drops of n={n} blocks to plan from{also}; " + _how(model)
    )


def _predictor_pick(snap: Snapshot, model: ModelEntry, drops: Pick) -> Pick | None:
    if PREDICTOR_FAMILY in drops.run.families:
        return drops
    return snap.canonical(
        model.id, family=PREDICTOR_FAMILY, metric_version=drops.run.metric_version
    )


def _widths(frame: pl.DataFrame) -> list[int]:
    found = (
        frame.filter(pl.col("metric").str.contains(rf"^{DROPS}\.kl_\d+$"))
        .select(pl.col("metric").str.extract(r"_(\d+)$").cast(pl.Int64))
        .to_series()
        .unique()
        .sort()
    )
    return [int(n) for n in found]


def _choice(
    model: ModelEntry,
    n: int,
    name: str,
    blocks: list[int] | None,
    score: float | None,
    score_metric: str | None,
    costs: pl.DataFrame,
    best: dict[str, Any],
    run: RunEntry,
    note: str | None = None,
) -> dict[str, Any]:
    """One row of the plan: the blocks chosen and, if that exact set was measured, its cost."""
    consecutive = None if blocks is None else blocks == list(range(blocks[0], blocks[0] + n))
    start = blocks[0] if blocks and consecutive else None
    row: dict[str, Any] = {
        "model": model.name,
        "model_id": model.id,
        "n": n,
        "choice": name,
        "rule": RULES[name],
        "blocks": blocks,
        "consecutive": consecutive,
        "layer_start": start,
        "score": score,
        "score_metric": score_metric,
        "measured": False,
        "same_as_measured": None if blocks is None else start == best["layer"],
        "run_id": run.id,
        "note": note,
    }
    measured = costs.filter(pl.col("layer") == start) if start is not None else costs.clear()
    if measured.height:
        got = measured.row(0, named=True)
        row.update({k: got[k] for k in got if k != "layer"})
        row["measured"] = got["kl"] is not None
        row["kl_excess"] = None if got["kl"] is None else got["kl"] - best["kl"]
    elif blocks is not None and note is None:
        row["note"] = (
            f"blocks {', '.join(map(str, blocks))} are not consecutive: {DROPS} measures "
            "consecutive blocks only, so this set's cost was not measured"
        )
    return row


def _plan_rows(
    model: ModelEntry,
    n: int,
    drops: RunEntry,
    predictors: RunEntry | None,
    frame: pl.DataFrame,
) -> pl.DataFrame:
    at = frame.filter(pl.col("run_id") == drops.id)
    costs = None
    for metric in COSTS:
        part = at.filter(pl.col("metric") == f"{DROPS}.{metric}_{n}").select(
            "layer",
            pl.col("value").alias(metric),
            pl.col("stderr").alias(f"{metric}_stderr"),
            *([pl.col("n").cast(pl.Int64).alias("n_sequences")] if metric == "kl" else []),
        )
        costs = part if costs is None else costs.join(part, on="layer", how="left")
    assert costs is not None
    costs = costs.sort("layer")
    best = costs.sort(["kl", "layer"], nulls_last=True).row(0, named=True)
    rows = [
        _choice(
            model,
            n,
            "measured",
            [best["layer"] + i for i in range(n)],
            None,
            None,
            costs,
            best,
            drops,
        )
    ]
    if predictors is None:
        missing = f"no run of this model computed {PREDICTOR_FAMILY}; " + _how(model)
        for name in ("block_influence", "angular_distance_last", "angular_distance"):
            rows.append(_choice(model, n, name, None, None, None, costs, best, drops, missing))
    else:
        pred = frame.filter(pl.col("run_id") == predictors.id)
        influence = (
            pred.filter(pl.col("metric") == f"{PREDICTOR_FAMILY}.block_influence")
            .sort(["value", "layer"], nulls_last=True)
            .head(n)
        )
        blocks = sorted(int(b) for b in influence["layer"])
        rows.append(
            _choice(
                model,
                n,
                "block_influence",
                blocks if len(blocks) == n else None,
                float(influence["value"].sum()) if len(blocks) == n else None,
                f"{PREDICTOR_FAMILY}.block_influence",
                costs,
                best,
                drops,
                None if len(blocks) == n else "the run has no block influence rows",
            )
        )
        for name in ("angular_distance_last", "angular_distance"):
            metric = f"{PREDICTOR_FAMILY}.{name}_{n}"
            found = pred.filter(pl.col("metric") == metric).sort(
                ["value", "layer"], nulls_last=True
            )
            if found.height == 0:
                rows.append(
                    _choice(
                        model,
                        n,
                        name,
                        None,
                        None,
                        metric,
                        costs,
                        best,
                        drops,
                        f"the run has no {metric} rows",
                    )
                )
                continue
            start = int(found["layer"][0])
            rows.append(
                _choice(
                    model,
                    n,
                    name,
                    list(range(start, start + n)),
                    float(found["value"][0]),
                    metric,
                    costs,
                    best,
                    drops,
                )
            )
    schema: dict[str, Any] = {
        "kl": pl.Float64, "kl_stderr": pl.Float64, "kl_excess": pl.Float64,
        "top1_agreement": pl.Float64, "top1_agreement_stderr": pl.Float64,
        "loss_delta": pl.Float64, "loss_delta_stderr": pl.Float64, "n_sequences": pl.Int64,
        "blocks": pl.List(pl.Int64), "layer_start": pl.Int64, "score": pl.Float64,
        "score_metric": pl.String, "consecutive": pl.Boolean, "same_as_measured": pl.Boolean,
        "note": pl.String,
    }  # fmt: skip
    for row in rows:
        for key in schema:
            row.setdefault(key, None)
    return pl.DataFrame(rows, schema_overrides=schema)


def pruning_plan(
    reader: Reader,
    snap: Snapshot,
    model_ref_: str,
    *,
    n: int,
    run_id: int | None,
    metric_version: str | None,
    model_id: int | None,
) -> Answer:
    """The model's pruning plan for a budget of `n` blocks (module docstring)."""
    model = snap.model(model_ref_, model_id)
    drops, costs_from = _drops_pick(snap, model, run_id, metric_version, n)
    predictors = _predictor_pick(snap, model, drops)
    runs = [drops.run] + ([predictors.run] if predictors and predictors.run != drops.run else [])
    picks = [drops] + ([predictors] if predictors and predictors.run != drops.run else [])
    top = _max_width(model)
    if not 1 <= n <= top:
        raise UnprocessableHttpError(
            f"n={n} is out of range: a budget is 1..{top} blocks on this model of "
            f"{model.n_layers} blocks (pruning_drops measures up to half of them)"
        )
    cost_metrics = [f"{DROPS}.{m}_{w}" for m in COSTS for w in range(1, top + 1)]
    predictor_metrics = [f"{PREDICTOR_FAMILY}.block_influence"] + [
        f"{PREDICTOR_FAMILY}.{p}_{n}" for p in ("angular_distance", "angular_distance_last")
    ]
    context = PruningPlan(
        model_ref(model),
        n,
        [],
        TIE_RULE,
        run_ref(drops),
        None if predictors is None else run_ref(predictors),
        [],
        [],
        costs_from,
    )

    def drop_rows() -> pl.DataFrame:
        """The cost rows, named as `pruning_drops`'s (the single drops' under width 1)."""
        if costs_from == DROPS:
            return reader.rows([drops.run], cost_metrics + score_metrics(model))
        single = reader.rows([drops.run], [f"{SINGLE}.{m}" for m in COSTS], component="drop")
        return single.with_columns(
            pl.col("metric").str.replace(rf"^{SINGLE}\.(.*)$", f"{DROPS}.${{1}}_1")
        )

    def load() -> pl.DataFrame:
        frame = drop_rows()
        if predictors is not None:
            frame = pl.concat(
                [frame, reader.rows([predictors.run], predictor_metrics)], how="vertical_relaxed"
            )
        scores = _scores(model, drops.run, frame)
        context.scores = [
            PruningScore(**{k: r[k] for k in columns(PruningScore)}) for r in scores.to_dicts()
        ]
        return _plan_rows(model, n, drops.run, predictors.run if predictors else None, frame)

    # Checked before the answer is encoded (a 422, not an error inside encoding): the widths
    # the run measured, from its (cached) rows.
    widths = (
        _widths(reader.rows([drops.run], [f"{DROPS}.kl_{w}" for w in range(1, top + 1)]))
        if costs_from == DROPS
        else [1]
    )
    context.widths = widths
    if n not in widths:
        raise UnprocessableHttpError(
            f"budget n={n} was not measured in run {drops.run.id} (it measured "
            f"n = {', '.join(map(str, widths)) or 'none'}); other widths up to {top} are "
            "measured with EngineOptions(drop_widths=...) from Python (the default is 1..4, "
            "capped at L/2); " + _how(model)
        )
    return Answer(context, columns(PruningChoice), runs, run_id is not None, load, picks)


def pruning_scores(
    reader: Reader,
    snap: Snapshot,
    *,
    models: list[str],
    predictor: str | None,
    n: int | None,
    metric_version: str | None,
    run_ids: list[int] | None,
) -> Answer:
    """Every stored rank correlation of the predictors with the measured drops, per model (its
    canonical `pruning_drops` run, or the run named), optionally of one predictor or width."""
    check_models(models, "gpt2,pythia-160m")
    if predictor is not None and predictor not in PREDICTORS:
        raise UnprocessableHttpError(
            f"unknown predictor {predictor!r}; one of {', '.join(PREDICTORS)}"
        )
    entries = snap.models_named(models)
    chosen = chosen_runs(snap, entries, run_ids)
    picks: dict[int, Pick | None] = {}
    for m in entries:
        if m.id in chosen:
            # scores exist only beside the n-block drops: no single-drop fallback (n = 0)
            picks[m.id] = _drops_pick(snap, m, chosen[m.id], metric_version, 0)[0]
        else:
            picks[m.id] = snap.canonical(
                m.id, family=DROPS, metric_version=metric_version or METRIC_VERSION
            )
    found = [p for p in picks.values() if p is not None]
    context = PruningScores(predictor, n, [], [])

    def load() -> pl.DataFrame:
        parts = []
        for m in entries:
            pick = picks[m.id]
            rows = _empty_scores()
            if pick is not None:
                rows = _scores(m, pick.run, reader.rows([pick.run], score_metrics(m)))
                if predictor is not None:
                    rows = rows.filter(pl.col("predictor") == predictor)
                if n is not None:
                    rows = rows.filter(pl.col("n") == n)
            context.models.append(
                ScoredModel(
                    m.id,
                    m.name,
                    m.n_layers,
                    None if pick is None else pick.run.id,
                    rows.height,
                    None if pick is None else run_ref(pick),
                )
            )
            parts.append(rows.select(columns(PruningScore)))
        frame = pl.concat(parts, how="vertical_relaxed") if parts else _empty_scores()
        return frame.select(columns(PruningScore))

    if not found:
        names = ", ".join(m.name for m in entries)
        raise NotFoundHttpError(
            f"none of {names} has a succeeded run with {DROPS}: no predictor scores; "
            + _how(entries[0])
        )
    return Answer(
        context,
        columns(PruningScore),
        [p.run for p in found],
        len(chosen) == len(entries),
        load,
        found,
    )
