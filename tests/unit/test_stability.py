"""heads.stability and residual CKA: self-consistency, permutation invariance, null baseline."""

from __future__ import annotations

import copy

import polars as pl
import pytest
import torch

from compute.models import LoadedModel, ModelSpec, load_model
from compute.records import records_to_table, validate_records
from compute.stability import (
    StabilityOptions,
    linear_cka,
    model_activations,
    rbf_cka,
    stability_records,
)

ARCH = dict(n_layers=3, d_model=32, n_heads=4, d_head=8, d_mlp=64, d_vocab=100, n_ctx=64,
            act_fn="gelu_new", normalization_type="LN")
OPTS = StabilityOptions(n_prompts=4, prompt_len=16, n_null=2, cka_tokens=48)


def random_model(seed: int) -> LoadedModel:
    return load_model(ModelSpec(source="random", name=f"r{seed}", architecture=ARCH, seed=seed))


def prompts() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    t = torch.randint(1, 100, (OPTS.n_prompts, OPTS.prompt_len), generator=g)
    t[:, 0] = 0
    return t


def frame(records: list) -> pl.DataFrame:  # type: ignore[type-arg]
    return pl.from_arrow(validate_records(records_to_table(records)))  # type: ignore[return-value]


def per_layer(df: pl.DataFrame, metric: str) -> list[float]:
    rows = df.filter((pl.col("metric") == metric) & pl.col("head").is_null()).sort("layer")
    return rows["value"].to_list()


def permuted_heads(lm: LoadedModel, seed: int) -> LoadedModel:
    """The same model with the heads of every layer permuted (a function-preserving change)."""
    clone = copy.deepcopy(lm)
    g = torch.Generator().manual_seed(seed)
    for block in clone.model.blocks:
        perm = torch.randperm(lm.n_heads, generator=g)
        attn = block.attn
        for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V"):
            param = getattr(attn, name)
            param.data = param.data[perm].clone()
    return clone


def test_family_against_itself_is_one_everywhere() -> None:
    anchor = random_model(1)
    df = frame(stability_records(anchor, [anchor, anchor], prompts(), OPTS, load_model))
    assert per_layer(df, "heads.stability") == pytest.approx([1.0] * 3, abs=1e-5)
    heads = df.filter((pl.col("metric") == "heads.stability") & pl.col("head").is_not_null())
    assert heads["value"].to_list() == pytest.approx([1.0] * 12, abs=1e-5)
    assert per_layer(df, "heads.residual_cka.linear") == pytest.approx([1.0] * 3, abs=1e-6)
    assert per_layer(df, "heads.residual_cka.rbf") == pytest.approx([1.0] * 3, abs=1e-6)


def test_permuting_heads_keeps_stability_one() -> None:
    anchor = random_model(1)
    shuffled = permuted_heads(anchor, seed=3)
    # the permutation really moved heads: the per-head patterns differ position by position
    a = model_activations(anchor, prompts(), 16).patterns
    b = model_activations(shuffled, prompts(), 16).patterns
    assert not torch.allclose(a, b)
    df = frame(stability_records(anchor, [shuffled], prompts(), OPTS, load_model))
    assert per_layer(df, "heads.stability") == pytest.approx([1.0] * 3, abs=1e-5)


def test_null_baseline_is_reported_and_below_self() -> None:
    anchor = random_model(1)
    df = frame(stability_records(anchor, [random_model(2)], prompts(), OPTS, load_model))
    null = per_layer(df, "heads.stability_null")
    assert len(null) == 3
    assert all(v < 0.999 for v in null)
    stds = per_layer(df, "heads.stability_std")
    assert all(s >= 0 for s in stds)


def test_refits_must_share_the_architecture() -> None:
    from compute.errors import SpecError

    other = load_model(ModelSpec(source="random", name="x", architecture={**ARCH, "n_layers": 2},
                                 seed=0))
    with pytest.raises(SpecError, match="architecture"):
        stability_records(random_model(1), [other], prompts(), OPTS, load_model)


@pytest.mark.parametrize("cka", [linear_cka, rbf_cka])
def test_cka_of_identical_representations_is_one(cka) -> None:  # type: ignore[no-untyped-def]
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
    assert cka(x, x) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("cka", [linear_cka, rbf_cka])
def test_cka_invariant_to_orthogonal_transform_and_isotropic_scaling(cka) -> None:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 16, generator=g)
    y = torch.randn(64, 16, generator=g)
    q, _ = torch.linalg.qr(torch.randn(16, 16, generator=g))
    base = cka(x, y)
    assert cka(x @ q * 3.7, y) == pytest.approx(base, abs=1e-6)
    assert cka(x, y @ q * 0.2) == pytest.approx(base, abs=1e-6)
    assert base < 0.9  # unrelated random features are not similar


def test_linear_cka_matches_the_kernel_definition() -> None:
    """Linear CKA from features equals HSIC-based CKA on linear Gram matrices."""
    from compute.stability import _cka_from_grams

    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(40, 8, generator=g).double(), torch.randn(40, 5, generator=g).double()
    assert linear_cka(x, y) == pytest.approx(_cka_from_grams(x @ x.T, y @ y.T), abs=1e-10)


def test_trained_refits_are_more_alike_than_random_models() -> None:
    """Two shipped AdamW refits (same architecture, seeds 0 and 1) against each other, next to
    the null baseline of randomly initialised models of that architecture."""
    from compute.models import resolve_model_spec, zoo_names
    from compute.tokens import TokenSpec, load_tokens, resolve_token_spec

    if not {"fam4l-adamw-s0", "fam4l-adamw-s1"} <= set(zoo_names()):
        pytest.skip("family refits not shipped")
    anchor = load_model(resolve_model_spec("zoo:fam4l-adamw-s0"))
    refit = load_model(resolve_model_spec("zoo:fam4l-adamw-s1"))
    opts = StabilityOptions(n_prompts=16, prompt_len=64, n_null=2, cka_tokens=256)
    spec = resolve_token_spec(TokenSpec(source="builtin", n_sequences=16, seq_len=64))
    tokens = load_tokens(spec, anchor.tokenizer, bos_token_id=anchor.bos_token_id,
                         d_vocab=anchor.d_vocab, n_ctx=anchor.n_ctx)
    df = frame(stability_records(anchor, [refit], tokens, opts, load_model))
    trained = per_layer(df, "heads.stability")
    null = per_layer(df, "heads.stability_null")
    assert all(t > n for t, n in zip(trained, null, strict=True))
    assert sum(t - n for t, n in zip(trained, null, strict=True)) / len(trained) > 0.05
    assert all(t < 0.99 for t in trained)  # independently trained: similar, not identical
