"""`strata compute`: per-layer metrics of one model, written to a file and/or the store."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from compute.errors import SpecError, StrataError
from service.cli.db import check_store_writable, store_result
from service.cli.errors import EXIT_BAD_INPUT, exit_code_of, fail
from service.cli.outputs import NO_OUTPUT, format_rate, out_format, out_option
from service.exports import require_format
from service.settings import get_settings


@click.command()
@click.option(
    "--model",
    "model_ref",
    required=True,
    help="zoo name, local Hugging Face checkpoint dir, or TransformerLens name",
)
@click.option(
    "--tokens",
    "tokens_path",
    type=click.Path(dir_okay=False),
    help="pre-tokenized .npy [n_sequences, seq_len], used exactly as given",
)
@click.option(
    "--corpus",
    "corpus_path",
    type=click.Path(),
    help="text file or folder (default: built-in offline corpus)",
)
@click.option("--pile", is_flag=True, help="tokens from the Pile via `datasets` (needs network)")
@click.option("--n-sequences", type=int, default=32, show_default=True)
@click.option(
    "--seq-len",
    type=int,
    default=128,
    show_default=True,
    help="tokens per sequence including the BOS at position 0",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--metrics",
    "metrics",
    default=",".join(
        ["intervention", "logit_lens", "neurons", "similarity", "attention", "norms", "heads"]
    ),
    show_default=True,
    help="comma-separated metric families",
)
@click.option("--device", default="cpu", show_default=True)
@click.option(
    "--dtype",
    type=click.Choice(["float32", "bfloat16", "float16"]),
    default="float32",
    show_default=True,
)
@click.option("--batch-size", type=int, default=None, help="sequences per batch (default: auto)")
@click.option(
    "--tokens-per-batch",
    type=int,
    default=None,
    help="automatic batch on a CPU: about this many tokens per batch (default: the "
    "measured best, 1024)",
)
@click.option(
    "--memory-budget-mb",
    type=int,
    default=None,
    help="automatic batch: memory the sweep may use beyond the weights, MiB "
    "(default: on a GPU 85%% of what is free after loading, on a CPU half the "
    "weights' size, at least 64)",
)
@click.option(
    "--no-processing",
    is_flag=True,
    help="skip LayerNorm folding and weight centering (results of drop/swap/lens agree)",
)
@click.option(
    "--lens",
    "lens_key",
    default=None,
    help="tuned_lens: evaluate this stored lens (`strata lens list`, `strata lens import`) "
    "instead of training one",
)
@click.option(
    "--lens-steps",
    type=int,
    default=None,
    help="tuned_lens: training steps (default 250; part of the lens's key)",
)
@click.option(
    "--lens-train-sequences",
    type=int,
    default=None,
    help="tuned_lens: training sequences, windows of the token source never evaluated "
    "(default 256; part of the lens's key)",
)
@click.option(
    "--screen-steps",
    type=int,
    default=None,
    help="heads_screen: points of the integrated gradient (default 1; part of the run)",
)
@click.option(
    "--screen-samples",
    type=int,
    default=None,
    help="heads_screen: target draws of the curvature term (default 8; 0 = first order; "
    "part of the run)",
)
@click.option(
    "--screen-top-k",
    type=int,
    default=None,
    help="heads_screen: the screen's top k heads ablated exactly (default 10; part of the run)",
)
@click.option(
    "--screen-calibration",
    type=int,
    default=None,
    help="heads_screen: the run's first c sequences on which every head is ablated exactly, "
    "to correct each estimate by its error there (default 0: the estimate alone; part of "
    "the run)",
)
@out_option
@click.option(
    "--store", is_flag=True, help="also write the run into the results store (STRATA_DATABASE)"
)
@click.option("--quiet", is_flag=True, help="no progress bar")
def compute(
    model_ref: str,
    tokens_path: str | None,
    corpus_path: str | None,
    pile: bool,
    n_sequences: int,
    seq_len: int,
    seed: int,
    metrics: str,
    device: str,
    dtype: str,
    batch_size: int | None,
    tokens_per_batch: int | None,
    memory_budget_mb: int | None,
    no_processing: bool,
    lens_key: str | None,
    lens_steps: int | None,
    lens_train_sequences: int | None,
    screen_steps: int | None,
    screen_samples: int | None,
    screen_top_k: int | None,
    screen_calibration: int | None,
    out_path: str | None,
    store: bool,
    quiet: bool,
) -> None:
    """Compute per-layer metrics of a model and write them in the record format of
    docs/metrics.md."""
    if out_path is None and not store:
        fail(NO_OUTPUT, EXIT_BAD_INPUT)
    out = Path(out_path) if out_path else None
    if out is not None:
        out_format(out)
    if sum(bool(x) for x in (tokens_path, corpus_path, pile)) > 1:
        fail("give at most one of --tokens, --corpus, --pile", EXIT_BAD_INPUT)
    try:
        config = _run_config(
            model_ref,
            tokens_path,
            corpus_path,
            pile,
            n_sequences,
            seq_len,
            seed,
            metrics,
            dtype,
            no_processing,
            {
                "batch_size": batch_size,
                "tokens_per_batch": tokens_per_batch,
                "memory_budget_mb": memory_budget_mb,
            },
            {"lens": lens_key, "steps": lens_steps, "train_sequences": lens_train_sequences},
            {
                "screen_steps": screen_steps,
                "screen_samples": screen_samples,
                "screen_top_k": screen_top_k,
                "screen_calibration": screen_calibration,
            },
        )
        if store:  # fail before hours of compute if the results could not be stored
            check_store_writable(get_settings())
        warn_if_dtype_is_slow(dtype, device)
        result = _compute_with_progress(config, device, quiet)
    except StrataError as exc:
        fail(str(exc), exit_code_of(exc))
    if out is not None:  # written first: results survive if the store is taken meanwhile
        _write_outputs(result, out)
        click.echo(f"wrote {result.records.num_rows} records to {out}", err=True)
    if store:
        try:
            run_id = store_result(result, get_settings())
        except StrataError as exc:
            fail(str(exc), exit_code_of(exc))
        click.echo(f"stored run {run_id} in {get_settings().database}", err=True)


def _run_config(
    model_ref: str,
    tokens_path: str | None,
    corpus_path: str | None,
    pile: bool,
    n_sequences: int,
    seq_len: int,
    seed: int,
    metrics: str,
    dtype: str,
    no_processing: bool,
    performance: dict[str, int | None],
    lens: dict[str, Any] | None = None,
    screen: dict[str, int | None] | None = None,
) -> Any:
    from compute.metrics import families_named
    from compute.metrics.base import EngineOptions
    from compute.models import Processing, resolve_model_spec
    from compute.run import RunConfig
    from compute.tokens import TokenSpec

    families = [m.strip() for m in metrics.split(",") if m.strip()]
    families_named(families)
    processing = Processing.none() if no_processing else Processing()
    if tokens_path is not None:
        token_spec = TokenSpec(source="npy", path=tokens_path, n_sequences=0, seq_len=0, seed=seed)
    elif corpus_path is not None:
        token_spec = TokenSpec(
            source="corpus", path=corpus_path, n_sequences=n_sequences, seq_len=seq_len, seed=seed
        )
    else:
        token_spec = TokenSpec(
            source="pile" if pile else "builtin",
            n_sequences=n_sequences,
            seq_len=seq_len,
            seed=seed,
        )
    if n_sequences < 1 or seq_len < 3:
        raise SpecError("--n-sequences must be >= 1 and --seq-len >= 3")
    from pydantic import ValidationError

    from compute.lens.config import LensTraining

    try:
        training = LensTraining(**{k: v for k, v in (lens or {}).items() if v is not None})
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0])
        flag = "--lens" if name == "lens" else "--lens-" + name.replace("_", "-")
        raise SpecError(f"bad {flag}: {error['msg']}") from exc
    try:
        settings = {k: v for k, v in (screen or {}).items() if v is not None}
        options = EngineOptions(**performance, **settings, tuned_lens=training)
    except ValidationError as exc:
        error = exc.errors()[0]
        flag = "--" + str(error["loc"][0]).replace("_", "-")
        raise SpecError(f"bad {flag}: {error['msg']}") from exc
    return RunConfig(
        model=resolve_model_spec(model_ref, dtype=dtype, processing=processing),  # type: ignore[arg-type]
        tokens=token_spec,
        families=tuple(families),
        options=options,
    )


def warn_if_dtype_is_slow(dtype: str, device: str) -> None:
    """Say so before computing when `dtype` is emulated here (compute.hardware): a bfloat16
    run on a CPU without AMX / AVX512-BF16 takes ~90x as long as in float32."""
    from compute.hardware import dtype_speed_warning

    note = dtype_speed_warning(dtype, device)
    if note:
        click.echo(f"warning: {note}", err=True)


def _compute_with_progress(config: Any, device: str, quiet: bool) -> Any:
    from tqdm import tqdm

    from compute.engine import Progress
    from compute.run import compute_run

    bar = (
        None
        if quiet
        else tqdm(total=0, unit="step", desc="sweep", dynamic_ncols=True, file=sys.stderr)
    )

    def report(p: Progress) -> None:
        if bar is None:
            return
        if bar.total != p.total:  # one total for the run (training + sweep: RunProgress)
            bar.total = p.total
        bar.set_postfix_str(format_rate(p.tokens_per_s), refresh=False)
        bar.update(p.done - bar.n)

    from compute.lens.store import LensStore

    lenses = LensStore(get_settings().data_dir / "lenses")
    try:
        return compute_run(config, device=device, progress=report, lenses=lenses)
    finally:
        if bar is not None:
            bar.close()


def _write_outputs(result: Any, out: Path) -> None:
    from compute.run import result_metadata
    from service.exports import write_atomic

    fmt = require_format(out)  # checked before computing; cannot fail here
    meta = result_metadata(result)
    # Encode everything first, then write: an encoding error leaves no file behind.
    payloads = [(out, fmt.encode(result.records, meta))]
    if result.neuron_tokens.num_rows:
        side = out.with_name(f"{out.stem}.neuron_tokens{out.suffix}")
        payloads.append((side, fmt.encode(result.neuron_tokens, None)))
    if result.sequence_means.num_rows:  # the per-sequence means (docs/metrics.md: uncertainty)
        side = out.with_name(f"{out.stem}.sequence_means{out.suffix}")
        payloads.append((side, fmt.encode(result.sequence_means, None)))
    for path, data in payloads:
        write_atomic(path, data)
