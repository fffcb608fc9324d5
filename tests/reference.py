"""A slow, obvious reference implementation of the sweep's metric families (docs/metrics.md).
(Over ~500 lines on purpose: every family's reference side by side, written the obvious way.)

It exists to check `compute.engine.sweep` (tests/unit/test_reference_*.py) and to stand in for
the original study's code in `benchmarks/sweep.py`. It is written independently of the engine: it
imports nothing from `compute.metrics`, `compute.reduce` or `compute.engine` and never calls the
engine's model layer (`LoadedModel.embed / run_block / logits`); it talks to the TransformerLens
`TransformerBridge` in `lm.model` directly, the way research code does:

- one sequence at a time (batch size 1), explicit Python loops over layers, heads, positions
  and attention queries (next-token log-probabilities are computed per sequence, then read out
  position by position);
- every intervention is a full `model.run_with_hooks(...)` forward, and the baseline P is
  recomputed with its own full forward for every intervention;
- `drop` / `drop_attn` / `drop_mlp` are hooks on `blocks.{l}.hook_attn_out` / `hook_mlp_out`
  returning zeros; a head ablation zeroes that head in `blocks.{l}.attn.hook_z`;
- a swap exchanges the weights of blocks l and l+1 in a deep copy of the model (state-dict
  entries `blocks.l.*` <-> `blocks.{l+1}.*`) and runs a full forward of the copy;
- the logit lens takes `run_with_cache` residuals through `model.ln_final` and `model.unembed`;
  the tuned lens (`tuned_lens_rows`, given its translators) first maps each position's residual
  through its point's translator in float64 with numpy;
- per-token values are collected in Python lists, one per sequence, then reduced with numpy: the
  mean of each sequence's values, then the mean of those per-sequence means and their sample
  std (ddof=1) / sqrt(n), n = number of sequences; stderr is None for n < 2 (docs/metrics.md:
  the sequence is the unit of uncertainty). `reference_sequence_means` gives the per-sequence
  means themselves;
- neuron moments come from `scipy.stats` (population moments; kurtosis non-excess).

Distributions are compared in float64 (from the model's float32 logits).

Record conventions shared with the engine (where the definitions leave a choice):
- `intervention.*`: one row per (kind, layer); the `none` row has layer None.
- `logit_lens.*`: `layer` is the residual point 0..L.
- `neurons.vocab_*`: n = number of real vocabulary tokens, stderr None; `n_<class>` /
  `frac_<class>` per layer with n = d_mlp (times the experts under a mixture of experts: a
  neuron is one unit of one expert, expert by expert). A neuron with constant cosines (zero
  variance) gets skew 0 and kurtosis 0 (scipy would say NaN, which cannot be stored).
- `attention.*`: per (layer, head) and per layer (head None); the per-layer value at a query is
  the mean over heads. `prev_<k>` only for k <= seq_len-3 (an evaluated
  query q > k must exist); `prev_<k>_mean` = prev_<k> / k, stderr / k.
- `norms.*`: attn_out (component attn), mlp_out (component mlp), resid and attn_mlp_ratio
  (component None); the ratio has stderr None and n = sequences.
- `intervention.swap_minus_drop_kl` / `_top1` (component `swap-drop`, layers 0..L-2): per token
  the swap's KL (agreement) minus the drop's, averaged per sequence.
- `heads.*`: ablation over the evaluated tokens; induction over (n-1) items of each of the
  induction sequences (the unit), with n = min(induction_n, (n_ctx-1)//2).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import polars as pl
import scipy.stats
import torch

LN2 = math.log(2.0)
FAMILIES = ("intervention", "logit_lens", "neurons", "similarity", "attention", "norms", "heads",
            "heads_atp")
COLUMNS = ("metric", "layer", "component", "head", "neuron", "value", "stderr", "n", "unit")
SCHEMA = {"metric": pl.String, "layer": pl.Int64, "component": pl.String, "head": pl.Int64,
          "neuron": pl.Int64, "value": pl.Float64, "stderr": pl.Float64, "n": pl.Int64,
          "unit": pl.String}

# Units, written out from docs/metrics.md.
UNITS = {
    "intervention.kl": "nats", "intervention.top1_agreement": "fraction",
    "intervention.entropy": "bits", "intervention.entropy_delta": "bits",
    "intervention.loss": "nats", "intervention.loss_delta": "nats",
    "intervention.accuracy": "fraction", "intervention.swap_minus_drop_kl": "nats",
    "intervention.swap_minus_drop_top1": "fraction",
    "logit_lens.kl_to_final": "nats", "logit_lens.entropy": "bits",
    "logit_lens.top1_agreement": "fraction", "logit_lens.loss": "nats",
    "tuned_lens.kl_to_final": "nats", "tuned_lens.entropy": "bits",
    "tuned_lens.top1_agreement": "fraction", "tuned_lens.loss": "nats",
    "neurons.vocab_mean": "cosine", "neurons.vocab_var": "cosine^2",
    "neurons.vocab_skew": "ratio", "neurons.vocab_kurt": "ratio",
    "neurons.n_prediction": "count", "neurons.n_suppression": "count",
    "neurons.n_partition": "count", "neurons.frac_prediction": "fraction",
    "neurons.frac_suppression": "fraction", "neurons.frac_partition": "fraction",
    "neurons.n_prediction_cal": "count", "neurons.n_suppression_cal": "count",
    "neurons.n_partition_cal": "count", "neurons.frac_prediction_cal": "fraction",
    "neurons.frac_suppression_cal": "fraction", "neurons.frac_partition_cal": "fraction",
    "neurons.null_kurt_q999": "ratio", "neurons.null_skew_q999": "ratio",
    "neurons.null_var_q999": "cosine^2",
    "similarity.self": "cosine", "similarity.index": "cosine", "similarity.adjacent": "cosine",
    "attention.bos": "fraction", "attention.entropy": "bits",
    "norms.attn_out": "norm", "norms.mlp_out": "norm", "norms.attn_mlp_ratio": "ratio",
    "norms.resid": "norm",
    "heads.ablation_kl": "nats", "heads.ablation_loss_delta": "nats",
    "heads.induction": "fraction", "heads_atp.loss_delta": "nats",
}


@dataclass(frozen=True)
class ReferenceOptions:
    """The knobs the reference reads; `compute.metrics.base.EngineOptions` works as well."""

    prev_ks: tuple[int, ...] = (1, 2, 4, 5, 8, 16)
    induction_n: int = 64
    induction_sequences: int = 32
    induction_seed: int = 0
    top_neurons: int = 20
    top_tokens: int = 10


# --------------------------------------------------------------------------- small helpers


def _unit(metric: str) -> str:
    if metric.startswith("attention.prev_"):
        return "fraction"
    return UNITS[metric]


def _row(metric: str, value: float, n: int, *, layer: int | None = None,
         component: str | None = None, head: int | None = None, neuron: int | None = None,
         stderr: float | None = None) -> dict[str, Any]:
    return {"metric": metric, "layer": layer, "component": component, "head": head,
            "neuron": neuron, "value": float(value),
            "stderr": None if stderr is None else float(stderr), "n": int(n),
            "unit": _unit(metric)}


PerSequence = dict[int, list[float]]  # sequence index -> that sequence's per-token values


def put(store: dict[Any, PerSequence], key: Any, sequence: int, value: float) -> None:
    store.setdefault(key, {}).setdefault(sequence, []).append(value)


def mean_row(metric: str, by_sequence: PerSequence, **key: Any) -> dict[str, Any]:
    """The mean of per-sequence means, with their sample std / sqrt(n sequences) as its
    standard error. The per-sequence means ride along under "_sequences"."""
    seqs = sorted(by_sequence)
    means = np.asarray([np.mean(np.asarray(by_sequence[i], dtype=np.float64)) for i in seqs])
    n = len(means)
    stderr = float(np.std(means, ddof=1) / np.sqrt(n)) if n >= 2 else None
    row = _row(metric, float(np.mean(means)), n, stderr=stderr, **key)
    row["_sequences"] = dict(zip(seqs, means.tolist(), strict=True))
    return row


def to_frame(rows: Iterable[dict[str, Any]]) -> pl.DataFrame:
    return pl.DataFrame([{c: r[c] for c in COLUMNS} for r in rows], schema=SCHEMA)


SEQUENCE_SCHEMA = {"metric": pl.String, "layer": pl.Int64, "component": pl.String,
                   "head": pl.Int64, "sequence": pl.Int64, "value": pl.Float64}


def sequence_frame(rows: Iterable[dict[str, Any]]) -> pl.DataFrame:
    """The per-sequence means of the per-layer rows (head None) among `rows`."""
    out = [{"metric": r["metric"], "layer": r["layer"], "component": r["component"],
            "head": r["head"], "sequence": seq, "value": value}
           for r in rows if r["head"] is None and r["neuron"] is None
           for seq, value in r.get("_sequences", {}).items()]
    return pl.DataFrame(out, schema=SEQUENCE_SCHEMA)


def _model(lm: Any) -> Any:
    return lm.model


def real_vocab(lm: Any) -> int:
    """Vocabulary size without W_U's padding columns beyond the tokenizer's vocabulary."""
    model = _model(lm)
    n = int(model.cfg.d_vocab_out)
    if getattr(lm, "tokenizer", None) is not None:
        n = min(n, len(lm.tokenizer))
    return n


def bos_id(lm: Any) -> int:
    tok = getattr(lm, "tokenizer", None)
    for attr in ("bos_token_id", "eos_token_id"):
        value = getattr(tok, attr, None) if tok is not None else None
        if value is not None:
            return int(value)
    return 0


def _has_mlp(model: Any) -> bool:
    return not model.cfg.attn_only


def _forward(model: Any, seq: torch.Tensor,
             hooks: list[tuple[str, Callable[..., Any]]] | None = None) -> torch.Tensor:
    """A full forward of one sequence [T] -> logits [T, vocab] (float32)."""
    if hooks:
        logits = model.run_with_hooks(seq[None], return_type="logits", fwd_hooks=hooks)
    else:
        logits = model(seq[None], return_type="logits")
    return logits[0].float()


def _zero_hook(tensor: torch.Tensor, hook: Any) -> torch.Tensor:
    return torch.zeros_like(tensor)


def _zero_head_hook(head: int) -> Callable[..., torch.Tensor]:
    def hook_fn(z: torch.Tensor, hook: Any) -> torch.Tensor:
        z = z.clone()
        z[:, :, head, :] = 0.0
        return z
    return hook_fn


def swapped_model(model: Any, layer: int) -> Any:
    """A deep copy of the model with blocks `layer` and `layer+1` exchanged as whole modules: each
    block takes its weights and its own attention kind along (a GPT-Neo local-attention block
    stays local at its new position), as reordering a model's list of layers does."""
    other = copy.deepcopy(model)
    first, second = other.blocks[layer], other.blocks[layer + 1]
    # The bridge's blocks are the model's own layers: swap them in the model's list of layers
    # (which its forward iterates) and in the bridge's.
    for module in [other.original_model, *other.original_model.modules()]:
        if isinstance(module, torch.nn.ModuleList) and len(module) > layer + 1 \
                and module[layer] is first and module[layer + 1] is second:
            module[layer], module[layer + 1] = second, first
    if other.blocks[layer] is first:
        other.blocks[layer], other.blocks[layer + 1] = second, first
    # Models whose forward picks each position's mask and rotary base from the config's list of
    # layer types (Gemma 2/3, OLMo 3, ...): the list is reordered with the layers.
    config = getattr(other.original_model, "config", None)  # (the native model has none)
    for holder in (config, getattr(config, "text_config", None)):
        kinds = getattr(holder, "layer_types", None) if holder is not None else None
        if isinstance(kinds, list) and len(kinds) > layer + 1:
            kinds[layer], kinds[layer + 1] = kinds[layer + 1], kinds[layer]
    # hook names follow the modules' new places: named afresh from the module tree
    for hook_point in other.hook_dict.values():
        hook_point.name = None
    other.clear_hook_registry()
    other._initialize_hook_registry()
    other.eval()
    return other


def _logits_from_resid(model: Any, resid: torch.Tensor) -> torch.Tensor:
    """The final norm recomputed on this residual, then the unembedding (and any soft-cap)."""
    x = resid
    if model.cfg.normalization_type is not None:
        x = model.ln_final(x)
    logits = model.unembed(x)
    cap = getattr(model.cfg, "output_logits_soft_cap", -1.0) or -1.0
    if cap > 0:
        logits = cap * torch.tanh(logits / cap)
    return logits.float()


def compare_sequence(p_logits: torch.Tensor, q_logits: torch.Tensor,
                     seq: torch.Tensor) -> list[dict[str, float]]:
    """Per evaluated position p = 1..T-2 of one sequence: KL(P||Q) (nats), entropy of Q and of P
    (bits), top-1 agreement, loss of Q and of P against seq[p+1] (nats), accuracy of Q.

    Log-probabilities are computed for the whole sequence at once in float64 (as the original
    study's code did per sequence); everything after that is per position, in Python.
    """
    logp = torch.log_softmax(p_logits.double(), dim=-1)
    logq = torch.log_softmax(q_logits.double(), dim=-1)
    kl = (logp.exp() * (logp - logq)).sum(-1).tolist()
    entropy_q = (-(logq.exp() * logq).sum(-1) / LN2).tolist()
    entropy_p = (-(logp.exp() * logp).sum(-1) / LN2).tolist()
    top_q = q_logits.argmax(-1).tolist()
    top_p = p_logits.argmax(-1).tolist()
    out = []
    for pos in range(1, len(seq) - 1):
        target = int(seq[pos + 1])
        out.append({
            "kl": kl[pos], "entropy_q": entropy_q[pos], "entropy_p": entropy_p[pos],
            "agree": float(top_q[pos] == top_p[pos]),
            "loss_q": float(-logq[pos, target]), "loss_p": float(-logp[pos, target]),
            "correct": float(top_q[pos] == target),
        })
    return out


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))


def _sequences(tokens: torch.Tensor) -> list[torch.Tensor]:
    return [tokens[i].cpu() for i in range(tokens.shape[0])]


# --------------------------------------------------------------------------- intervention.*

INTERVENTION_METRICS = ("kl", "top1_agreement", "entropy", "entropy_delta", "loss",
                        "loss_delta", "accuracy")


Run = Callable[[torch.Tensor], torch.Tensor]


def _intervention_runs(model: Any) -> list[tuple[str, int | None, Run]]:
    """(kind, layer, seq -> logits of Q) for every intervention, `none` first."""
    n_layers = model.cfg.n_layers
    runs: list[tuple[str, int | None, Run]] = [("none", None, partial(_forward, model))]
    for layer in range(n_layers):
        attn = (f"blocks.{layer}.hook_attn_out", _zero_hook)
        mlp = (f"blocks.{layer}.hook_mlp_out", _zero_hook)
        both = [attn, mlp] if _has_mlp(model) else [attn]
        runs.append(("drop", layer, partial(_forward, model, hooks=both)))
        runs.append(("drop_attn", layer, partial(_forward, model, hooks=[attn])))
        if _has_mlp(model):
            runs.append(("drop_mlp", layer, partial(_forward, model, hooks=[mlp])))
        if layer < n_layers - 1:
            runs.append(("swap", layer, partial(_forward, swapped_model(model, layer))))
    return runs


def intervention_rows(lm: Any, tokens: torch.Tensor, opts: Any = None) -> list[dict[str, Any]]:
    model = _model(lm)
    per_token: dict[tuple[str, str, int | None], PerSequence] = {}
    runs = _intervention_runs(model)
    n_layers = model.cfg.n_layers
    for index, seq in enumerate(_sequences(tokens)):
        per_position: dict[tuple[str, int | None], list[dict[str, float]]] = {}
        for kind, layer, run in runs:
            clean = _forward(model, seq)  # the baseline, recomputed for every intervention
            intervened = run(seq)
            per_position[(kind, layer)] = compare_sequence(clean, intervened, seq)
            for s in per_position[(kind, layer)]:
                values = {"kl": s["kl"], "top1_agreement": s["agree"],
                          "entropy": s["entropy_q"],
                          "entropy_delta": s["entropy_q"] - s["entropy_p"],
                          "loss": s["loss_q"], "loss_delta": s["loss_q"] - s["loss_p"],
                          "accuracy": s["correct"]}
                for metric in INTERVENTION_METRICS:
                    put(per_token, (metric, kind, layer), index, values[metric])
        for layer in range(n_layers - 1):  # paired: swap minus drop, token by token
            pairs = zip(per_position[("swap", layer)], per_position[("drop", layer)], strict=True)
            for swap, drop in pairs:
                put(per_token, ("swap_minus_drop_kl", "swap-drop", layer), index,
                    swap["kl"] - drop["kl"])
                put(per_token, ("swap_minus_drop_top1", "swap-drop", layer), index,
                    swap["agree"] - drop["agree"])
    return [mean_row(f"intervention.{metric}", values, layer=layer, component=kind)
            for (metric, kind, layer), values in per_token.items()]


# --------------------------------------------------------------------------- logit_lens.*


def _lens_rows(lm: Any, tokens: torch.Tensor, family: str,
               read: Callable[[Any, int], torch.Tensor]) -> list[dict[str, Any]]:
    """A lens family's rows: per sequence and point 0..L, the residual `read(cache, point)`
    gives (point L: the model's own final residual) through `model.ln_final` and
    `model.unembed`, compared with the model's output token by token."""
    model = _model(lm)
    n_layers = model.cfg.n_layers
    per_token: dict[tuple[str, int], PerSequence] = {}
    for index, seq in enumerate(_sequences(tokens)):
        final = _forward(model, seq)
        _, cache = model.run_with_cache(seq[None])
        for point in range(n_layers + 1):
            resid = (read(cache, point) if point < n_layers
                     else cache[f"blocks.{n_layers - 1}.hook_resid_post"][0])
            lens = _logits_from_resid(model, resid)
            for s in compare_sequence(final, lens, seq):
                for metric, value in (("kl_to_final", s["kl"]), ("entropy", s["entropy_q"]),
                                      ("top1_agreement", s["agree"]), ("loss", s["loss_q"])):
                    put(per_token, (metric, point), index, value)
    return [mean_row(f"{family}.{metric}", values, layer=point)
            for (metric, point), values in per_token.items()]


def logit_lens_rows(lm: Any, tokens: torch.Tensor, opts: Any = None) -> list[dict[str, Any]]:
    return _lens_rows(lm, tokens, "logit_lens",
                      lambda cache, point: cache[f"blocks.{point}.hook_resid_pre"][0])


# --------------------------------------------------------------------------- tuned_lens.*


def tuned_lens_rows(lm: Any, tokens: torch.Tensor, weights: list[np.ndarray],
                    biases: list[np.ndarray]) -> list[dict[str, Any]]:
    """The tuned lens read the obvious way: per sequence, `run_with_cache` residuals; at point
    i < L each position's residual h (float64) becomes h + A_i h + b_i, one position at a time,
    then `model.ln_final` and `model.unembed`; point L is the model's own output.
    `weights[i]` is A_i as [out, in] (torch.nn.Linear's layout), `biases[i]` is b_i."""
    def translated(cache: Any, point: int) -> torch.Tensor:
        resid = cache[f"blocks.{point}.hook_resid_pre"][0].double().numpy()
        rows = [h + weights[point] @ h + biases[point] for h in resid]
        return torch.tensor(np.stack(rows), dtype=torch.float32)

    return _lens_rows(lm, tokens, "tuned_lens", translated)


# --------------------------------------------------------------------------- neurons.*

KURTOSIS_THRESHOLD = 10.0
PARTITION_VARIANCE = 0.005


def unembedding_directions(lm: Any) -> np.ndarray:
    """[d_model, vocab] float64: real-vocabulary W_U columns, doubly centered, unit norm."""
    w_u = _model(lm).unembed.W_U.detach().double().cpu().numpy()[:, : real_vocab(lm)]
    w_u = w_u - w_u.mean(axis=0, keepdims=True)  # over d_model, per token
    w_u = w_u - w_u.mean(axis=1, keepdims=True)  # over the vocabulary, per dimension
    norms = np.linalg.norm(w_u, axis=0, keepdims=True)
    return w_u / np.where(norms == 0, 1.0, norms)


def output_rows(lm: Any, layer: int) -> np.ndarray:
    """[neurons, d_model] float64: each neuron's output weight row. Under a mixture of experts a
    neuron is one hidden unit of one expert: expert 0's units first, then expert 1's, ..."""
    mlp = _model(lm).blocks[layer].mlp
    experts = getattr(mlp.original_component, "experts", None)
    if experts is not None:
        # transformers 5 stacks the experts' output projections in one parameter: expert e's
        # is down_proj[e], a Linear's [d_model, d_mlp] weight (or [d_mlp, d_model] where the
        # experts say `is_transposed`)
        rows = []
        for weight in experts.down_proj.detach().double().cpu().numpy():
            if not getattr(experts, "is_transposed", False):
                weight = weight.T
            for unit in range(weight.shape[0]):
                rows.append(weight[unit])
        return np.stack(rows)
    return mlp.W_out.detach().double().cpu().numpy()


def neuron_cosines(lm: Any, layer: int, u: np.ndarray) -> np.ndarray:
    """[neurons, vocab] float64: cosine of each centered output weight row with each
    direction."""
    w = output_rows(lm, layer)
    w = w - w.mean(axis=1, keepdims=True)
    norms = np.linalg.norm(w, axis=1, keepdims=True)
    return (w / np.where(norms == 0, 1.0, norms)) @ u


def neuron_moments(cos: np.ndarray) -> list[tuple[float, float, float, float]]:
    """Per row of [neurons, vocab]: population mean, variance, skew, non-excess kurtosis."""
    mean, var = np.mean(cos, axis=1), np.var(cos, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        skew = scipy.stats.skew(cos, axis=1, bias=True)
        kurt = scipy.stats.kurtosis(cos, axis=1, fisher=False, bias=True)
    return [(float(m), float(v), 0.0 if v == 0 else float(s), 0.0 if v == 0 else float(k))
            for m, v, s, k in zip(mean, var, skew, kurt, strict=True)]


def neuron_classes(moments: tuple[float, float, float, float]) -> dict[str, bool]:
    _, var, skew, kurt = moments
    return {"prediction": kurt > KURTOSIS_THRESHOLD and skew > 0,
            "suppression": kurt > KURTOSIS_THRESHOLD and skew < 0,
            "partition": var > PARTITION_VARIANCE}


# The width-calibrated classes' null (docs/metrics.md, neurons.*): NULL_DIRECTIONS standard
# normal rows of d_model from torch.Generator().manual_seed(NULL_SEED), processed as output rows.
NULL_DIRECTIONS, NULL_SEED, NULL_QUANTILE = 4096, 0, 0.999


def null_thresholds(lm: Any) -> tuple[float, float, float]:
    """The 99.9th percentiles (numpy's linear interpolation) of kurtosis, |skew| and variance
    of the random directions' cosines with the unembedding, from scipy moments in float64."""
    u = unembedding_directions(lm)
    gen = torch.Generator().manual_seed(NULL_SEED)
    raw = torch.randn(NULL_DIRECTIONS, u.shape[0], generator=gen).double().numpy()
    raw = raw - raw.mean(axis=1, keepdims=True)
    directions = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    moments: list[tuple[float, float, float, float]] = []
    for start in range(0, NULL_DIRECTIONS, 256):
        moments += neuron_moments(directions[start : start + 256] @ u)
    _, var, skew, kurt = np.array(moments).T
    return (float(np.quantile(kurt, NULL_QUANTILE)),
            float(np.quantile(np.abs(skew), NULL_QUANTILE)),
            float(np.quantile(var, NULL_QUANTILE)))


def calibrated_classes(moments: tuple[float, float, float, float],
                       null: tuple[float, float, float]) -> dict[str, bool]:
    _, var, skew, kurt = moments
    null_kurt, null_skew, null_var = null
    return {"prediction_cal": kurt > null_kurt and skew > null_skew,
            "suppression_cal": kurt > null_kurt and skew < -null_skew,
            "partition_cal": var > null_var}


def _all_neuron_moments(lm: Any) -> dict[int, list[tuple[float, float, float, float]]]:
    u = unembedding_directions(lm)
    return {layer: neuron_moments(neuron_cosines(lm, layer, u))
            for layer in range(_model(lm).cfg.n_layers)}


def neurons_rows(lm: Any, tokens: torch.Tensor | None = None,
                 opts: Any = None) -> list[dict[str, Any]]:
    model = _model(lm)
    if not _has_mlp(model):
        return []
    vocab = real_vocab(lm)
    d_mlp = output_rows(lm, 0).shape[0]
    null = null_thresholds(lm)
    rows = [_row(f"neurons.null_{name}_q999", value, NULL_DIRECTIONS)
            for name, value in zip(("kurt", "skew", "var"), null, strict=True)]
    for layer, per_neuron in _all_neuron_moments(lm).items():
        counts = {"prediction": 0, "suppression": 0, "partition": 0, "prediction_cal": 0,
                  "suppression_cal": 0, "partition_cal": 0}
        for neuron, moments in enumerate(per_neuron):
            for name, value in zip(("vocab_mean", "vocab_var", "vocab_skew", "vocab_kurt"),
                                   moments, strict=True):
                rows.append(_row(f"neurons.{name}", value, vocab, layer=layer, neuron=neuron))
            for cls, member in {**neuron_classes(moments),
                                **calibrated_classes(moments, null)}.items():
                counts[cls] += int(member)
        for cls, count in counts.items():
            rows.append(_row(f"neurons.n_{cls}", count, d_mlp, layer=layer))
            rows.append(_row(f"neurons.frac_{cls}", count / d_mlp, d_mlp, layer=layer))
    return rows


def _descending(moments: list[tuple[float, float, float, float]], which: int,
                neuron: int) -> float:
    return -moments[neuron][which]


def neuron_token_rows(lm: Any, opts: Any = None) -> list[dict[str, Any]]:
    """The top neurons of each class per layer and their top promoted / suppressed tokens.

    Neurons are ranked by kurtosis (prediction, suppression) or variance (partition), largest
    first; tokens by cosine. Returns dicts with the fields of `NeuronTokens` (no token strings).
    """
    opts = opts or ReferenceOptions()
    model = _model(lm)
    if not _has_mlp(model) or opts.top_neurons == 0:
        return []
    u = unembedding_directions(lm)
    out = []
    for layer, per_neuron in _all_neuron_moments(lm).items():
        layer_cos = neuron_cosines(lm, layer, u)
        for cls in ("prediction", "suppression", "partition"):
            members = [i for i, m in enumerate(per_neuron) if neuron_classes(m)[cls]]
            rank_by = 3 if cls != "partition" else 1  # kurtosis, or variance for partition
            members.sort(key=partial(_descending, per_neuron, rank_by))
            for neuron in members[: opts.top_neurons]:
                cos = layer_cos[neuron]
                k = min(opts.top_tokens, len(cos))
                for direction, order in (("promoted", np.argsort(-cos, kind="stable")),
                                         ("suppressed", np.argsort(cos, kind="stable"))):
                    for rank, token_id in enumerate(order[:k]):
                        out.append({"layer": layer, "neuron": neuron, "neuron_class": cls,
                                    "direction": direction, "rank": rank,
                                    "token_id": int(token_id), "cosine": float(cos[token_id])})
    return out


# --------------------------------------------------------------------------- similarity.*


def _component_names(model: Any) -> list[tuple[str, str]]:
    names = [("attn", "hook_attn_out")]
    if _has_mlp(model):
        names.append(("mlp", "hook_mlp_out"))
    return names


def similarity_rows(lm: Any, tokens: torch.Tensor, opts: Any = None) -> list[dict[str, Any]]:
    model = _model(lm)
    n_layers = model.cfg.n_layers
    swapped = {layer: swapped_model(model, layer) for layer in range(n_layers - 1)}
    per_token: dict[tuple[str, str, int], PerSequence] = {}
    for index, seq in enumerate(_sequences(tokens)):
        _, clean = model.run_with_cache(seq[None])
        for layer in range(n_layers - 1):
            _, moved = swapped[layer].run_with_cache(seq[None])
            for component, hook in _component_names(model):
                # In the swapped model, position `layer` holds block layer+1's weights.
                at_l = moved[f"blocks.{layer}.{hook}"][0].double().numpy()
                own_l = clean[f"blocks.{layer}.{hook}"][0].double().numpy()
                own_next = clean[f"blocks.{layer + 1}.{hook}"][0].double().numpy()
                for pos in range(1, len(seq) - 1):
                    for metric, a, b in (("self", at_l, own_next), ("index", at_l, own_l),
                                         ("adjacent", own_l, own_next)):
                        put(per_token, (metric, component, layer), index,
                            _cosine(a[pos], b[pos]))
    return [mean_row(f"similarity.{metric}", values, layer=layer, component=component)
            for (metric, component, layer), values in per_token.items()]


# --------------------------------------------------------------------------- attention.*


def _is_pattern(name: str) -> bool:
    return name.endswith("attn.hook_pattern")


def _row_entropy_bits(row: np.ndarray) -> float:
    return float(-sum(p * math.log(p) for p in row if p > 0) / LN2)


def attention_rows(lm: Any, tokens: torch.Tensor, opts: Any = None) -> list[dict[str, Any]]:
    opts = opts or ReferenceOptions()
    model = _model(lm)
    n_heads = model.cfg.n_heads
    seq_len = tokens.shape[1]
    ks = [k for k in opts.prev_ks if k <= seq_len - 3]
    per_head: dict[tuple[str, int, int | None], PerSequence] = {}
    for index, seq in enumerate(_sequences(tokens)):
        _, cache = model.run_with_cache(seq[None], names_filter=_is_pattern)
        for layer in range(model.cfg.n_layers):
            pattern = cache[f"blocks.{layer}.attn.hook_pattern"][0].double().numpy()
            for q in range(1, seq_len - 1):
                metrics: dict[str, list[float]] = {"bos": [], "entropy": []}
                for k in ks:
                    metrics[f"prev_{k}"] = []
                for h in range(n_heads):
                    row = pattern[h, q]
                    metrics["bos"].append(float(row[0]))
                    metrics["entropy"].append(_row_entropy_bits(row[: q + 1]))
                    for k in ks:
                        metrics[f"prev_{k}"].append(float(sum(row[q - j] for j in range(1, k + 1))))
                for metric, by_head in metrics.items():
                    if metric.startswith("prev_") and q <= int(metric.split("_")[1]):
                        continue
                    for h, value in enumerate(by_head):
                        put(per_head, (metric, layer, h), index, value)
                    put(per_head, (metric, layer, None), index, float(np.mean(by_head)))
    rows = []
    for (metric, layer, head), values in per_head.items():
        rows.append(mean_row(f"attention.{metric}", values, layer=layer, head=head))
        if metric.startswith("prev_"):
            k = int(metric.split("_")[1])
            rows.append(mean_row(f"attention.{metric}_mean",
                                 {i: [v / k for v in vs] for i, vs in values.items()},
                                 layer=layer, head=head))
    return rows


# --------------------------------------------------------------------------- norms.*


def norms_rows(lm: Any, tokens: torch.Tensor, opts: Any = None) -> list[dict[str, Any]]:
    model = _model(lm)
    per_token: dict[tuple[str, str | None, int], PerSequence] = {}
    for index, seq in enumerate(_sequences(tokens)):
        _, cache = model.run_with_cache(seq[None])
        for layer in range(model.cfg.n_layers):
            names = [("attn_out", "attn", f"blocks.{layer}.hook_attn_out"),
                     ("resid", None, f"blocks.{layer}.hook_resid_post")]
            if _has_mlp(model):
                names.append(("mlp_out", "mlp", f"blocks.{layer}.hook_mlp_out"))
            for metric, component, name in names:
                x = cache[name][0].double().numpy()
                for pos in range(1, len(seq) - 1):
                    put(per_token, (metric, component, layer), index,
                        float(np.sqrt(np.sum(x[pos] ** 2))))
    rows = [mean_row(f"norms.{metric}", values, layer=layer, component=component)
            for (metric, component, layer), values in per_token.items()]
    if _has_mlp(model):
        for layer in range(model.cfg.n_layers):
            attn = mean_row("norms.attn_out", per_token[("attn_out", "attn", layer)])
            mlp = mean_row("norms.mlp_out", per_token[("mlp_out", "mlp", layer)])
            if mlp["value"] > 0:  # a ratio of the two means: no stderr
                rows.append(_row("norms.attn_mlp_ratio", attn["value"] / mlp["value"],
                                 attn["n"], layer=layer))
    return rows


# --------------------------------------------------------------------------- heads.*


def head_ablation_rows(lm: Any, tokens: torch.Tensor, opts: Any = None) -> list[dict[str, Any]]:
    model = _model(lm)
    per_token: dict[tuple[str, int, int], PerSequence] = {}
    for index, seq in enumerate(_sequences(tokens)):
        for layer in range(model.cfg.n_layers):
            for head in range(model.cfg.n_heads):
                clean = _forward(model, seq)
                ablated = _forward(model, seq,
                                   [(f"blocks.{layer}.attn.hook_z", _zero_head_hook(head))])
                for s in compare_sequence(clean, ablated, seq):
                    put(per_token, ("ablation_kl", layer, head), index, s["kl"])
                    put(per_token, ("ablation_loss_delta", layer, head), index,
                        s["loss_q"] - s["loss_p"])
    return [mean_row(f"heads.{metric}", values, layer=layer, head=head)
            for (metric, layer, head), values in per_token.items()]


def induction_tokens(lm: Any, opts: Any) -> tuple[torch.Tensor, int]:
    """The seeded repeated random sequences (the engine's token generator) and n."""
    from compute.tokens import random_repeated_tokens  # the token draw, not a metric

    n = min(opts.induction_n, (int(_model(lm).cfg.n_ctx) - 1) // 2)
    tokens = random_repeated_tokens(opts.induction_sequences, n, real_vocab(lm), bos_id(lm),
                                    opts.induction_seed)
    return tokens, n


def induction_rows(lm: Any, opts: Any = None) -> list[dict[str, Any]]:
    opts = opts or ReferenceOptions()
    model = _model(lm)
    tokens, n = induction_tokens(lm, opts)
    per_item: dict[tuple[int, int], PerSequence] = {}
    for index, seq in enumerate(_sequences(tokens)):
        if not (len(seq) == 2 * n + 1 and bool((seq[1 : n + 1] == seq[n + 1 :]).all())):
            raise ValueError("induction tokens are not BOS, r_1..r_n, r_1..r_n")
        _, cache = model.run_with_cache(seq[None], names_filter=_is_pattern)
        for layer in range(model.cfg.n_layers):
            pattern = cache[f"blocks.{layer}.attn.hook_pattern"][0]
            for head in range(model.cfg.n_heads):
                for i in range(1, n):
                    # query: the second r_i (position n+i); key: the token after the first r_i
                    put(per_item, (layer, head), index, float(pattern[head, n + i, i + 1]))
    return [mean_row("heads.induction", values, layer=layer, head=head)
            for (layer, head), values in per_item.items()]


def heads_rows(lm: Any, tokens: torch.Tensor, opts: Any = None) -> list[dict[str, Any]]:
    return head_ablation_rows(lm, tokens, opts) + induction_rows(lm, opts)


# --------------------------------------------------------------------------- heads_atp.*


def heads_atp_rows(lm: Any, tokens: torch.Tensor, opts: Any = None) -> list[dict[str, Any]]:
    """AtP's first-order estimate of each head's zero-ablation loss delta, the obvious way: per
    sequence, a full TransformerLens forward whose embedding output is made a leaf that needs a
    gradient and whose `hook_z` outputs keep theirs; the summed float64 next-token loss over
    the evaluated positions, `backward()`; then per head -sum(z * z.grad) / (T-2)."""
    model = _model(lm)
    per_sequence: dict[tuple[int, int], PerSequence] = {}
    def leaf(x: torch.Tensor, hook: Any) -> torch.Tensor:
        return x.detach().requires_grad_()

    def keep(zs: dict[int, torch.Tensor], layer: int) -> Callable[..., torch.Tensor]:
        def hook_fn(z: torch.Tensor, hook: Any) -> torch.Tensor:
            z.retain_grad()
            zs[layer] = z
            return z  # the bridge carries on with what a hook returns (else with its own copy)
        return hook_fn

    for index, seq in enumerate(_sequences(tokens)):
        zs: dict[int, torch.Tensor] = {}
        hooks = [("hook_embed", leaf)] + [(f"blocks.{layer}.attn.hook_z", keep(zs, layer))
                                          for layer in range(model.cfg.n_layers)]
        with torch.enable_grad():
            logits = model.run_with_hooks(seq[None], return_type="logits", fwd_hooks=hooks)[0]
            log_probs = logits.double().log_softmax(-1)
            targets = seq[2:]
            loss = -log_probs[1:-1].gather(-1, targets[:, None]).sum()
            loss.backward()
        for layer, z in zs.items():
            assert z.grad is not None
            for head in range(model.cfg.n_heads):
                value = -(z[0, :, head] * z.grad[0, :, head]).double().sum() / (len(seq) - 2)
                put(per_sequence, (layer, head), index, float(value))
    return [mean_row("heads_atp.loss_delta", values, layer=layer, head=head)
            for (layer, head), values in per_sequence.items()]


# --------------------------------------------------------------------------- the sweep

FAMILY_FUNCTIONS: dict[str, Callable[[Any, torch.Tensor, Any], list[dict[str, Any]]]] = {
    "intervention": intervention_rows,
    "logit_lens": logit_lens_rows,
    "neurons": neurons_rows,
    "similarity": similarity_rows,
    "attention": attention_rows,
    "norms": norms_rows,
    "heads": heads_rows,
    "heads_atp": heads_atp_rows,
}


def reference_rows(lm: Any, tokens: torch.Tensor, families: Iterable[str],
                   opts: Any = None) -> list[dict[str, Any]]:
    """Every named family's rows as dicts (mean rows carry their per-sequence means)."""
    opts = opts or ReferenceOptions()
    rows: list[dict[str, Any]] = []
    with torch.no_grad():
        for family in dict.fromkeys(families):
            if family not in FAMILY_FUNCTIONS:
                raise ValueError(f"unknown family {family!r}; choose from {', '.join(FAMILIES)}")
            rows.extend(FAMILY_FUNCTIONS[family](lm, tokens, opts))
    return rows


def reference_sequence_means(lm: Any, tokens: torch.Tensor, families: Iterable[str],
                             opts: Any = None) -> pl.DataFrame:
    """The per-sequence means behind every per-layer mean (head None) of the named families."""
    return sequence_frame(reference_rows(lm, tokens, families, opts))


def reference_sweep(lm: Any, tokens: torch.Tensor, families: Iterable[str],
                    opts: Any = None) -> pl.DataFrame:
    """Every named family's rows, one long polars DataFrame with the record columns.

    `lm` is a `compute.models.LoadedModel` (only `lm.model`, a HookedTransformer, and
    `lm.tokenizer` are used); `tokens` is [n_sequences, seq_len] with BOS at position 0;
    `opts` is anything with the fields of `ReferenceOptions` (e.g. `EngineOptions`).
    """
    return to_frame(reference_rows(lm, tokens, families, opts))
