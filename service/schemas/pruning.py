"""Layer pruning: a model's plan for a budget of n blocks, and how well each predictor ranks the
measured drops (docs/api.md: pruning plan; docs/metrics.md: pruning.*, pruning_drops.*)."""

from __future__ import annotations

import msgspec
import polars as pl

from service.schemas.common import ModelRef, RunRef


class PruningChoice(msgspec.Struct):
    """One way of removing `n` blocks and what removing them measurably costs.

    `choice`: `measured` (the start l whose drop of blocks l..l+n-1 has the lowest measured KL;
    exact ties to the lowest l), `block_influence` (ShortGPT: the n blocks of lowest block
    influence, ties to the lower block), `angular_distance_last` (Gromov et al.: argmin over l
    of d(l, n) on the last token, their definition) or `angular_distance` (the same, all
    tokens). `blocks` the blocks removed (null: the predictor is not in the runs read);
    `consecutive` whether they are one run of blocks, `layer_start` its first block.
    `score` the predictor's value for the choice (block influence: the sum over the blocks;
    d(l, n) at the chosen l; measured: null) and `score_metric` its metric.
    `measured`: whether this exact set of blocks was measured (`pruning_drops` measures
    consecutive blocks only); if not, every cost is null and `note` says why.
    The costs are `pruning_drops.<metric>_<n>` at `layer_start`: mean KL(P || Q) (nats), top-1
    agreement with the clean model (fraction) and loss(Q) - loss(P) (nats), each with its
    stderr over sequences; `kl_excess` the choice's KL above the measured best's (0 when it
    is the measured best); `n_sequences` the sequences behind them."""

    model: str
    model_id: int
    n: int
    choice: str
    rule: str
    blocks: list[int] | None
    consecutive: bool | None
    layer_start: int | None
    score: float | None
    score_metric: str | None
    measured: bool
    same_as_measured: bool | None
    kl: float | None
    kl_stderr: float | None
    kl_excess: float | None
    top1_agreement: float | None
    top1_agreement_stderr: float | None
    loss_delta: float | None
    loss_delta_stderr: float | None
    n_sequences: int | None
    run_id: int
    note: str | None


class PruningScore(msgspec.Struct):
    """How well one predictor ranks the measured drops of width `n` on one model: Spearman's
    rho over the starts l between the predictor's per-block means and the measured
    `pruning_drops.kl_<n>` (`target`); `low`/`high` its percentile bootstrap interval over
    sequences at `level`, `stderr` the bootstrap's spread, `n_sequences` the sequences.
    `predictor`: block_influence (n = 1 only), angular_distance (all tokens) or
    angular_distance_last (the last token, Gromov et al.'s definition). `metric` the stored
    metric (`pruning_drops.spearman_<predictor>_<n>`). `predicts`: the interval lies above 0
    (true), below or across it (false)."""

    model: str
    model_id: int
    predictor: str
    n: int
    metric: str
    target: str
    rho: float
    low: float | None
    high: float | None
    level: float
    stderr: float | None
    n_sequences: int
    predicts: bool | None
    run_id: int


class PruningPlan(msgspec.Struct):
    """A model's pruning plan for a budget of `n` blocks. `widths` the budgets measured in the
    run read (`pruning_drops` widths); `run` the run of the measured drops (and of the scores),
    `predictor_run` the run of the `pruning` predictors (null: none; then the predictors'
    choices have no blocks). `scores`: every stored rank correlation of the run (all widths).
    `costs_from`: the family whose measured drops the costs are, `pruning_drops`, or, for n = 1
    on a model with no run of it, `intervention` (its `drop` kind: the same single-block drop,
    which `pruning_drops` reuses for width 1; no scores then)."""

    model: ModelRef
    n: int
    widths: list[int]
    tie_rule: str
    run: RunRef
    predictor_run: RunRef | None
    scores: list[PruningScore]
    rows: list[PruningChoice]
    costs_from: str


class ScoredModel(msgspec.Struct):
    id: int
    name: str
    n_layers: int | None
    run_id: int | None
    n_points: int
    run: RunRef | None = None


class PruningScores(msgspec.Struct):
    """Rank correlations of the pruning predictors with the measured drops across models (one
    row per model, predictor and width); `models` the runs read (`run_id` null: the model has
    no run with `pruning_drops`)."""

    predictor: str | None
    n: int | None
    models: list[ScoredModel]
    rows: list[PruningScore]


# A `PruningScore` row as a Polars frame's columns: the API's tables and the client's read it.
SCORE_SCHEMA: dict[str, type[pl.DataType]] = {
    "model": pl.String,
    "model_id": pl.Int64,
    "predictor": pl.String,
    "n": pl.Int64,
    "metric": pl.String,
    "target": pl.String,
    "rho": pl.Float64,
    "low": pl.Float64,
    "high": pl.Float64,
    "level": pl.Float64,
    "stderr": pl.Float64,
    "n_sequences": pl.Int64,
    "predicts": pl.Boolean,
    "run_id": pl.Int64,
}
