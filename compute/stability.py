"""heads.stability and heads.residual_cka across independently trained refits (docs/metrics.md).

Attention patterns and residual streams are computed once per model on one fixed prompt set;
every pairwise comparison is then batched matrix work:
  - each head's pattern on each prompt is flattened to the causal lower triangle and unit-normed;
  - for anchor layer l, the [H_anchor, H_other] cosine matrix averaged over prompts is one einsum;
  - stability of an anchor head = max over the other refit's heads of the same layer (greedy,
    many-to-one), averaged over refits. The null baseline repeats this against randomly
    initialised models of the same architecture.
CKA compares the residual stream after each block (anchor vs each refit) on the same tokens:
linear CKA, and RBF CKA with the median-heuristic bandwidth.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from compute.errors import SpecError
from compute.models import LoadedModel, ModelSpec
from compute.records import Record


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


def head_match(anchor: ModelActivations, other: ModelActivations) -> Float[Tensor, "layer head"]:
    """For each anchor head: max over the other model's heads of the same layer of the
    prompt-averaged cosine of their patterns."""
    a, b = anchor.patterns, other.patterns
    cos = torch.einsum("lhpk,lgpk->lhg", a, b) / a.shape[2]
    return cos.max(dim=-1).values


def _center_gram(k: Tensor) -> Tensor:
    n = k.shape[0]
    h = torch.eye(n, dtype=k.dtype) - 1.0 / n
    return h @ k @ h


def _cka_from_grams(k: Tensor, other: Tensor) -> float:
    kc, lc = _center_gram(k), _center_gram(other)
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
    fields = ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx", "act_fn",
              "attn_only", "positional_embedding_type", "rotary_dim", "parallel_attn_mlp",
              "n_key_value_heads", "gated_mlp", "d_vocab_out")
    arch = {f: getattr(cfg, f) for f in fields if getattr(cfg, f, None) is not None}
    arch["normalization_type"] = (cfg.normalization_type or "LN").replace("Pre", "")
    return ModelSpec(source="random", name=f"random-{cfg.model_name}-{seed}", architecture=arch,
                     seed=seed, processing=lm.spec.processing)


def stability_records(
    anchor: LoadedModel,
    refits: Sequence[LoadedModel],
    prompts: Tensor,
    opts: StabilityOptions,
    load: Callable[[ModelSpec], LoadedModel],
) -> list[Record]:
    """heads.stability (per head and per layer), its null baseline, and residual CKA."""
    if not refits:
        raise SpecError("a family needs at least one refit besides the anchor")
    for other in refits:
        if (other.n_layers, other.n_heads, other.d_model) != (
                anchor.n_layers, anchor.n_heads, anchor.d_model):
            raise SpecError(f"{other.spec.name} does not share the anchor's architecture "
                            f"(layers, heads, d_model); refits must be of one architecture")
    base = model_activations(anchor, prompts, opts.cka_tokens)
    others = [model_activations(m, prompts, opts.cka_tokens) for m in refits]
    nulls = [model_activations(load(random_counterpart(anchor, 10_000 + i)), prompts,
                               opts.cka_tokens) for i in range(opts.n_null)]
    records = _head_records("stability", torch.stack([head_match(base, o) for o in others]))
    if nulls:
        records += _head_records("stability_null",
                                 torch.stack([head_match(base, o) for o in nulls]))
    for layer in range(anchor.n_layers):
        for kind, fn in (("linear", linear_cka), ("rbf", rbf_cka)):
            values = torch.tensor([fn(base.resid[layer], o.resid[layer]) for o in others])
            records.append(Record.of(f"heads.residual_cka.{kind}", float(values.mean()),
                                     len(values), layer=layer, stderr=_stderr(values)))
    return records


def _stderr(values: Tensor) -> float | None:
    return float(values.std() / len(values) ** 0.5) if len(values) > 1 else None


def _head_records(name: str, per_refit: Float[Tensor, "refit layer head"]) -> list[Record]:
    """Per head: mean over refits. Per layer (head null): mean over heads, and its std."""
    records = []
    per_head = per_refit.mean(0)
    n_refits = per_refit.shape[0]
    for layer in range(per_head.shape[0]):
        for head in range(per_head.shape[1]):
            records.append(Record.of(f"heads.{name}", float(per_head[layer, head]), n_refits,
                                     layer=layer, head=head,
                                     stderr=_stderr(per_refit[:, layer, head])))
        row = per_head[layer]
        records.append(Record.of(f"heads.{name}", float(row.mean()), len(row), layer=layer))
        records.append(Record.of(f"heads.{name}_std", float(row.std(unbiased=False)), len(row),
                                 layer=layer))
    return records
