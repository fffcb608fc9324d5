"""Train the tiny zoo models: GPT-2-style transformers on the built-in corpus, on a CPU.

A zoo checkpoint directory is self-contained and loads offline with `AutoModelForCausalLM`,
`AutoTokenizer` and TransformerLens (see `compute.models`):

    config.json  model.safetensors  tokenizer.json  tokenizer_config.json  strata_zoo.json

`strata_zoo.json` holds the training configuration, the final train and validation losses
(nats/token), the wall time, the corpus fingerprint and the training-loss curve. Validation is
the last 5% of the token stream, i.e. the docstrings of the last modules in sorted order: text
the model never saw, from a slightly different distribution than most of the training text, so
the validation loss sits above the training loss.

Training is deterministic given the seed: the seed drives the initialisation (inside a forked
global RNG, so the caller's RNG state is left untouched) and a private generator that samples the
training windows. Every training sequence is BOS followed by seq_len-1 tokens from a random
offset of the token stream, matching how Strata evaluates (BOS at position 0, mid-text windows).

Command line: `strata zoo train` (one model per seed, through `train_family`).
"""

from __future__ import annotations

import json
import math
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
import transformers
from pydantic import BaseModel, ConfigDict, Field, model_validator

from compute.corpus import (
    BUILTIN_CORPUS_NAME,
    builtin_corpus_documents,
    documents_fingerprint,
)
from compute.errors import SpecError
from compute.zoo.tokenizer import (
    DEFAULT_VOCAB_SIZE,
    SPECIAL_TOKEN_ID,
    load_zoo_tokenizer,
    save_zoo_tokenizer,
    train_bpe_tokenizer,
)

if TYPE_CHECKING:  # the model classes are imported where a model is built (importing
    # transformers' GPT-2 modules costs seconds, and most users of this module build none)
    from transformers import (
        GPT2Config,
        GPTNeoXConfig,
        PreTrainedModel,
        PreTrainedTokenizerFast,
    )

ZOO_METADATA_FILE = "strata_zoo.json"
VALIDATION_FRACTION = 0.05
LOSS_CURVE_EVERY = 10

# (step, total steps, latest train loss) -> None
ProgressFn = Callable[[int, int, float], None]


class ZooModelConfig(BaseModel):
    """Architecture and optimisation of one zoo model."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    n_layers: int = Field(ge=1, le=48)
    d_model: int = Field(default=128, ge=8)
    n_heads: int = Field(default=4, ge=1)
    d_mlp: int | None = None  # None: 4 * d_model
    n_ctx: int = Field(default=128, ge=4)
    vocab_size: int = Field(default=DEFAULT_VOCAB_SIZE, ge=260)
    seed: int = 0
    optimizer: Literal["adamw", "adam"] = "adamw"
    lr: float = Field(default=1e-3, gt=0)
    warmup_steps: int | None = None  # None: 5% of steps (at least 1)
    min_lr_fraction: float = Field(default=0.1, ge=0, le=1)
    weight_decay: float | None = None  # None: 0.1 for adamw, 0 for adam
    steps: int = Field(default=500, ge=1)
    batch_size: int = Field(default=32, ge=1)
    seq_len: int | None = None  # None: n_ctx (BOS included)
    save_dtype: Literal["float16", "float32"] = "float16"
    # Fraction of each batch replaced by synthetic repeated sequences (see `repeated_rows`):
    # the signal that lets induction heads form in a few CPU minutes. 0 = corpus text only.
    repeat_fraction: float = Field(default=0.0, ge=0.0, lt=1.0)
    # learned: GPT-2 (learned absolute positions). rotary: GPT-NeoX with rotary positions on
    # every head dimension and a sequential (not parallel) residual: previous-token heads need
    # no learned position table, so induction circuits form in fewer steps.
    positional: Literal["learned", "rotary"] = "learned"
    # The validation loss every this many steps (and at the last), kept as `val_curve` in
    # strata_zoo.json: how a caller tells a plateau (`plateau_change`). None: only at the end.
    eval_every: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _check_shapes(self) -> ZooModelConfig:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.seq_len is not None and not 2 <= self.seq_len <= self.n_ctx:
            raise ValueError(f"seq_len={self.seq_len} must be in [2, n_ctx={self.n_ctx}]")
        return self

    @property
    def resolved_d_mlp(self) -> int:
        return self.d_mlp if self.d_mlp is not None else 4 * self.d_model

    @property
    def resolved_weight_decay(self) -> float:
        if self.weight_decay is not None:
            return self.weight_decay
        return 0.1 if self.optimizer == "adamw" else 0.0

    @property
    def resolved_seq_len(self) -> int:
        return self.seq_len if self.seq_len is not None else self.n_ctx

    @property
    def resolved_warmup_steps(self) -> int:
        if self.warmup_steps is not None:
            return self.warmup_steps
        return max(1, self.steps // 20)


def gpt2_config(cfg: ZooModelConfig) -> GPT2Config:
    """The Hugging Face configuration of a zoo model (no dropout, tied embeddings)."""
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.n_ctx,
        # Transformers 5 no longer defines n_ctx, but TransformerLens's GPT-2 converter reads it.
        n_ctx=cfg.n_ctx,  # type: ignore[call-arg]
        n_embd=cfg.d_model,
        n_layer=cfg.n_layers,
        n_head=cfg.n_heads,
        n_inner=cfg.resolved_d_mlp,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=SPECIAL_TOKEN_ID,
        eos_token_id=SPECIAL_TOKEN_ID,
        pad_token_id=SPECIAL_TOKEN_ID,
        tie_word_embeddings=True,
    )


def token_stream(tokenizer: PreTrainedTokenizerFast, documents: Sequence[str]) -> np.ndarray:
    """All documents tokenized and joined with `<|endoftext|>` between them (int64)."""
    encoded = tokenizer(list(documents), add_special_tokens=False)["input_ids"]
    pieces: list[list[int]] = []
    for i, ids in enumerate(encoded):
        if i:
            pieces.append([SPECIAL_TOKEN_ID])
        pieces.append(ids)
    return np.fromiter((t for p in pieces for t in p), dtype=np.int64)


def neox_config(cfg: ZooModelConfig) -> GPTNeoXConfig:
    """The Hugging Face configuration of a rotary zoo model (GPT-NeoX, sequential residual)."""
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        intermediate_size=cfg.resolved_d_mlp,
        max_position_embeddings=cfg.n_ctx,
        use_parallel_residual=False,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 1.0,
        },
        hidden_act="gelu_new",
        attention_dropout=0.0,
        hidden_dropout=0.0,
        bos_token_id=SPECIAL_TOKEN_ID,
        eos_token_id=SPECIAL_TOKEN_ID,
        pad_token_id=SPECIAL_TOKEN_ID,
        tie_word_embeddings=True,
    )


def new_model(cfg: ZooModelConfig) -> PreTrainedModel:
    """A freshly initialised zoo model of the configured architecture."""
    from transformers import GPT2LMHeadModel, GPTNeoXForCausalLM

    if cfg.positional == "rotary":
        return GPTNeoXForCausalLM(neox_config(cfg))
    return GPT2LMHeadModel(gpt2_config(cfg))


def _lr_factor(step: int, cfg: ZooModelConfig) -> float:
    """Linear warmup to 1, then cosine decay to `min_lr_fraction`."""
    warmup = cfg.resolved_warmup_steps
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, cfg.steps - warmup)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return cfg.min_lr_fraction + (1.0 - cfg.min_lr_fraction) * cosine


def _make_optimizer(model: PreTrainedModel, cfg: ZooModelConfig) -> torch.optim.Optimizer:
    """Weight decay on matrices only (not on biases, LayerNorm gains or position embeddings)."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, param in model.named_parameters():
        (decay if param.ndim >= 2 and "wpe" not in name else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": cfg.resolved_weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # On a GPU one fused kernel per step rather than a launch per tensor (the same update)
    fused = {"fused": True} if next(model.parameters()).is_cuda else {}
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), **fused)
    # Plain Adam: any weight decay is L2 added to the gradient (usually 0).
    return torch.optim.Adam(groups, lr=cfg.lr, betas=(0.9, 0.95), **fused)


def _windows_with_bos(stream: torch.Tensor, starts: torch.Tensor, length: int) -> torch.Tensor:
    """BOS followed by `length - 1` stream tokens from each start: [len(starts), length]."""
    offsets = torch.arange(length - 1)
    body = stream[starts[:, None] + offsets[None, :]]
    bos = torch.full((len(starts), 1), SPECIAL_TOKEN_ID, dtype=torch.long)
    return torch.cat([bos, body], dim=1)


def repeated_rows(
    n_rows: int, seq_len: int, vocab_size: int, generator: torch.Generator
) -> torch.Tensor:
    """Synthetic rows BOS, r_1..r_m, r_1..r_m, ... (a random segment tiled to seq_len - 1).

    Per row the period m is uniform in [4, (seq_len - 1) // 2] and r is uniform over the
    vocabulary without BOS: everything after the first period is predictable only by copying
    (the induction probe of `heads.induction` is the m = n case of these rows).
    """
    body = seq_len - 1
    periods = torch.randint(4, max(5, body // 2 + 1), (n_rows,), generator=generator)
    segments = torch.randint(1, vocab_size, (n_rows, body), generator=generator)
    position = torch.arange(body)[None, :] % periods[:, None]
    rows = torch.gather(segments, 1, position)
    bos = torch.full((n_rows, 1), SPECIAL_TOKEN_ID, dtype=torch.long)
    return torch.cat([bos, rows], dim=1)


def validation_loss(
    model: PreTrainedModel, stream: torch.Tensor, seq_len: int, batch_size: int = 64
) -> float:
    """Mean next-token loss (nats/token) over non-overlapping BOS-prefixed windows of `stream`.

    The prediction made at BOS is included (it predicts the window's first text token), so each
    token of every window's body is predicted exactly once.
    """
    body = seq_len - 1
    n_windows = (len(stream) - 1) // body
    if n_windows < 1:
        raise SpecError(f"validation stream of {len(stream)} tokens is shorter than seq_len")
    starts = torch.arange(n_windows) * body
    total, count = 0.0, 0
    with torch.inference_mode():
        for i in range(0, n_windows, batch_size):
            batch = _windows_with_bos(stream, starts[i : i + batch_size], seq_len)
            batch = batch.to(model.device)
            logits = model(batch).logits[:, :-1].float()
            targets = batch[:, 1:]
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum"
            )
            total += float(loss)
            count += targets.numel()
    return total / count


def _round_trip_dtype(model: PreTrainedModel, dtype: str) -> None:
    """Round the weights to the save dtype in place, so reported losses are those shipped."""
    if dtype == "float32":
        return
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param.to(getattr(torch, dtype)).to(param.dtype))


def train_zoo_model(
    cfg: ZooModelConfig,
    out_dir: str | Path,
    *,
    tokenizer_dir: str | Path | None = None,
    progress: ProgressFn | None = None,
    documents: Sequence[str] | None = None,
    corpus: str | None = None,
    device: str = "cpu",
) -> Path:
    """Train one zoo model and write a self-contained checkpoint directory; return its path.

    `tokenizer_dir` reuses a saved zoo tokenizer (every zoo model should share one); without it
    a tokenizer is trained on the corpus. `documents` replaces the built-in corpus (tests, or
    the built-in corpus as another interpreter extracted it); `corpus` names them in the
    metadata ("custom" by default). The last 5% of the token stream is held out for the
    validation loss. `device` trains there (a CUDA device, say);
    batches are always sampled on the CPU, so a seed gives the same batches on every device.
    """
    out = Path(out_dir)
    docs = list(builtin_corpus_documents() if documents is None else documents)
    if tokenizer_dir is not None:
        tokenizer = load_zoo_tokenizer(tokenizer_dir)
    else:
        tokenizer = train_bpe_tokenizer(docs, vocab_size=cfg.vocab_size)
    tokenizer.model_max_length = cfg.n_ctx
    if len(tokenizer) > cfg.vocab_size:
        raise SpecError(
            f"tokenizer has {len(tokenizer)} tokens but vocab_size={cfg.vocab_size}; raise it"
        )
    seq_len = cfg.resolved_seq_len
    stream = torch.from_numpy(token_stream(tokenizer, docs))
    n_val = max(seq_len, int(len(stream) * VALIDATION_FRACTION))
    train_stream, val_stream = stream[:-n_val], stream[-n_val:]
    if len(train_stream) < 2 * seq_len:
        raise SpecError(f"corpus too small: {len(train_stream)} training tokens")

    started = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = new_model(cfg)
    torch.nn.Module.to(model, device)  # (transformers' typing of .to admits a dtype only)
    model.train()
    optimizer = _make_optimizer(model, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, cfg))
    sampler = torch.Generator().manual_seed(cfg.seed)
    max_start = len(train_stream) - (seq_len - 1)
    curve: list[tuple[int, float]] = []
    val_curve: list[tuple[int, float]] = []
    recent: list[float] = []
    for step in range(cfg.steps):
        starts = torch.randint(0, max_start, (cfg.batch_size,), generator=sampler)
        batch = _windows_with_bos(train_stream, starts, seq_len)
        n_repeated = round(cfg.repeat_fraction * cfg.batch_size)
        if n_repeated:
            batch[-n_repeated:] = repeated_rows(n_repeated, seq_len, len(tokenizer), sampler)
        batch = batch.to(device)
        # Labels = inputs: HF shifts them, so position p predicts token p+1 (BOS predicts text).
        loss = model(batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        value = float(loss.detach())
        if not math.isfinite(value):
            raise SpecError(f"training diverged at step {step} (loss {value}); lower lr")
        recent = ([*recent, value])[-LOSS_CURVE_EVERY:]
        if step % LOSS_CURVE_EVERY == 0 or step == cfg.steps - 1:
            curve.append((step, round(value, 4)))
        if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step == cfg.steps - 1):
            model.eval()
            val_curve.append((step + 1, round(validation_loss(model, val_stream, seq_len), 4)))
            model.train()
        if progress is not None:
            progress(step + 1, cfg.steps, value)
    wall_time = time.perf_counter() - started

    model.eval()
    _round_trip_dtype(model, cfg.save_dtype)
    val_loss = validation_loss(model, val_stream, seq_len)

    out.mkdir(parents=True, exist_ok=True)
    save_model = model.cpu().to(getattr(torch, cfg.save_dtype))
    save_model.save_pretrained(out, safe_serialization=True)
    save_zoo_tokenizer(tokenizer, out)
    metadata: dict[str, Any] = {
        "format": 1,
        "config": cfg.model_dump(),
        "final_train_loss": round(sum(recent) / len(recent), 4),
        "val_loss": round(val_loss, 4),
        "loss_unit": "nats/token",
        "steps": cfg.steps,
        "train_tokens_seen": cfg.steps * cfg.batch_size * seq_len,
        "wall_time_s": round(wall_time, 1),
        "corpus": BUILTIN_CORPUS_NAME if documents is None else (corpus or "custom"),
        "corpus_fingerprint": documents_fingerprint(docs),
        "corpus_tokens": len(stream),
        "validation_tokens": len(val_stream),
        "loss_curve": [list(point) for point in curve],
        **({"val_curve": [list(point) for point in val_curve]} if val_curve else {}),
        "device": str(device),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
    }
    (out / ZOO_METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
    return out


def plateau_change(val_curve: Sequence[Sequence[float]], fraction: float = 0.2) -> float:
    """Relative change of the validation loss over the last `fraction` of training:
    (loss at the end - loss at the first evaluation at or after (1 - fraction) of the steps)
    / that earlier loss. A plateau is |change| < 0.01 (issue 38's criterion: less than 1% over
    the last 20% of steps); negative means it was still falling."""
    if len(val_curve) < 2:
        raise ValueError("a plateau needs a validation curve of two points or more")
    last_step, last = val_curve[-1]
    start = next(loss for step, loss in val_curve if step >= (1 - fraction) * last_step)
    return float((last - start) / start)


def train_family(
    base_cfg: ZooModelConfig,
    seeds: Sequence[int],
    out_root: str | Path,
    *,
    tokenizer_dir: str | Path | None = None,
    progress: ProgressFn | None = None,
) -> list[Path]:
    """Train refits of one architecture that differ only in seed: `<base name>-s<seed>`.

    The first refit's tokenizer is reused by the others unless `tokenizer_dir` is given.
    """
    root = Path(out_root)
    paths: list[Path] = []
    for seed in seeds:
        cfg = base_cfg.model_copy(update={"name": f"{base_cfg.name}-s{seed}", "seed": seed})
        path = train_zoo_model(cfg, root / cfg.name, tokenizer_dir=tokenizer_dir, progress=progress)
        tokenizer_dir = tokenizer_dir or path
        paths.append(path)
    return paths
