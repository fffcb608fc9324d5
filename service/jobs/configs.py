"""A submission -> the run configuration it means, checked before anything is queued.

The configuration (and so its hash) is fixed here, in the API process: the worker computes
exactly this configuration and the results must carry the same hash. Token sources are resolved
here too (their content fingerprint is part of the identity).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from compute.errors import SpecError
from compute.lens.config import LensTraining
from compute.lens.store import LensStore, check_fits_spec
from compute.metrics import families_named
from compute.metrics.base import EngineOptions
from compute.models import ModelSpec
from compute.models.tokenizers import tokenizer_of
from compute.refits import prompt_spec
from compute.run import RunConfig
from compute.stability import StabilityOptions
from compute.tokens import (
    TokenSpec,
    check_text_yields,
    check_training_source,
    resolve_token_spec,
)
from service.settings import Settings

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class LensRequest:
    """A job's tuned-lens settings (`compute.lens.config.LensTraining`'s fields; None: its
    default). `lens` names a stored lens to evaluate instead of training one."""

    lens: str | None = None
    steps: int | None = None
    sequences_per_step: int | None = None
    train_sequences: int | None = None
    lr: float | None = None
    momentum: float | None = None
    weight_decay: float | None = None
    warmup_steps: int | None = None
    clip_grad_norm: float | None = None
    seed: int | None = None


@dataclass(frozen=True)
class JobRequest:
    """What a client asks to compute. None: the deployment's default (`STRATA_JOBS__*`)."""

    model: str
    metrics: tuple[str, ...] | None = None
    tokens: str | None = None
    n_sequences: int | None = None
    seq_len: int | None = None
    device: str | None = None
    dtype: str | None = None
    force: bool = False
    queue: str = "gpu"
    tuned_lens: LensRequest | None = None


@lru_cache(maxsize=64)
def _resolved(spec: TokenSpec) -> TokenSpec:
    # The built-in corpus's fingerprint reads ~2 MB of text: once per process is enough.
    return resolve_token_spec(spec)


def stability_prompts(options: StabilityOptions) -> TokenSpec:
    """A refit family's prompt set (`compute.refits.prompt_spec`), resolved here: its content
    fingerprint is part of a stability job's identity."""
    return _resolved(prompt_spec(options))


def token_spec(
    ref: str,
    n_sequences: int,
    seq_len: int,
    settings: Settings,
    stored: dict[str, Any] | None = None,
) -> TokenSpec:
    """The token spec a job's `tokens` names:

    - `builtin`: the built-in offline corpus;
    - `corpus:<path>`: a text file or folder under one of `STRATA_JOBS__CORPUS_ROOTS`;
    - `source:<id>`: a token source already stored with a run (used exactly as stored);
    - `pile`: the Pile through `datasets` (the worker needs network).
    """
    kind, _, rest = ref.partition(":")
    if kind == "source":
        if stored is None:
            raise SpecError(
                f"tokens {ref!r}: no stored token source has id {rest!r}; list them "
                "with GET /api/v1/runs (token_source_id)"
            )
        return _resolved(TokenSpec.model_validate(stored))
    if kind == "builtin" and not rest:
        return _resolved(TokenSpec(source="builtin", n_sequences=n_sequences, seq_len=seq_len))
    if kind == "pile" and not rest:
        return TokenSpec(source="pile", n_sequences=n_sequences, seq_len=seq_len)
    if kind == "corpus" and rest:
        path = Path(rest)
        if not any(
            path.resolve().is_relative_to(root.resolve()) for root in settings.jobs.corpus_roots
        ):
            raise SpecError(
                f"tokens {ref!r}: corpus paths must lie under a configured root "
                "(STRATA_JOBS__CORPUS_ROOTS); this one does not"
            )
        if not path.exists():
            raise SpecError(f"tokens {ref!r}: {path} does not exist")
        return _resolved(
            TokenSpec(
                source="corpus", path=str(path.resolve()), n_sequences=n_sequences, seq_len=seq_len
            )
        )
    raise SpecError(
        f"tokens {ref!r} is not a token source: give builtin, corpus:<path>, "
        "source:<stored token source id> or pile"
    )


def run_config(
    request: JobRequest,
    model_spec: dict[str, Any],
    n_ctx: int | None,
    settings: Settings,
    stored_tokens: dict[str, Any] | None = None,
) -> RunConfig:
    """The run configuration of a request for a registered model (its stored spec and context
    length). Raises `SpecError` naming the problem: unknown family or dtype, a seq_len beyond
    the model's context, bad counts, a token source that is not allowed."""
    defaults = settings.jobs
    families = list(request.metrics) if request.metrics is not None else list(defaults.families)
    families_named(families)
    dtype = request.dtype or defaults.dtype
    if dtype not in DTYPES:
        raise SpecError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    n_sequences = request.n_sequences if request.n_sequences is not None else defaults.n_sequences
    if request.seq_len is not None:
        seq_len = request.seq_len
        if n_ctx is not None and seq_len > n_ctx:
            raise SpecError(
                f"seq_len {seq_len} is beyond the model's context of {n_ctx} "
                "tokens; give seq_len <= n_ctx"
            )
    else:
        seq_len = min(defaults.seq_len, n_ctx) if n_ctx is not None else defaults.seq_len
    if n_sequences < 1:
        raise SpecError(f"n_sequences must be at least 1, got {n_sequences}")
    if seq_len < 3:
        raise SpecError(
            f"seq_len must be at least 3 (BOS, one evaluated position, its target), got {seq_len}"
        )
    tokens = token_spec(
        request.tokens or defaults.tokens, n_sequences, seq_len, settings, stored_tokens
    )
    spec = ModelSpec.model_validate({**model_spec, "dtype": dtype})
    options = EngineOptions(tuned_lens=lens_training(request.tuned_lens, families, tokens))
    return RunConfig(
        model=spec, tokens=tokens, families=tuple(dict.fromkeys(families)), options=options
    )


def default_config(model_spec: dict[str, Any], n_ctx: int | None, settings: Settings) -> RunConfig:
    """The configuration of a model's default run: the request that names nothing but the
    model, with the deployment's defaults (`STRATA_JOBS__*`). Reconciliation queues it
    (`JobService.reconcile`), and its run is the model's canonical run for each family it
    computes unless an operator pins another (`service.api.queries.index`). `SpecError` where
    the defaults do not fit the model."""
    return run_config(JobRequest(model=""), model_spec, n_ctx, settings)


def check_sequences(config: RunConfig) -> None:
    """A text source asked for more sequences than its text yields with the model's tokenizer
    is refused here (`SpecError` naming how many it yields), not in the worker: counted with
    the tokenizer alone, the weights never loaded (`compute.tokens.check_text_yields`; cheap
    when the request plainly fits). A model whose tokenizer is not at hand offline is left to
    the worker."""
    if config.tokens.source in ("builtin", "corpus"):
        check_text_yields(config.tokens, tokenizer_of(config.model))


def lens_training(
    request: LensRequest | None, families: list[str], tokens: TokenSpec
) -> LensTraining:
    """The tuned-lens training configuration a job asks for. Refused (`SpecError`): settings
    without the tuned_lens family, a value out of range (named as `tuned_lens.<field>`), and a
    lens to train on a token source that has no training split (a `.npy`, the Pile) — which
    would otherwise fail only in the worker."""
    if request is not None and "tuned_lens" not in families:
        raise SpecError(
            "tuned_lens settings were given but the job does not compute the tuned_lens "
            "family: add tuned_lens to metrics, or leave tuned_lens out"
        )
    given = {k: v for k, v in asdict(request).items() if v is not None} if request else {}
    try:
        training = LensTraining(**given)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise SpecError(f"tuned_lens.{error['loc'][0]}: {error['msg']}") from None
    if "tuned_lens" in families and training.lens is None:
        check_training_source(tokens)
    return training


def check_lens(
    config: RunConfig,
    settings: Settings,
    *,
    n_layers: int | None,
    d_model: int | None,
    centred: bool | None,
) -> None:
    """A job that names a stored lens (`tuned_lens.lens`): the lens exists in this deployment's
    lens folder (`<data_dir>/lenses`) and fits the registered model (its name, layers, width
    and residual basis, as `compute.lens.store.check_fits` checks at run time). `SpecError`
    (a `LensError`) naming what to fix otherwise."""
    key = config.options.tuned_lens.lens
    if "tuned_lens" not in config.families or key is None:
        return
    info = LensStore(settings.data_dir / "lenses").info(key)
    check_fits_spec(info, config.model, n_layers=n_layers, d_model=d_model, centred=centred)
