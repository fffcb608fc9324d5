"""`strata`: the command line. Thin: parse, build a spec, call compute or the store, report.

Exit codes: see `service/cli_errors.py` (2 bad input, 3 model not loadable, 4 computation
failed, 5 database held).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from compute.errors import SpecError, StrataError
from service.cli_db import check_store_writable, db, store_result
from service.cli_errors import EXIT_BAD_INPUT, exit_code_of, fail
from service.cli_jobs import jobs, models
from service.cli_settings import settings
from service.cli_worker import beat, worker
from service.exports import ExportFormat, require_format
from service.settings import get_settings


def _out_format(out: Path) -> ExportFormat:
    """The export format of an --out path, or exit 2 naming the choices."""
    try:
        return require_format(out)
    except SpecError as exc:
        fail(f"--out {exc}", EXIT_BAD_INPUT)


@click.group()
def main() -> None:
    """Strata: layer-level interpretability results for transformer language models."""


@main.command()
@click.option("--model", "model_ref", required=True,
              help="zoo name, local Hugging Face checkpoint dir, or TransformerLens name")
@click.option("--tokens", "tokens_path", type=click.Path(dir_okay=False),
              help="pre-tokenized .npy [n_sequences, seq_len], used exactly as given")
@click.option("--corpus", "corpus_path", type=click.Path(),
              help="text file or folder (default: built-in offline corpus)")
@click.option("--pile", is_flag=True, help="tokens from the Pile via `datasets` (needs network)")
@click.option("--n-sequences", type=int, default=32, show_default=True)
@click.option("--seq-len", type=int, default=128, show_default=True,
              help="tokens per sequence including the BOS at position 0")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--metrics", "metrics", default=",".join(
    ["intervention", "logit_lens", "neurons", "similarity", "attention", "norms", "heads"]),
    show_default=True, help="comma-separated metric families")
@click.option("--device", default="cpu", show_default=True)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]),
              default="float32", show_default=True)
@click.option("--batch-size", type=int, default=None, help="sequences per batch (default: auto)")
@click.option("--tokens-per-batch", type=int, default=None,
              help="automatic batch on a CPU: about this many tokens per batch (default: the "
              "measured best, 1024)")
@click.option("--memory-budget-mb", type=int, default=None,
              help="automatic batch: memory the sweep may use beyond the weights, MiB "
              "(default: on a GPU 85%% of what is free after loading, on a CPU half the "
              "weights' size, at least 64)")
@click.option("--no-processing", is_flag=True,
              help="skip LayerNorm folding and weight centering (results of drop/swap/lens agree)")
@click.option("--out", "out_path", type=click.Path(dir_okay=False),
              help="output file: .parquet, .json, .csv or .arrow")
@click.option("--store", is_flag=True,
              help="also write the run into the results store (STRATA_DATABASE)")
@click.option("--quiet", is_flag=True, help="no progress bar")
def compute(model_ref: str, tokens_path: str | None, corpus_path: str | None, pile: bool,
            n_sequences: int, seq_len: int, seed: int, metrics: str, device: str, dtype: str,
            batch_size: int | None, tokens_per_batch: int | None, memory_budget_mb: int | None,
            no_processing: bool, out_path: str | None, store: bool, quiet: bool) -> None:
    """Compute per-layer metrics of a model and write them in the record format of
    docs/metrics.md."""
    if out_path is None and not store:
        fail("give --out FILE (.parquet, .json, .csv, .arrow) and/or --store", EXIT_BAD_INPUT)
    out = Path(out_path) if out_path else None
    if out is not None:
        _out_format(out)
    if sum(bool(x) for x in (tokens_path, corpus_path, pile)) > 1:
        fail("give at most one of --tokens, --corpus, --pile", EXIT_BAD_INPUT)
    try:
        config = _run_config(model_ref, tokens_path, corpus_path, pile, n_sequences, seq_len,
                             seed, metrics, dtype, no_processing,
                             {"batch_size": batch_size, "tokens_per_batch": tokens_per_batch,
                              "memory_budget_mb": memory_budget_mb})
        if store:  # fail before hours of compute if the results could not be stored
            check_store_writable(get_settings())
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


def _run_config(model_ref: str, tokens_path: str | None, corpus_path: str | None, pile: bool,
                n_sequences: int, seq_len: int, seed: int, metrics: str, dtype: str,
                no_processing: bool, performance: dict[str, int | None]) -> Any:
    from compute.metrics import families_named
    from compute.metrics.base import EngineOptions
    from compute.models import Processing, resolve_model_spec
    from compute.run import RunConfig
    from compute.tokens import TokenSpec

    families = [m.strip() for m in metrics.split(",") if m.strip()]
    families_named(families)
    processing = Processing(fold_ln=False, center_writing_weights=False, center_unembed=False,
                            fold_value_biases=False) if no_processing else Processing()
    if tokens_path is not None:
        token_spec = TokenSpec(source="npy", path=tokens_path, n_sequences=0, seq_len=0, seed=seed)
    elif corpus_path is not None:
        token_spec = TokenSpec(source="corpus", path=corpus_path, n_sequences=n_sequences,
                               seq_len=seq_len, seed=seed)
    else:
        token_spec = TokenSpec(source="pile" if pile else "builtin", n_sequences=n_sequences,
                               seq_len=seq_len, seed=seed)
    if n_sequences < 1 or seq_len < 3:
        raise SpecError("--n-sequences must be >= 1 and --seq-len >= 3")
    from pydantic import ValidationError

    try:
        options = EngineOptions(**performance)
    except ValidationError as exc:
        error = exc.errors()[0]
        flag = "--" + str(error["loc"][0]).replace("_", "-")
        raise SpecError(f"bad {flag}: {error['msg']}") from exc
    return RunConfig(model=resolve_model_spec(model_ref, dtype=dtype, processing=processing),  # type: ignore[arg-type]
                     tokens=token_spec, families=tuple(families), options=options)


def _compute_with_progress(config: Any, device: str, quiet: bool) -> Any:
    from tqdm import tqdm

    from compute.engine import Progress
    from compute.run import compute_run

    bar = None if quiet else tqdm(total=0, unit="step", desc="sweep", dynamic_ncols=True,
                                  file=sys.stderr)

    def report(p: Progress) -> None:
        if bar is None:
            return
        if bar.total != p.total:
            bar.total = p.total
        bar.set_postfix_str(f"{p.tokens_per_s:,.0f} tok/s", refresh=False)
        bar.update(p.done - bar.n)

    try:
        return compute_run(config, device=device, progress=report)
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


@main.command()
@click.option("--family", "members", multiple=True, required=True,
              help="refit models (zoo names, checkpoint dirs, TransformerLens names), or one "
                   "folder holding refit checkpoint folders; repeat the option")
@click.option("--anchor", default=None, help="the refit compared against (default: the first)")
@click.option("--n-prompts", type=int, default=32, show_default=True)
@click.option("--prompt-len", type=int, default=64, show_default=True)
@click.option("--n-null", type=int, default=3, show_default=True,
              help="randomly initialised models for the null baseline")
@click.option("--device", default="cpu", show_default=True)
@click.option("--out", "out_path", type=click.Path(dir_okay=False),
              help="output file: .parquet, .json, .csv or .arrow")
@click.option("--store", is_flag=True,
              help="also store the comparison in the results store (STRATA_DATABASE), as the "
                   "refit family --name")
@click.option("--name", "family_name", default=None,
              help="the refit family's name in the store (default: the members' common name "
                   "prefix, e.g. tiny-4l for tiny-4l-s0, tiny-4l-s1)")
def stability(members: tuple[str, ...], anchor: str | None, n_prompts: int, prompt_len: int,
              n_null: int, device: str, out_path: str | None, store: bool,
              family_name: str | None) -> None:
    """Attention-head stability and residual CKA across refits of one architecture."""
    import time

    from service.exports import write_atomic

    if out_path is None and not store:
        fail("give --out FILE (.parquet, .json, .csv, .arrow) and/or --store", EXIT_BAD_INPUT)
    out = Path(out_path) if out_path else None
    fmt = _out_format(out) if out is not None else None
    try:
        if store:  # fail before computing if the results could not be stored
            check_store_writable(get_settings())
        start = time.perf_counter()
        table, meta, loaded = _stability(list(members), anchor, n_prompts, prompt_len, n_null,
                                         device)
        wall_s = time.perf_counter() - start
    except StrataError as exc:
        fail(str(exc), exit_code_of(exc))
    if out is not None and fmt is not None:
        write_atomic(out, fmt.encode(table, meta))
        click.echo(f"wrote {table.num_rows} records to {out}", err=True)
    if store:
        name = family_name or _family_name([spec.name for spec, _ in loaded["members"]])
        try:
            summary = _store_stability(name, table, loaded, device, wall_s)
        except StrataError as exc:
            fail(str(exc), exit_code_of(exc))
        click.echo(f"stored refit family {name!r} (stability run {summary.run_id}) in "
                   f"{get_settings().database}", err=True)


def _family_name(names: list[str]) -> str:
    """The members' common name prefix without a trailing seed marker (tiny-4l-s0, tiny-4l-s1
    -> tiny-4l); the first member's name when they share none."""
    import re

    short = [Path(n).name for n in names]
    common = short[0]
    for name in short[1:]:
        while not name.startswith(common):
            common = common[:-1]
    prefix = re.sub(r"[-_.]?(s|seed)?[-_.]*$", "", common)
    return prefix or f"{short[0]}-refits"


def _store_stability(name: str, table: Any, loaded: dict[str, Any], device: str,
                     wall_s: float) -> Any:
    import platform

    import torch

    from compute.run import CODE_VERSION
    from service.store import Store
    from service.store.migrate import ensure_current
    from service.store.stability import StabilityResult, ingest_stability

    result = StabilityResult(
        family=name, anchor=loaded["anchor"], members=loaded["members"], records=table,
        options=loaded["options"], prompts=loaded["prompts"], device=device, wall_s=wall_s,
        environment={"torch": torch.__version__, "python": platform.python_version(),
                     "strata": CODE_VERSION})
    with Store.open(get_settings().database) as opened:
        ensure_current(opened)
        return ingest_stability(opened, result)


def _expand_family(members: list[str]) -> list[str]:
    expanded: list[str] = []
    for ref in members:
        path = Path(ref)
        if path.is_dir() and not (path / "config.json").is_file():
            expanded += sorted(str(p) for p in path.iterdir() if (p / "config.json").is_file())
        else:
            expanded.append(ref)
    return expanded


def _stability(members: list[str], anchor: str | None, n_prompts: int, prompt_len: int,
               n_null: int, device: str) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    from compute.models import load_model, resolve_model_spec
    from compute.records import records_to_table, validate_records
    from compute.stability import StabilityOptions, stability_records
    from compute.tokens import TokenSpec, load_tokens, resolve_token_spec

    refs = _expand_family(members)
    if anchor is not None and anchor not in refs:
        # allow the anchor to be named by its short name
        matches = [r for r in refs if Path(r).name == anchor or r.removeprefix("zoo:") == anchor]
        if len(matches) != 1:
            raise SpecError(f"--anchor {anchor!r} is not one of the family: {', '.join(refs)}")
        anchor = matches[0]
    anchor_ref = anchor or refs[0]
    if len(refs) < 2:
        raise SpecError("a family needs at least two models (the anchor and one refit)")
    opts = StabilityOptions(n_prompts=n_prompts, prompt_len=prompt_len, n_null=n_null)
    specs = {ref: resolve_model_spec(ref) for ref in refs}
    anchor_lm = load_model(specs[anchor_ref], device)
    token_spec = resolve_token_spec(TokenSpec(source="builtin", n_sequences=n_prompts,
                                              seq_len=prompt_len, seed=opts.seed))
    prompts = load_tokens(token_spec, anchor_lm.tokenizer, bos_token_id=anchor_lm.bos_token_id,
                          d_vocab=anchor_lm.d_vocab, n_ctx=anchor_lm.n_ctx)
    refits = [load_model(specs[r], device) for r in refs if r != anchor_ref]
    records = stability_records(anchor_lm, refits, prompts, opts,
                                lambda spec: load_model(spec, device))
    table = validate_records(records_to_table(records), n_layers=anchor_lm.n_layers)
    meta = {"family": [specs[r].model_dump(mode="json") for r in refs],
            "anchor": specs[anchor_ref].model_dump(mode="json"),
            "options": opts.model_dump(mode="json"), "prompts": token_spec.model_dump(mode="json")}
    others = iter(refits)
    loaded = {"anchor": specs[anchor_ref], "options": opts.model_dump(mode="json"),
              "prompts": token_spec,
              "members": [(specs[r], (anchor_lm if r == anchor_ref else next(others)).describe())
                          for r in refs]}
    return table, meta, loaded


@main.command()
@click.option("--results", "results_path", required=True, type=click.Path(dir_okay=False),
              help="output of `strata compute` (.parquet, .json, .csv or .arrow)")
@click.option("--out", "out_path", type=click.Path(dir_okay=False),
              help="write boundary records here (default: print boundaries as JSON)")
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
    evidence = [{"boundary": b.index, "ends_stage": b.index, "layer": b.layer,
                 "relative_depth": b.relative_depth, "clear": b.clear, "rule": b.rule,
                 "evidence": b.evidence} for b in boundaries]
    if out_path is None:
        click.echo(json.dumps({"n_layers": n_layers, "boundaries": evidence}, indent=2))
        return
    out = Path(out_path)
    fmt = _out_format(out)
    table = validate_records(records_to_table(stage_records(boundaries, n_layers)))
    write_atomic(out, fmt.encode(table, {"n_layers": n_layers, "boundaries": evidence}))
    for b in evidence:
        where = f"layer {b['layer']}" if b["clear"] else "no clear boundary"
        click.echo(f"boundary {b['boundary']}: {where}", err=True)


@main.group()
def zoo() -> None:
    """The tiny model zoo: list the shipped checkpoints, train new ones."""


@zoo.command("list")
def zoo_list() -> None:
    """Zoo models: trained checkpoints with their validation loss, and planted controls."""
    from compute.models import zoo_names
    from compute.zoo.catalog import zoo_line

    for name in zoo_names():
        click.echo(zoo_line(name))


@zoo.command("show")
@click.argument("name")
def zoo_show(name: str) -> None:
    """One zoo model as JSON: how it was trained, or for a planted control the answer it
    encodes (the values Strata's metrics should find)."""
    from compute.zoo.catalog import zoo_entry

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
@click.option("--optimizer", type=click.Choice(["adamw", "adam"]), default="adamw",
              show_default=True, help="adamw uses weight decay 0.1, adam none")
@click.option("--lr", type=float, default=2e-3, show_default=True)
@click.option("--steps", type=click.IntRange(1), default=500, show_default=True)
@click.option("--batch-size", type=click.IntRange(1), default=32, show_default=True)
@click.option("--repeat-fraction", type=click.FloatRange(0.0, 1.0, max_open=True), default=0.0,
              show_default=True, help="fraction of each batch replaced by synthetic repeated "
              "random sequences (lets induction heads form)")
@click.option("--out-dir", type=click.Path(file_okay=False), default=None,
              help="where checkpoints go (default: the zoo's checkpoints folder)")
def zoo_train(name: str | None, n_layers: int, d_model: int, n_heads: int, n_ctx: int,
              seeds: str, optimizer: str, lr: float, steps: int, batch_size: int,
              repeat_fraction: float, out_dir: str | None) -> None:
    """Train tiny GPT-2-style models on the built-in corpus, one per seed (a refit family)."""
    from pydantic import ValidationError

    from compute.models import ZOO_DIR
    from compute.zoo.train import ZooModelConfig, train_family

    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        fail(f"--seeds {seeds!r}: give comma-separated integers", EXIT_BAD_INPUT)
    try:
        base = ZooModelConfig(name=name or f"tiny-{n_layers}l-{optimizer}", n_layers=n_layers,
                              d_model=d_model, n_heads=n_heads, n_ctx=n_ctx,
                              optimizer=optimizer, lr=lr, steps=steps,
                              batch_size=batch_size, repeat_fraction=repeat_fraction)
    except ValidationError as exc:
        fail(f"bad zoo configuration: {exc.errors()[0]['msg']}", EXIT_BAD_INPUT)
    for path in train_family(base, seed_list, Path(out_dir) if out_dir else ZOO_DIR):
        meta = json.loads((path / "strata_zoo.json").read_text())
        click.echo(f"{path.name}: val_loss={meta.get('val_loss')} nats/token -> {path}")


@main.command()
@click.option("--host", default=None, help="address to listen on (default: STRATA_HOST, "
              "127.0.0.1)")
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help="port (default: STRATA_PORT, 8000)")
@click.option("--local-worker/--no-local-worker", default=None,
              help="also run a worker and beat here, on Celery's filesystem broker (default: "
                   "on when STRATA_BROKER_URL is empty)")
@click.option("--access-log", is_flag=True, help="log every request")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]),
              default="info", show_default=True)
def serve(host: str | None, port: int | None, local_worker: bool | None, access_log: bool,
          log_level: str) -> None:
    """Serve the results over HTTP (the API) and run the job system. This process holds the
    database for as long as it runs: workers and other processes send it work instead of
    opening the file. With no broker configured it also starts a local worker and beat."""
    from service.serve import run_service

    try:
        run_service(get_settings(), host=host, port=port, local_worker=local_worker,
                    access_log=access_log, log_level=log_level)
    except StrataError as exc:
        fail(str(exc), exit_code_of(exc))


main.add_command(db)
main.add_command(jobs)
main.add_command(models)
main.add_command(worker)
main.add_command(beat)
main.add_command(settings)

if __name__ == "__main__":
    main()
