"""Planted-structure models: positive controls whose answers are known because they were built in.

(Longer than the ~500 lines a module should have, on purpose: the shared basis, the two
constructions and the registry read as one derivation, and each construction's weights are
checked against the answer written next to them; split, a reader would follow the basis across
files to check a single head.)

The reference tests prove that the engine computes each formula exactly; these models check that
the formulas detect what they are meant to detect. Each model is built by code from explicit
weights (deterministic, a few MB, built in well under a second), registered as a zoo model
(`zoo:planted-induction`, ...) and carries the answer it encodes (`PlantedModel.expected`, shown
by `strata zoo show NAME`).

Construction. Weights are first written in an abstract basis made of named orthogonal blocks
(`Blocks`: token identity, previous-token copy, positions, ...). A fixed random rotation
then maps that basis into the residual stream, onto the subspace orthogonal to the all-ones
vector. So the residual basis is not axis-aligned (no metric may rely on that), and every writing
weight is already centered over d_model: TransformerLens's "center writing weights" leaves the
function unchanged. The models have no LayerNorm (nothing to fold), no value biases, and an
unembedding whose centering over the vocabulary only shifts each position's logits by a
constant. The standard processing is therefore applied, honestly, and is a no-op on the output.

An MLP neuron pair with input weights +v and -v and output weights +c and -c computes
c * (gelu(v.x) - gelu(-v.x)) = c * (v.x) exactly (gelu_new is x * (1 + odd(x)) / 2), so pairs
build exact linear maps; single planted neurons carry the prediction / suppression / partition
structure of their output weights.

Models:
  planted-induction       2 layers, attention only: a previous-token head (layer 0, head 1) and
                          an induction head (layer 1, head 2); the other heads are diffuse.
  planted-induction-s1/s2 refits: the same circuit in the same heads, everything else
                          (token embeddings, diffuse heads, the rotation) drawn from another seed.
  planted-stages          6 layers with MLPs: layers 0-1 catastrophic, layer 4 an identity
                          layer, an attention-sink head (layer 2, head 1), prediction and
                          partition neurons in layer 3, suppression neurons in layer 5.
  planted-rotated         4 layers: context heads (layer 0), an idle layer, a rotation of the
                          whole residual stream (layer 2) and a doubling (layer 3), with the
                          unembedding in the rotated basis: the raw logit lens reads points 0-2
                          in the wrong basis, while an exact affine translator exists (the
                          tuned lens's positive control).
  planted-pruning         8 layers: a cancelling pair (layers 3, 4: redundant together, not
                          alone), two identity blocks (5, 6): the layer-pruning control.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from compute.errors import ModelLoadError, UnknownModelError
from compute.zoo.paths import zoo_path

VOCAB_SOURCE = "tiny-4l-s0"  # the zoo checkpoint whose tokenizer the planted models share
N_CTX = 128
PLANTED_VERSION = 1  # bump when any planted weight changes (it is part of the revision hash)


# --------------------------------------------------------------------------- the abstract basis


class Blocks:
    """Named orthogonal blocks of an abstract basis, rotated into a centered residual stream.

    `d_model = dim + 1`: the rotation's image is the complement of the all-ones direction.
    """

    def __init__(self, sizes: dict[str, int], seed: int) -> None:
        self.slices: dict[str, slice] = {}
        start = 0
        for name, size in sizes.items():
            self.slices[name] = slice(start, start + size)
            start += size
        self.dim = start
        self.d_model = start + 1
        gen = torch.Generator().manual_seed(seed)
        raw = torch.randn(self.d_model, self.d_model, generator=gen, dtype=torch.float64)
        raw[:, 0] = 1.0
        q, _ = torch.linalg.qr(raw)
        self.basis = q[:, 1:].contiguous()  # [d_model, dim], orthonormal, columns sum to 0

    def size(self, name: str) -> int:
        s = self.slices[name]
        return s.stop - s.start

    def place(self, name: str, values: Tensor) -> Tensor:
        """Vectors [..., size(name)] placed in block `name` of the abstract basis: [..., dim]."""
        out = torch.zeros(*values.shape[:-1], self.dim, dtype=torch.float64)
        out[..., self.slices[name]] = values.double()
        return out

    def write(self, abstract: Tensor) -> Tensor:
        """Abstract row vectors [..., dim] as residual-stream vectors [..., d_model]."""
        return abstract.double() @ self.basis.T

    def read(self, abstract: Tensor) -> Tensor:
        """A reading matrix [dim, k] in the abstract basis as one on the residual: [d_model, k]."""
        return self.basis @ abstract.double()


def _unit_rows(x: Tensor) -> Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


# --------------------------------------------------------------------------- weights container


@dataclass
class Weights:
    """A TransformerLens state dict under construction (float64 until the end)."""

    n_layers: int
    n_heads: int
    d_head: int
    d_model: int
    d_vocab: int
    d_mlp: int | None
    tensors: dict[str, Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        h, dh, d = self.n_heads, self.d_head, self.d_model
        self.tensors["embed.W_E"] = torch.zeros(self.d_vocab, d, dtype=torch.float64)
        self.tensors["pos_embed.W_pos"] = torch.zeros(N_CTX, d, dtype=torch.float64)
        for layer in range(self.n_layers):
            p = f"blocks.{layer}"
            for m in ("W_Q", "W_K", "W_V"):
                self.tensors[f"{p}.attn.{m}"] = torch.zeros(h, d, dh, dtype=torch.float64)
            for b in ("b_Q", "b_K", "b_V"):
                self.tensors[f"{p}.attn.{b}"] = torch.zeros(h, dh, dtype=torch.float64)
            self.tensors[f"{p}.attn.W_O"] = torch.zeros(h, dh, d, dtype=torch.float64)
            self.tensors[f"{p}.attn.b_O"] = torch.zeros(d, dtype=torch.float64)
            if self.d_mlp is not None:
                self.tensors[f"{p}.mlp.W_in"] = torch.zeros(d, self.d_mlp, dtype=torch.float64)
                self.tensors[f"{p}.mlp.b_in"] = torch.zeros(self.d_mlp, dtype=torch.float64)
                self.tensors[f"{p}.mlp.W_out"] = torch.zeros(self.d_mlp, d, dtype=torch.float64)
                self.tensors[f"{p}.mlp.b_out"] = torch.zeros(d, dtype=torch.float64)
        self.tensors["unembed.W_U"] = torch.zeros(d, self.d_vocab, dtype=torch.float64)
        self.tensors["unembed.b_U"] = torch.zeros(self.d_vocab, dtype=torch.float64)

    def __getitem__(self, key: str) -> Tensor:
        return self.tensors[key]

    def config(self, name: str) -> dict[str, Any]:
        cfg: dict[str, Any] = dict(
            n_layers=self.n_layers,
            d_model=self.d_model,
            n_heads=self.n_heads,
            d_head=self.d_head,
            d_vocab=self.d_vocab,
            n_ctx=N_CTX,
            act_fn="gelu_new",
            normalization_type=None,
            positional_embedding_type="standard",
            model_name=name,
            original_architecture="planted",
        )
        if self.d_mlp is None:
            cfg["attn_only"] = True
        else:
            cfg["d_mlp"] = self.d_mlp
        return cfg


def _scale_qk(d_head: int) -> float:
    """TransformerLens divides scores by sqrt(d_head); planted scores are written unscaled."""
    return float(d_head) ** 0.5


def _diffuse_head(
    w: Weights,
    blocks: Blocks,
    layer: int,
    head: int,
    gen: torch.Generator,
    *,
    reads: str,
    writes: str,
    qk_std: float,
    ov_norm: float,
) -> None:
    """A head with weak random scores (near-uniform rows) and a small random write."""
    p = f"blocks.{layer}.attn"
    dim, dh = blocks.dim, w.d_head
    for m in ("W_Q", "W_K"):
        a = torch.zeros(dim, dh, dtype=torch.float64)
        a[blocks.slices[reads]] = torch.randn(
            blocks.size(reads), dh, generator=gen, dtype=torch.float64
        )
        w[f"{p}.{m}"][head] = blocks.read(a) * qk_std**0.5  # score std ~ qk_std
    v = torch.zeros(dim, dh, dtype=torch.float64)
    v[blocks.slices[reads]] = (
        torch.randn(blocks.size(reads), dh, generator=gen, dtype=torch.float64) / dh**0.5
    )
    w[f"{p}.W_V"][head] = blocks.read(v)
    o = blocks.place(
        writes, torch.randn(dh, blocks.size(writes), generator=gen, dtype=torch.float64)
    )
    w[f"{p}.W_O"][head] = blocks.write(o) * ov_norm / blocks.size(writes) ** 0.5


# --------------------------------------------------------------------------- planted-induction

PREV_TOKEN_HEAD = (0, 1)  # (layer, head)
INDUCTION_HEAD = (1, 2)
INDUCTION_D_TOKEN = 96
PREV_SCORE = 30.0  # score of key q-1 for the previous-token head (others 0)
MATCH_SCORE = 40.0  # induction score for a key whose previous token is the query's token
BOS_FALLBACK = 20.0  # induction score of BOS: where nothing matches, the head rests on BOS
LOGIT_SCALE = 15.0  # logit of the copied token (others ~ N(0, (15 / sqrt(96))^2))


def build_induction(seed: int, d_vocab: int, bos: int) -> Weights:
    """Two attention-only layers of 4 heads; the circuit is fixed, the rest drawn from `seed`.

    Blocks: tok (token identity, 96 dims), prev (the previous token, written by the
    previous-token head), out (what the unembedding reads), pos (one-hot positions).
    """
    blocks = Blocks(
        {
            "tok": INDUCTION_D_TOKEN,
            "prev": INDUCTION_D_TOKEN,
            "out": INDUCTION_D_TOKEN,
            "pos": N_CTX,
        },
        seed=1000 + seed,
    )
    gen = torch.Generator().manual_seed(seed)
    d_tok, dh = INDUCTION_D_TOKEN, N_CTX
    w = Weights(2, 4, dh, blocks.d_model, d_vocab, None)
    tokens = _unit_rows(torch.randn(d_vocab, d_tok, generator=gen, dtype=torch.float64))
    tokens[bos] = 0.0  # BOS carries no token identity: an induction head resting on it copies 0
    w["embed.W_E"][:] = blocks.write(blocks.place("tok", tokens))
    w["pos_embed.W_pos"][:] = blocks.write(
        blocks.place("pos", torch.eye(N_CTX, dtype=torch.float64))
    )
    eye = torch.eye(d_tok, dtype=torch.float64)
    scale = _scale_qk(dh)

    # Previous-token head: query position q matches key position q-1 (one-hot positions);
    # it copies the key's token identity into the `prev` block.
    layer, head = PREV_TOKEN_HEAD
    q = torch.zeros(blocks.dim, dh, dtype=torch.float64)
    k = torch.zeros(blocks.dim, dh, dtype=torch.float64)
    pos = blocks.slices["pos"].start
    for position in range(N_CTX):
        q[pos + position, position] = PREV_SCORE * scale
        if position + 1 < N_CTX:
            k[pos + position, position + 1] = 1.0
    w[f"blocks.{layer}.attn.W_Q"][head] = blocks.read(q)
    w[f"blocks.{layer}.attn.W_K"][head] = blocks.read(k)
    v = torch.zeros(blocks.dim, dh, dtype=torch.float64)
    v[blocks.slices["tok"], :d_tok] = eye
    w[f"blocks.{layer}.attn.W_V"][head] = blocks.read(v)
    w[f"blocks.{layer}.attn.W_O"][head] = blocks.write(
        blocks.place("prev", torch.cat([eye, torch.zeros(dh - d_tok, d_tok, dtype=torch.float64)]))
    )

    # Induction head: the query's token against each key's previous token (K-composition with
    # the head above), plus a constant score on BOS as the no-match fallback; it copies the
    # attended key's own token into the `out` block.
    layer, head = INDUCTION_HEAD
    q = torch.zeros(blocks.dim, dh, dtype=torch.float64)
    q[blocks.slices["tok"], :d_tok] = eye * MATCH_SCORE * scale
    k = torch.zeros(blocks.dim, dh, dtype=torch.float64)
    k[blocks.slices["prev"], :d_tok] = eye
    k[pos, d_tok] = 1.0  # position 0
    w[f"blocks.{layer}.attn.W_Q"][head] = blocks.read(q)
    w[f"blocks.{layer}.attn.b_Q"][head, d_tok] = BOS_FALLBACK * scale
    w[f"blocks.{layer}.attn.W_K"][head] = blocks.read(k)
    w[f"blocks.{layer}.attn.W_V"][head] = blocks.read(v)
    w[f"blocks.{layer}.attn.W_O"][head] = blocks.write(
        blocks.place("out", torch.cat([eye, torch.zeros(dh - d_tok, d_tok, dtype=torch.float64)]))
    )

    for layer in range(2):
        for head in range(4):
            if (layer, head) not in (PREV_TOKEN_HEAD, INDUCTION_HEAD):
                _diffuse_head(
                    w, blocks, layer, head, gen, reads="tok", writes="out", qk_std=0.5, ov_norm=0.5
                )
    # logit_t = LOGIT_SCALE * <out block, token identity of t>
    w["unembed.W_U"][:] = blocks.read(blocks.place("out", tokens).T) * LOGIT_SCALE
    return w


# --------------------------------------------------------------------------- planted-stages

STAGES_LAYERS = 6
CATASTROPHIC_LAYERS = (0, 1)
IDENTITY_LAYER = 4
SINK_HEAD = (2, 1)
PREDICTION_LAYER = 3
SUPPRESSION_LAYER = 5
D_MLP = 128
PARTITION_COSINE = 0.2  # every token's unembedding has +-0.2 (cosine) along the partition axis
# Planted neurons: (layer, neuron) -> the tokens whose unembedding directions its output row is
# aligned with (+, prediction) or anti-aligned with (-, suppression).
PLANTED_PREDICTION = {
    (3, 100): (" the",),
    (3, 101): (" return", " def"),
    (3, 102): (":",),
    (5, 100): (" self",),
}
PLANTED_SUPPRESSION = {
    (5, 101): ("\n",),
    (5, 102): (" a", " an"),
    (5, 103): ("(",),
    (5, 104): (" is",),
}
PLANTED_PARTITION = {(3, 103): "space-initial tokens (promoted) vs the rest (suppressed)"}
OUTPUT_NORM = {2: 8.0, 3: 80.0, 5: 20.0}  # residual norm written towards the logits
STATE_DIM = 32


def _token_ids(tokenizer: Any, strings: tuple[str, ...]) -> list[int]:
    ids = []
    for s in strings:
        encoded = tokenizer(s, add_special_tokens=False)["input_ids"]
        if len(encoded) != 1:
            raise ModelLoadError(f"planted token {s!r} is not one token of the zoo tokenizer")
        ids.append(int(encoded[0]))
    return ids


def _linear_pairs(
    w: Weights, blocks: Blocks, layer: int, first: int, src: str, target: Tensor
) -> int:
    """Neuron pairs computing x -> target @ x_src exactly; target: [dim, size(src)]. Returns
    the next free neuron."""
    size = blocks.size(src)
    for j in range(size):
        read = torch.zeros(blocks.dim, dtype=torch.float64)
        read[blocks.slices[src].start + j] = 1.0
        for sign, neuron in ((1.0, first + 2 * j), (-1.0, first + 2 * j + 1)):
            w[f"blocks.{layer}.mlp.W_in"][:, neuron] = blocks.read(read[:, None])[:, 0] * sign
            w[f"blocks.{layer}.mlp.W_out"][neuron] = blocks.write(target[:, j]) * sign
    return first + 2 * size


def build_stages(seed: int, d_vocab: int, tokenizer: Any) -> Weights:
    """Six layers of 4 heads and 128 neurons; see the module docstring and `EXPECTED`."""
    blocks = Blocks(
        {
            "tok": STATE_DIM,
            "s1": STATE_DIM,
            "s2": STATE_DIM,
            "pos0": 1,
            "free": 511 - 3 * STATE_DIM - 1,
        },
        seed=2000 + seed,
    )
    gen = torch.Generator().manual_seed(seed)
    dim, dh = blocks.dim, 32
    w = Weights(STAGES_LAYERS, 4, dh, blocks.d_model, d_vocab, D_MLP)
    tok = _unit_rows(torch.randn(d_vocab, STATE_DIM, generator=gen, dtype=torch.float64))
    w["embed.W_E"][:] = blocks.write(blocks.place("tok", tok))
    w["pos_embed.W_pos"][0] = blocks.write(blocks.place("pos0", torch.ones(1, dtype=torch.float64)))

    # Unembedding: unit directions, isotropic in the whole abstract space, plus +-PARTITION_COSINE
    # along one axis splitting the vocabulary into space-initial tokens and the rest.
    axis = _unit_rows(torch.randn(dim, generator=gen, dtype=torch.float64))
    noise = torch.randn(d_vocab, dim, generator=gen, dtype=torch.float64)
    noise = _unit_rows(noise - (noise @ axis)[:, None] * axis)
    side = torch.tensor(
        [1.0 if tokenizer.decode([i]).startswith(" ") else -1.0 for i in range(d_vocab)],
        dtype=torch.float64,
    )
    c = PARTITION_COSINE
    unembed = (1 - c * c) ** 0.5 * noise + c * side[:, None] * axis
    w["unembed.W_U"][:] = blocks.read(unembed.T)

    def random_map(rows: str | None, cols: str, norm: float) -> Tensor:
        """[dim, size(cols)]: a random map from block `cols` into block `rows` (or anywhere)."""
        m = torch.randn(dim, blocks.size(cols), generator=gen, dtype=torch.float64)
        if rows is not None:
            keep = torch.zeros(dim, 1, dtype=torch.float64)
            keep[blocks.slices[rows]] = 1.0
            m = m * keep
        return m / m.norm(dim=0, keepdim=True) * norm

    # Layers 0 and 1 build the state every later layer reads: tok -> s1 -> s2.
    _linear_pairs(w, blocks, 0, 0, "tok", random_map("s1", "tok", 1.0))
    _linear_pairs(w, blocks, 1, 0, "s1", random_map("s2", "s1", 1.0))
    # Layers 2, 3, 5 write towards the logits (2 small, 3 most, 5 a refinement); layer 2 also
    # nudges the state, so that layer 3 depends on running after it.
    state = random_map("s2", "s2", 0.2)
    _linear_pairs(w, blocks, 2, 0, "s2", state + random_map("free", "s2", OUTPUT_NORM[2]))
    for layer in (3, 5):
        _linear_pairs(w, blocks, layer, 0, "s2", random_map("free", "s2", OUTPUT_NORM[layer]))

    def weak_read() -> Tensor:
        return blocks.read(random_map("s2", "s2", 0.3)[:, :1])[:, 0]

    # Planted neurons: output rows along (+) or against (-) a few tokens' unembedding
    # directions, with the partition axis projected out; one row along the partition axis.
    # They read the state weakly, so they fire a little.
    planted = {
        **{k: (1.0, v) for k, v in PLANTED_PREDICTION.items()},
        **{k: (-1.0, v) for k, v in PLANTED_SUPPRESSION.items()},
    }
    for (layer, neuron), (sign, strings) in planted.items():
        row = unembed[_token_ids(tokenizer, strings)].sum(0)
        row = row - (row @ axis) * axis
        w[f"blocks.{layer}.mlp.W_out"][neuron] = blocks.write(sign * 2.0 * row / row.norm())
        w[f"blocks.{layer}.mlp.W_in"][:, neuron] = weak_read()
    for layer, neuron in PLANTED_PARTITION:
        w[f"blocks.{layer}.mlp.W_out"][neuron] = blocks.write(2.0 * axis)
        w[f"blocks.{layer}.mlp.W_in"][:, neuron] = weak_read()
    # Unused neurons of working layers: random output rows, never active (zero input weights).
    for layer in range(STAGES_LAYERS):
        if layer == IDENTITY_LAYER:
            continue
        out = w[f"blocks.{layer}.mlp.W_out"]
        idle = (out.norm(dim=1) == 0).nonzero().squeeze(-1)
        rows = torch.randn(len(idle), dim, generator=gen, dtype=torch.float64)
        out[idle] = blocks.write(_unit_rows(rows))

    # Attention: diffuse heads with small writes, except the sink head (all weight on BOS, writes
    # nothing) and the identity layer (writes nothing at all).
    for layer in range(STAGES_LAYERS):
        for head in range(4):
            if layer == IDENTITY_LAYER:
                continue
            if (layer, head) == SINK_HEAD:
                k = torch.zeros(dim, dh, dtype=torch.float64)
                k[blocks.slices["pos0"].start, 0] = 1.0
                w[f"blocks.{layer}.attn.W_K"][head] = blocks.read(k)
                w[f"blocks.{layer}.attn.b_Q"][head, 0] = 20.0 * _scale_qk(dh)
                continue
            _diffuse_head(
                w, blocks, layer, head, gen, reads="tok", writes="free", qk_std=0.5, ov_norm=0.5
            )
    return w


# --------------------------------------------------------------------------- planted-rotated

ROTATED_LAYERS = 4
ROTATION_LAYER = 2  # its MLP maps the residual a to a Q (Q orthogonal): points 3, 4 are rotated
DOUBLING_LAYER = 3  # its MLP adds the residual to itself
ROTATED_LOGIT_STD = 1.5  # logit spread of the unrotated readout per unit of residual


def _linear_map_pairs(w: Weights, blocks: Blocks, layer: int, matrix: Tensor) -> None:
    """Neuron pairs (2 per abstract coordinate) computing the write a -> a @ matrix exactly,
    for abstract row vectors a ([dim, dim] matrix): gelu_new(x) - gelu_new(-x) = x."""
    for j in range(blocks.dim):
        read = torch.zeros(blocks.dim, 1, dtype=torch.float64)
        read[j] = 1.0
        for sign, neuron in ((1.0, 2 * j), (-1.0, 2 * j + 1)):
            w[f"blocks.{layer}.mlp.W_in"][:, neuron] = blocks.read(read)[:, 0] * sign
            w[f"blocks.{layer}.mlp.W_out"][neuron] = blocks.write(matrix[j]) * sign


def build_rotated(seed: int, d_vocab: int, *, rotate: bool = True) -> Weights:
    """The tuned lens's positive control (see the module docstring and `ROTATED_EXPECTED`).

    In abstract row vectors a: the embedding writes a unit token vector ("tok"), two diffuse
    heads of layer 0 write a mix of earlier tokens ("ctx"), layer 1 writes nothing, layer 2's
    MLP writes a (Q - I) so the residual becomes a Q, layer 3's MLP writes the residual again
    (2 a Q), and the unembedding reads Q^T W0: the logits are 2 a W0, whatever Q is. With
    `rotate=False` Q is the identity: the same function (tested), and the raw lens reads every
    point in the right basis.
    """
    blocks = Blocks({"tok": 16, "ctx": 16}, seed=3000 + seed)
    gen = torch.Generator().manual_seed(seed)
    dim = blocks.dim
    w = Weights(ROTATED_LAYERS, 2, 8, blocks.d_model, d_vocab, 2 * dim)
    tok = _unit_rows(torch.randn(d_vocab, blocks.size("tok"), generator=gen, dtype=torch.float64))
    w["embed.W_E"][:] = blocks.write(blocks.place("tok", tok))
    for head in range(2):
        _diffuse_head(w, blocks, 0, head, gen, reads="tok", writes="ctx", qk_std=0.5, ov_norm=1.0)
    q, _ = torch.linalg.qr(torch.randn(dim, dim, generator=gen, dtype=torch.float64))
    if not rotate:
        q = torch.eye(dim, dtype=torch.float64)
    eye = torch.eye(dim, dtype=torch.float64)
    _linear_map_pairs(w, blocks, ROTATION_LAYER, q - eye)
    _linear_map_pairs(w, blocks, DOUBLING_LAYER, eye)
    readout = torch.randn(dim, d_vocab, generator=gen, dtype=torch.float64) * ROTATED_LOGIT_STD
    w["unembed.W_U"][:] = blocks.read(q.T @ readout)
    return w


ROTATED_EXPECTED: tuple[dict[str, Any], ...] = (
    {
        "metric": "logit_lens.kl_to_final",
        "layer": [0, 1, 2],
        "expected": "large (> 1 nat): points before the rotation are read in the wrong basis",
    },
    {
        "metric": "tuned_lens.kl_to_final",
        "layer": [0, 1, 2, 3],
        "expected": "~0 (< 0.05 nats): the translator a -> 2 a Q (points 0-2), a -> 2 a "
        "(point 3) is exact",
    },
)


# --------------------------------------------------------------------------- planted-pruning

PRUNING_LAYERS = 8
CANCELLING_PAIR = (3, 4)  # layer 3's MLP writes f(state), layer 4's writes -f(state)
IDLE_RUN = (5, 6)  # identity blocks: they write nothing
PRUNING_OUTPUT_LAYERS = (1, 2, 7)  # each writes towards the logits, read from the state
JUNK_NORM = 3.0  # norm of the map behind f: the pair's writes are as large as the residual


def build_pruning(seed: int, d_vocab: int) -> Weights:
    """The layer-pruning positive control (see `PRUNING_EXPECTED`).

    In abstract row vectors: the embedding writes a unit token vector ("tok"), two diffuse heads
    of layer 0 a mix of earlier tokens ("ctx"), layer 0's MLP the state ("state", a linear map of
    tok). Layers 1, 2 and 7 write linear maps of the state into "out"; layer 3 writes f = M
    state into "junk" and layer 4 writes -M state (it reads the state, which layer 3 leaves
    alone), so x_5 = x_3: the pair is redundant together and neither block is alone. Layers 5
    and 6 write nothing. The unembedding reads every block of the basis, junk included.
    """
    blocks = Blocks({"tok": 16, "ctx": 8, "state": 16, "junk": 16, "out": 16}, seed=4000 + seed)
    gen = torch.Generator().manual_seed(seed)
    dim = blocks.dim
    w = Weights(PRUNING_LAYERS, 2, 8, blocks.d_model, d_vocab, 2 * 16)
    tok = _unit_rows(torch.randn(d_vocab, blocks.size("tok"), generator=gen, dtype=torch.float64))
    w["embed.W_E"][:] = blocks.write(blocks.place("tok", tok))
    for head in range(2):
        _diffuse_head(w, blocks, 0, head, gen, reads="tok", writes="ctx", qk_std=0.5, ov_norm=1.0)

    def random_map(rows: str, cols: str, norm: float) -> Tensor:
        """[dim, size(cols)]: a random map from block `cols` into block `rows`."""
        m = torch.zeros(dim, blocks.size(cols), dtype=torch.float64)
        m[blocks.slices[rows]] = torch.randn(
            blocks.size(rows), blocks.size(cols), generator=gen, dtype=torch.float64
        )
        return m / m.norm(dim=0, keepdim=True) * norm

    _linear_pairs(w, blocks, 0, 0, "tok", random_map("state", "tok", 1.0))
    for layer in PRUNING_OUTPUT_LAYERS:
        _linear_pairs(w, blocks, layer, 0, "state", random_map("out", "state", 1.0))
    junk = random_map("junk", "state", JUNK_NORM)
    _linear_pairs(w, blocks, CANCELLING_PAIR[0], 0, "state", junk)
    _linear_pairs(w, blocks, CANCELLING_PAIR[1], 0, "state", -junk)
    w["unembed.W_U"][:] = blocks.read(
        torch.randn(dim, d_vocab, generator=gen, dtype=torch.float64) * 2.0
    )
    return w


PRUNING_EXPECTED: tuple[dict[str, Any], ...] = (
    {
        "metric": "pruning.block_influence",
        "layer": list(IDLE_RUN),
        "expected": "0 for the identity blocks 5 and 6; every other block > 0, the cancelling "
        "pair 3, 4 included (a single-block score cannot see that they cancel)",
    },
    {
        "metric": "pruning.angular_distance_<n>",
        "expected": "0 exactly where the blocks l..l+n-1 write nothing in sum: (5, 1), (6, 1), "
        "(3, 2), (5, 2), (3, 3), (3, 4); every other (l, n) > 0; the same for the last-token "
        "variant",
    },
    {
        "metric": "pruning_drops.kl_<n>",
        "expected": "~0 at the same (l, n) as the angular distance, and > 0 everywhere else; "
        "intervention.kl (drop) ~0 at layers 5 and 6 only",
    },
)


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class PlantedModel:
    """A planted control: how to build it and the answer it encodes."""

    name: str
    summary: str
    build: Callable[[int, Any], Weights]
    expected: tuple[dict[str, Any], ...]


def _induction(seed: int) -> Callable[[int, Any], Weights]:
    return lambda d_vocab, tokenizer: build_induction(seed, d_vocab, int(tokenizer.bos_token_id))


INDUCTION_EXPECTED: tuple[dict[str, Any], ...] = (
    {
        "metric": "heads.induction",
        "layer": 1,
        "head": 2,
        "expected": "~1 for this head; every other head < 0.1",
    },
    {
        "metric": "attention.prev_1",
        "layer": 0,
        "head": 1,
        "expected": "~1 (the previous-token head); every other head well below",
    },
    {
        "metric": "heads.ablation_loss_delta",
        "tokens": "repeated random sequences",
        "layer": 1,
        "head": 2,
        "expected": "the largest of all heads; the previous-token head (0, 1) is its only key "
        "source, so its ablation costs about as much; diffuse heads ~0",
    },
    {
        "metric": "heads.stability",
        "family": "planted-induction, -s1, -s2",
        "expected": "~1 for heads (0, 1) and (1, 2); the diffuse heads near the null baseline",
    },
)
STAGES_EXPECTED: tuple[dict[str, Any], ...] = (
    {
        "metric": "intervention.kl",
        "component": "drop",
        "layer": IDENTITY_LAYER,
        "expected": "0 (identity layer); every other layer > 0",
    },
    {
        "metric": "intervention.kl",
        "component": "swap",
        "layer": [3, 4],
        "expected": "0 for swaps (3,4) and (4,5), which involve the identity layer; others > 0",
    },
    {
        "metric": "intervention.kl",
        "component": "drop",
        "layer": list(CATASTROPHIC_LAYERS),
        "expected": "catastrophic (several nats); later layers a small fraction of it",
    },
    {
        "metric": "stages.boundary_1",
        "layer": 2,
        "expected": "layer 2: the first layer after the catastrophic ones",
    },
    {
        "metric": "stages.boundary_2",
        "layer": PREDICTION_LAYER,
        "expected": "layer 3: the logit lens stays near uniform until layer 3 writes the "
        "prediction",
    },
    {
        "metric": "stages.boundary_3",
        "layer": SUPPRESSION_LAYER,
        "expected": "layer 5: suppression neurons outnumber prediction neurons from there on",
    },
    {
        "metric": "attention.bos",
        "layer": SINK_HEAD[0],
        "head": SINK_HEAD[1],
        "expected": "~1 (attention sink); other heads < 0.2",
    },
    {
        "metric": "neurons (class)",
        "layer": 3,
        "expected": "prediction: neurons 100, 101, 102; partition: neuron 103; nothing else "
        "classified in the layer",
    },
    {
        "metric": "neurons (class)",
        "layer": 5,
        "expected": "suppression: neurons 101-104; prediction: neuron 100; nothing else",
    },
    {
        "metric": "neurons top tokens",
        "expected": "prediction 3/100 promotes ' the'; 3/101 ' return', ' def'; 3/102 ':'; "
        "5/100 ' self'. Suppression 5/101 suppresses '\\n'; 5/102 ' a', ' an'; "
        "5/103 '('; 5/104 ' is'",
    },
)

PLANTED: dict[str, PlantedModel] = {
    "planted-induction": PlantedModel(
        "planted-induction",
        "2-layer attention-only induction circuit: previous-token head L0H1, induction head "
        "L1H2, other heads diffuse",
        _induction(0),
        INDUCTION_EXPECTED,
    ),
    **{
        f"planted-induction-s{s}": PlantedModel(
            f"planted-induction-s{s}",
            f"refit of planted-induction: the same circuit, everything else from seed {s}",
            _induction(s),
            INDUCTION_EXPECTED,
        )
        for s in (1, 2)
    },
    "planted-stages": PlantedModel(
        "planted-stages",
        "6 layers: catastrophic layers 0-1, identity layer 4, sink head L2H1, prediction / "
        "partition neurons in layer 3, suppression neurons in layer 5",
        lambda d_vocab, tokenizer: build_stages(0, d_vocab, tokenizer),
        STAGES_EXPECTED,
    ),
    "planted-rotated": PlantedModel(
        "planted-rotated",
        "4 layers: the residual stream rotated by layer 2 and doubled by layer 3, the "
        "unembedding in the rotated basis: the raw lens fails before the rotation, an exact "
        "affine translator exists (the tuned lens's positive control)",
        lambda d_vocab, tokenizer: build_rotated(0, d_vocab),
        ROTATED_EXPECTED,
    ),
    "planted-pruning": PlantedModel(
        "planted-pruning",
        "8 layers: blocks 3 and 4 cancel each other (redundant together, neither alone), "
        "blocks 5 and 6 are identities, the rest do work: the layer-pruning positive control",
        lambda d_vocab, tokenizer: build_pruning(0, d_vocab),
        PRUNING_EXPECTED,
    ),
}


def planted_names() -> list[str]:
    return sorted(PLANTED)


def planted_model(name: str) -> PlantedModel:
    try:
        return PLANTED[name]
    except KeyError:
        raise UnknownModelError(
            f"no planted model {name!r}; available: {', '.join(planted_names())}"
        ) from None


def planted_tokenizer() -> Any:
    """The zoo tokenizer (shared with the zoo checkpoints, so text inputs work as for them)."""
    from compute.zoo.tokenizer import load_zoo_tokenizer

    path = zoo_path(VOCAB_SOURCE)
    if not (path / "tokenizer.json").is_file():
        raise ModelLoadError(
            f"planted models take their tokenizer from zoo model {VOCAB_SOURCE!r}, which is missing"
        )
    tokenizer = load_zoo_tokenizer(path)
    tokenizer.model_max_length = N_CTX
    return tokenizer


def planted_weights(name: str) -> tuple[dict[str, Any], dict[str, Tensor], Any]:
    """HookedTransformer config fields, float32 state dict and tokenizer of a planted model."""
    planted = planted_model(name)
    tokenizer = planted_tokenizer()
    weights = planted.build(len(tokenizer), tokenizer)
    state = {k: v.float() for k, v in weights.tensors.items()}
    return weights.config(name), state, tokenizer


@functools.cache
def planted_checksum(name: str) -> str:
    """A content hash of the built weights: a run can tell when a planted model changed."""
    _, state, _ = planted_weights(name)
    digest = hashlib.sha256(f"planted-v{PLANTED_VERSION}".encode())
    for key in sorted(state):
        digest.update(key.encode())
        digest.update(state[key].contiguous().numpy().tobytes())
    return "sha256:" + digest.hexdigest()[:16]


def planted_metadata(name: str) -> dict[str, Any]:
    """What `strata zoo show` prints for a planted model: summary and expected answers."""
    planted = planted_model(name)
    return {
        "name": name,
        "kind": "planted control",
        "summary": planted.summary,
        "built_from": "explicit weights (compute/zoo/planted.py), no training",
        "tokenizer": f"zoo tokenizer of {VOCAB_SOURCE}",
        "expected": list(planted.expected),
    }
