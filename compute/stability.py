"""heads.stability and heads.residual_cka across independently trained refits (docs/metrics.md).

Attention patterns and residual streams are computed once per model on one fixed prompt set;
every pairwise comparison is then batched matrix work:
  - each head's pattern on each prompt is flattened to the causal lower triangle and unit-normed;
  - for anchor layer l, the [H_anchor, H_other] cosine matrix averaged over prompts is one einsum;
  - each anchor head is matched to one head of the same layer of the other refit, one-to-one:
    the assignment (Hungarian, `scipy.optimize.linear_sum_assignment`) that maximises the sum of
    matched cosines; stability of an anchor head = its matched cosine, averaged over refits.
    The greedy many-to-one match (each anchor head's best head, which two anchor heads may
    share) is kept beside it as `heads.stability_greedy`. The null baseline repeats both against
    randomly initialised models of the anchor's architecture (its normalization included).
Refits must share the anchor's architecture (layers, heads, d_model), its vocabulary (W_U width)
and its tokenizer (the token -> id map and BOS id): the prompts are the anchor's token ids, which
mean other tokens to a model with another tokenizer. Otherwise `RefitMismatchError`.
CKA compares the residual stream after each block (anchor vs each refit) on the same tokens:
linear CKA, and RBF CKA with the median-heuristic bandwidth.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from jaxtyping import Float
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from compute.errors import SpecError
from compute.models import LoadedModel, ModelSpec
from compute.records import Record

Matching = Literal["one_to_one", "greedy"]


class RefitMismatchError(SpecError):
    """A refit cannot be compared with the anchor: another architecture, vocabulary or
    tokenizer. (A `SpecError`: the CLI exits 2 with the message.)"""


class StabilityOptions(BaseModel):
    """The fixed prompt set and comparison settings (part of a stability run's configuration)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    n_prompts: int = Field(32, ge=1)
    prompt_len: int = Field(64, ge=3)
    seed: int = 0
    n_null: int = Field(3, ge=0, description="randomly initialised models for the null baseline")
    cka_tokens: int = Field(1024, ge=16, description="tokens (rows) used for CKA")


@dataclass
class ModelActivations:
    """What one model yields on the prompt set: flattened patterns and residuals."""

    patterns: Float[Tensor, "layer head prompt tri"]  # unit-normed lower triangles
    resid: Float[Tensor, "layer tokens d_model"]  # after each block, evaluated positions


def lower_triangle_index(t: int) -> tuple[Tensor, Tensor]:
    return torch.tril_indices(t, t)  # type: ignore[return-value]


def model_activations(lm: LoadedModel, prompts: Tensor, cka_tokens: int) -> ModelActivations:
    """Run the model once on the prompts, keeping patterns and residual streams."""
    rows, cols = lower_triangle_index(prompts.shape[1])
    patterns, resid = [], []
    with torch.inference_mode():
        x = lm.embed(prompts.to(lm.device))
        for layer in range(lm.n_layers):
            run = lm.run_block(layer, x, capture_pattern=True)
            x = run.resid
            assert run.pattern is not None
            tri = run.pattern[:, :, rows, cols].float().permute(1, 0, 2)  # [head, prompt, tri]
            patterns.append(tri / tri.norm(dim=-1, keepdim=True).clamp_min(1e-12))
            resid.append(x[:, 1:-1].reshape(-1, lm.d_model)[:cka_tokens].float())
    return ModelActivations(torch.stack(patterns).cpu(), torch.stack(resid).cpu())


def head_match(
    anchor: ModelActivations, other: ModelActivations, *, matching: Matching = "one_to_one"
) -> Float[Tensor, "layer head"]:
    """For each anchor head, the prompt-averaged cosine of its pattern with its match among the
    other model's heads of the same layer.

    `one_to_one`: the matches are the assignment of distinct heads that maximises the layer's sum
    of cosines (Hungarian algorithm). `greedy`: each anchor head's own best head (many-to-one).
    """
    from scipy.optimize import linear_sum_assignment

    a, b = anchor.patterns, other.patterns
    cos = torch.einsum("lhpk,lgpk->lhg", a, b) / a.shape[2]
    if matching == "greedy":
        return cos.max(dim=-1).values
    out = torch.zeros(cos.shape[:2], dtype=cos.dtype)
    for layer in range(cos.shape[0]):
        rows, cols = linear_sum_assignment(cos[layer].double().numpy(), maximize=True)
        out[layer, torch.from_numpy(rows)] = cos[
            layer, torch.from_numpy(rows), torch.from_numpy(cols)
        ]
    return out


def _center_gram(k: Tensor) -> Tensor:
    """H K H, H = I - 11'/n (K doubly centred), as K less its column means, its row means,
    plus its grand mean: O(n^2) where the two products are O(n^3)."""
    return k - k.mean(0, keepdim=True) - k.mean(1, keepdim=True) + k.mean()


def _cka_from_grams(k: Tensor, other: Tensor) -> float:
    return _cka_centered(_center_gram(k), _center_gram(other))


def _cka_centered(kc: Tensor, lc: Tensor) -> float:
    """CKA of two doubly centred Gram matrices."""
    hsic = (kc * lc).sum()
    denom = torch.sqrt((kc * kc).sum() * (lc * lc).sum())
    return float(hsic / denom) if denom > 0 else 0.0


def linear_cka(x: Float[Tensor, "n d1"], y: Float[Tensor, "n d2"]) -> float:
    """Linear CKA: ||Y'X||_F^2 / (||X'X||_F ||Y'Y||_F) on column-centered features."""
    x = (x - x.mean(0)).double()
    y = (y - y.mean(0)).double()
    num = (y.T @ x).pow(2).sum()
    den = torch.sqrt((x.T @ x).pow(2).sum() * (y.T @ y).pow(2).sum())
    return float(num / den) if den > 0 else 0.0


def rbf_gram(x: Float[Tensor, "n d"]) -> Tensor:
    """RBF kernel with bandwidth sigma = median pairwise distance (median heuristic)."""
    x = x.double()
    sq = torch.cdist(x, x).pow(2)
    off = sq[~torch.eye(len(x), dtype=torch.bool)]
    sigma2 = off.sqrt().median().pow(2).clamp_min(1e-24)
    return torch.exp(-sq / (2 * sigma2))


def rbf_cka(x: Float[Tensor, "n d1"], y: Float[Tensor, "n d2"]) -> float:
    return _cka_from_grams(rbf_gram(x), rbf_gram(y))


def random_counterpart(lm: LoadedModel, seed: int) -> ModelSpec:
    """A randomly initialised model with the same architecture as `lm` (the null baseline)."""
    cfg = lm.cfg
    fields = (
        "n_layers",
        "d_model",
        "n_heads",
        "d_head",
        "d_mlp",
        "d_vocab",
        "n_ctx",
        "act_fn",
        "attn_only",
        "positional_embedding_type",
        "rotary_dim",
        "parallel_attn_mlp",
        "n_key_value_heads",
        "gated_mlp",
        "d_vocab_out",
        "rotary_base",
        "rotary_adjacent_pairs",
        "final_rms",
        "use_attn_scale",
        "attn_scores_soft_cap",
        "output_logits_soft_cap",
        "use_local_attn",
        "window_size",
        "attn_types",
    )
    arch: dict[str, Any] = {f: getattr(cfg, f) for f in fields if getattr(cfg, f, None) is not None}
    # Processing folds LN into LNPre (RMS into RMSPre); the random model is built unfolded with
    # the anchor's own normalization, and a norm-free anchor stays norm-free.
    norm = cfg.normalization_type
    arch["normalization_type"] = norm.removesuffix("Pre") if norm is not None else None
    return ModelSpec(
        source="random",
        name=f"random-{cfg.model_name}-{seed}",
        architecture=arch,
        seed=seed,
        processing=lm.spec.processing,
    )


def stability_records(
    anchor: LoadedModel,
    refits: Sequence[LoadedModel],
    prompts: Tensor,
    opts: StabilityOptions,
    load: Callable[[ModelSpec], LoadedModel],
    progress: Callable[[int, int], None] | None = None,
) -> list[Record]:
    """heads.stability (per head and per layer), its null baseline, and residual CKA.

    `progress(done, total)` is called after each model's pass over the prompts (the anchor,
    each refit, each null model) and once the comparisons are done: 2 + refits + nulls units.
    It may raise to stop the computation (a cancelled job)."""
    if not refits:
        raise SpecError("a family needs at least one refit besides the anchor")
    for other in refits:
        check_refit(anchor, other)
    total, done = 2 + len(refits) + opts.n_null, 0

    def step() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    def activations(lm: LoadedModel) -> ModelActivations:
        acts = model_activations(lm, prompts, opts.cka_tokens)
        step()
        return acts

    base = activations(anchor)
    others = [activations(m) for m in refits]
    nulls = [activations(load(random_counterpart(anchor, 10_000 + i))) for i in range(opts.n_null)]
    records: list[Record] = []
    matchings: tuple[tuple[str, Matching], ...] = (("", "one_to_one"), ("_greedy", "greedy"))
    for suffix, matching in matchings:
        records += _head_records(
            f"stability{suffix}",
            torch.stack([head_match(base, o, matching=matching) for o in others]),
        )
        if nulls:
            records += _head_records(
                f"stability_null{suffix}",
                torch.stack([head_match(base, o, matching=matching) for o in nulls]),
            )
    if anchor.n_heads > 1:  # one head per layer has no peers
        records += _peer_records(peer_similarity(base))
    for layer in range(anchor.n_layers):
        x = base.resid[layer]
        base_gram = _center_gram(rbf_gram(x))  # once per layer, for every refit and null
        for kind in ("linear", "rbf"):
            for name, compared in (("residual_cka", others), ("residual_cka_null", nulls)):
                if not compared:
                    continue
                values = torch.tensor(
                    [
                        linear_cka(x, o.resid[layer])
                        if kind == "linear"
                        else _cka_centered(base_gram, _center_gram(rbf_gram(o.resid[layer])))
                        for o in compared
                    ]
                )
                records.append(
                    Record.of(
                        f"heads.{name}.{kind}",
                        float(values.mean()),
                        len(values),
                        layer=layer,
                        stderr=_stderr(values),
                    )
                )
    step()
    return records


def peer_similarity(acts: ModelActivations) -> Float[Tensor, "layer head"]:
    """For each head, the prompt-averaged cosine of its pattern with each other head of its own
    layer, averaged over those heads: how much a head's pattern is shared within its model.
    1 - this is the head's distinctness. Needs two heads per layer or more."""
    p = acts.patterns
    n_heads = p.shape[1]
    if n_heads < 2:
        raise ValueError("peer similarity needs two heads per layer or more")
    cos = torch.einsum("lhpk,lgpk->lhg", p, p) / p.shape[2]
    off_diagonal = cos.sum(-1) - cos.diagonal(dim1=-2, dim2=-1)
    return off_diagonal / (n_heads - 1)


def _peer_records(peer: Float[Tensor, "layer head"]) -> list[Record]:
    """heads.peer_similarity per head, and per layer the mean over its heads."""
    records = []
    for layer in range(peer.shape[0]):
        for head in range(peer.shape[1]):
            records.append(
                Record.of(
                    "heads.peer_similarity",
                    float(peer[layer, head]),
                    peer.shape[1] - 1,
                    layer=layer,
                    head=head,
                )
            )
        records.append(
            Record.of(
                "heads.peer_similarity", float(peer[layer].mean()), peer.shape[1], layer=layer
            )
        )
    return records


def check_refit(anchor: LoadedModel, other: LoadedModel) -> None:
    """Raise `RefitMismatchError` unless `other` can be compared with `anchor`: the same layers,
    heads and d_model, the same W_U width, and the same tokenizer (token -> id map and BOS id;
    both without one is allowed, then only the width is checked)."""
    name = other.spec.name
    if (other.n_layers, other.n_heads, other.d_model) != (
        anchor.n_layers,
        anchor.n_heads,
        anchor.d_model,
    ):
        raise RefitMismatchError(
            f"{name} does not share the anchor's architecture (layers, heads, d_model: "
            f"{other.n_layers}, {other.n_heads}, {other.d_model} vs {anchor.n_layers}, "
            f"{anchor.n_heads}, {anchor.d_model}); refits must be of one architecture"
        )
    if other.d_vocab != anchor.d_vocab:
        raise RefitMismatchError(
            f"{name} has a vocabulary of {other.d_vocab} tokens but the anchor "
            f"{anchor.spec.name} has {anchor.d_vocab}; refits must share the vocabulary"
        )
    mine, theirs = anchor.tokenizer, other.tokenizer
    if (mine is None) != (theirs is None):
        raise RefitMismatchError(
            f"{name if theirs is None else anchor.spec.name} has no tokenizer, so its "
            "vocabulary cannot be checked against the other's; give every refit its tokenizer "
            "files (refits must share the tokenizer)"
        )
    if mine is not None and (
        mine.get_vocab() != theirs.get_vocab() or anchor.bos_token_id != other.bos_token_id
    ):
        raise RefitMismatchError(
            f"{name} has another tokenizer than the anchor {anchor.spec.name} (its token -> id "
            "map or BOS id differs): the anchor's prompts would mean other tokens to it; "
            "refits must share the tokenizer"
        )


def _stderr(values: Tensor) -> float | None:
    return float(values.std() / len(values) ** 0.5) if len(values) > 1 else None


def _head_records(name: str, per_refit: Float[Tensor, "refit layer head"]) -> list[Record]:
    """Per head: mean over refits. Per layer (head null): mean over heads, and its std."""
    records = []
    per_head = per_refit.mean(0)
    n_refits = per_refit.shape[0]
    for layer in range(per_head.shape[0]):
        for head in range(per_head.shape[1]):
            records.append(
                Record.of(
                    f"heads.{name}",
                    float(per_head[layer, head]),
                    n_refits,
                    layer=layer,
                    head=head,
                    stderr=_stderr(per_refit[:, layer, head]),
                )
            )
        row = per_head[layer]
        records.append(Record.of(f"heads.{name}", float(row.mean()), len(row), layer=layer))
        records.append(
            Record.of(f"heads.{name}_std", float(row.std(unbiased=False)), len(row), layer=layer)
        )
    return records
