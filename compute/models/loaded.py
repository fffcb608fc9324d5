"""The model layer: a processed TransformerLens bridge behind the few operations the metrics
are built from, and `load_model`, the one entry point to TransformerLens.

Everything else talks to a `LoadedModel`, which exposes exactly the operations the metrics need:
embed, run one block (optionally with a component or heads zeroed, optionally capturing the
attention pattern), unembed through the final norm, and the processed weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from compute import blocks
from compute.errors import ComputeError, ModelLoadError, StrataError
from compute.memory import (
    ModelDims,
    allocator_for_loading,
    block_bytes_per_sequence,
    check_fits,
    device_free_bytes,
    placement_needs,
    plan_devices,
)
from compute.models import layers, parity
from compute.models.bridge import BlockInputs, to_device, to_dtype
from compute.models.parity import ParityReport
from compute.models.processing import POST_NORM_ARCHITECTURES, AppliedProcessing
from compute.models.sources import SOURCES, SourceLoad
from compute.models.spec import TORCH_DTYPES, ModelSpec
from compute.models.split import module_names, place
from compute.placement import DeviceMemory, Placement, planned_bytes
from compute.zoo.paths import zoo_path

if TYPE_CHECKING:
    from compute.lens.translators import TunedLens


@dataclass
class BlockRun:
    """The result of running one block: its output residual and what it wrote."""

    resid: Float[Tensor, "batch pos d_model"]
    # the token mixer's write (attention's, or a mixer's without heads); None: no mixer
    attn_out: Float[Tensor, "batch pos d_model"] | None
    mlp_out: Float[Tensor, "batch pos d_model"] | None
    pattern: Float[Tensor, "batch head q k"] | None = None
    z: Float[Tensor, "batch pos head d_head"] | None = None


@dataclass
class LoadedModel:
    """A processed TransformerLens bridge plus the few operations the metrics are built from."""

    spec: ModelSpec
    model: Any
    tokenizer: Any
    applied: AppliedProcessing
    device: str
    parity: ParityReport | None = None
    # The tuned lens the `tuned_lens` family evaluates: set for one sweep by `using_lens`.
    tuned_lens: TunedLens | None = None
    _ctx: dict[str, Any] = field(default_factory=dict)

    @contextlib.contextmanager
    def using_lens(self, lens: TunedLens | None) -> Iterator[None]:
        """Read points through `lens` for the duration (a worker's cached model keeps none)."""
        before, self.tuned_lens = self.tuned_lens, lens.to(self.device) if lens else None
        try:
            yield
        finally:
            self.tuned_lens = before

    # ---- architecture numbers
    @property
    def cfg(self) -> Any:
        return self.model.cfg

    @property
    def n_layers(self) -> int:
        return int(self.cfg.n_layers)

    @property
    def n_heads(self) -> int:
        return int(self.cfg.n_heads)

    @property
    def d_model(self) -> int:
        return int(self.cfg.d_model)

    @property
    def d_mlp(self) -> int:
        """MLP width (under a mixture of experts, one expert's; of the first block with an
        MLP)."""
        first = self._first_mlp()
        if first is None:
            return 0
        down = self._fused_experts(first)
        return int(down.shape[1]) if down is not None else int(self.cfg.d_mlp or 0)

    @property
    def d_vocab(self) -> int:
        return int(self.cfg.d_vocab_out)

    @property
    def n_ctx(self) -> int:
        return int(self.cfg.n_ctx)

    @property
    def has_mlp(self) -> bool:
        """Whether any block has an MLP (`layers` says which)."""
        return self._first_mlp() is not None

    @property
    def layers(self) -> tuple[layers.BlockKind, ...]:
        """What each block has — its token mixer (attention or not), its MLP — and where its
        writes are read (`compute.models.layers`); built once, and on the bridge's blocks
        probed for what the families' shortcuts assume (the first block run, at a load the
        float32 parity forward, triggers it)."""
        if "layers" not in self._ctx:
            self._ctx["layers"] = layers.block_layout(self.model, self.architecture)
            if not self.fast_path:  # the fused blocks are additive and linear by construction
                try:
                    self._ctx["layers"] = layers.probed(self, self._ctx["layers"])
                except BaseException:
                    self._ctx.pop("layers", None)
                    raise
        kinds: tuple[layers.BlockKind, ...] = self._ctx["layers"]
        return kinds

    @property
    def refused_families(self) -> dict[str, str]:
        """The metric families refused on this architecture, with the reason
        (`compute.models.refusals.REFUSED_FAMILIES`)."""
        from compute.models.refusals import refused_families

        return refused_families(self.architecture)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The blocks whose attention heads Strata reads (the attention families run there)."""
        return tuple(layers.attention_layers(self.layers))

    def _first_mlp(self) -> int | None:
        if self.cfg.attn_only:
            return None
        return next((i for i, k in enumerate(self.layers) if k.mlp is not None), None)

    @property
    def d_vocab_real(self) -> int:
        """Vocabulary size without padding columns of W_U beyond the tokenizer's vocabulary."""
        if self.tokenizer is None:
            return self.d_vocab
        return min(self.d_vocab, len(self.tokenizer))

    @property
    def bos_token_id(self) -> int:
        tok = self.tokenizer
        for attr in ("bos_token_id", "eos_token_id"):
            value = getattr(tok, attr, None) if tok is not None else None
            if value is not None:
                return int(value)
        return 0

    @property
    def dtype_bytes(self) -> int:
        return int(next(self.model.parameters()).element_size())

    @property
    def n_params(self) -> int:
        return int(sum(p.numel() for p in self.model.parameters()))

    @property
    def architecture(self) -> str:
        """The Hugging Face architecture (`LlamaForCausalLM`, ...), or what Strata built natively
        (`planted`, `TransformerLensNative` for random weights)."""
        return str(self._ctx.get("architecture") or self.cfg.architecture)

    def describe(self) -> dict[str, Any]:
        """Architecture numbers and processing, as stored with a registered model."""
        return {
            "architecture": self.architecture,
            "n_layers": self.n_layers,
            "d_model": self.d_model,
            "n_heads": self.n_heads,
            "d_mlp": self.d_mlp,
            "d_vocab": self.d_vocab,
            "d_vocab_real": self.d_vocab_real,
            "n_ctx": self.n_ctx,
            "n_params": self.n_params,
            "normalization_type": self.cfg.normalization_type,
            "parallel_attn_mlp": bool(self.cfg.parallel_attn_mlp),
            "processing": self.applied.as_dict(),
            "n_experts": self.n_experts,
            "parity": self.parity.as_dict() if self.parity is not None else None,
            "blocks": [kind.describe() for kind in self.layers],
            "refused_families": self.refused_families,
        }

    # ---- forward pieces
    def embed(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        """Residual stream before block 0: the model's own embedding (token and positional
        embeddings, any scaling), up to the input of block 0."""
        return self.model(tokens, stop_at_layer=0)

    def run_block(
        self,
        layer: int,
        resid: Float[Tensor, "batch pos d_model"],
        *,
        zero_attn: bool = False,
        zero_mlp: bool = False,
        head_mask: Float[Tensor, "batch head"] | None = None,
        capture_pattern: bool = False,
        capture_z: bool = False,
    ) -> BlockRun:
        """Run block `layer` on `resid`.

        `zero_attn` / `zero_mlp` zero that component's residual write (biases included);
        `head_mask` multiplies each head's z (1 keeps, 0 ablates), row by row of the batch;
        `capture_z` returns each head's z (for ablations that subtract one head's write).
        Eligible architectures run the fused forward of `compute.blocks`; the rest run the
        bridge's block (the model's own module) with hooks.
        """
        if self.fast_path:
            return self._run_fast_block(
                layer,
                resid,
                zero_attn=zero_attn,
                zero_mlp=zero_mlp,
                head_mask=head_mask,
                capture_pattern=capture_pattern,
            )
        block = self.model.blocks[layer]
        kind = self.layers[layer]
        captured: dict[str, Tensor] = {}

        def attn_hook(out: Tensor, hook: Any) -> Tensor:
            captured["attn"] = torch.zeros_like(out) if zero_attn else out
            return captured["attn"]

        def mlp_hook(out: Tensor, hook: Any) -> Tensor:
            captured["mlp"] = torch.zeros_like(out) if zero_mlp else out
            return captured["mlp"]

        def pattern_hook(out: Tensor, hook: Any) -> None:
            captured["pattern"] = out

        def z_hook(z: Tensor, hook: Any) -> Tensor:
            if head_mask is not None:
                z = z * head_mask[:, None, :, None].to(z.dtype)
            captured["z"] = z
            # returned, so that the block carries on with this very tensor (a family that
            # differentiates with respect to z needs it in the graph)
            return z

        hooks: list[tuple[Any, Callable[..., Any]]] = []
        if kind.mixer_write is not None:
            hooks.append((kind.mixer_write, attn_hook))
        if kind.mlp_write is not None:
            hooks.append((kind.mlp_write, mlp_hook))
        capture_pattern = capture_pattern and kind.attention
        if capture_pattern and kind.pattern is not None:
            hooks.append((kind.pattern, pattern_hook))
        module_hooks = []
        if head_mask is not None or capture_z:
            if kind.heads is None:
                if head_mask is not None:
                    raise ModelLoadError(
                        f"{self.architecture}: block {layer} has no attention heads to ablate"
                    )
            elif kind.heads.hook_z is not None:
                hooks.append((kind.heads.hook_z, z_hook))
            else:
                module_hooks.append(_o_proj_z_hook(kind.heads, z_hook))
        kwargs = self._block_inputs.of(layer, resid)
        inner_attn = kind.attention_module
        if capture_pattern and isinstance(inner_attn, torch.nn.Module):
            # Adapters whose attention fires no hook_pattern (GPT-J, OPT): the weights the
            # model's own eager attention returns beside its output.
            def weights_hook(_m: Any, _i: Any, output: Any) -> None:
                if isinstance(output, tuple) and len(output) > 1:
                    w = output[1]
                    if isinstance(w, Tensor) and w.dim() == 4:
                        captured["weights"] = w

            module_hooks.append(inner_attn.register_forward_hook(weights_hook))
        try:
            with _lens_hooks(hooks):
                out = block(resid, **kwargs)
        finally:
            for handle in module_hooks:
                handle.remove()
        out = out[0] if isinstance(out, (tuple, list)) else out
        if capture_pattern and "pattern" not in captured:
            if "weights" not in captured:
                raise ModelLoadError(
                    f"{self.architecture}: block {layer}'s attention gives no pattern to read"
                )
            captured["pattern"] = captured["weights"]
        for name, point in (("attn", kind.mixer_write), ("mlp", kind.mlp_write)):
            if point is not None and name not in captured:
                raise ModelLoadError(
                    f"{self.architecture}: block {layer}'s {name} write was not seen by its hook"
                )
        return BlockRun(
            out,
            captured.get("attn"),
            captured.get("mlp"),
            captured.get("pattern"),
            captured.get("z"),
        )

    @property
    def _block_inputs(self) -> BlockInputs:
        if "block_inputs" not in self._ctx:
            self._ctx["block_inputs"] = BlockInputs(self.model)
        return self._ctx["block_inputs"]

    def _rope(self, layer: int, resid: Tensor) -> tuple[Tensor, Tensor] | None:
        if self.cfg.positional_embedding_type != "rotary":
            return None
        native = self._fast_weights(layer).native_rope
        if native is not None:
            t = int(resid.shape[1])
            return native[0][None, :t], native[1][None, :t]
        inputs = self._block_inputs.of(layer, resid)
        return inputs["position_embeddings"]

    def _run_fast_block(
        self,
        layer: int,
        resid: Tensor,
        *,
        zero_attn: bool,
        zero_mlp: bool,
        head_mask: Tensor | None,
        capture_pattern: bool,
        z_hook: Callable[[Tensor], Tensor] | None = None,
    ) -> BlockRun:
        fb = self._fast_weights(layer)
        attn_out, z, pattern = blocks.attention(
            fb,
            fb.ln1(resid),
            self._rope(layer, resid),
            head_mask=head_mask,
            capture_pattern=capture_pattern,
            z_hook=z_hook,
        )
        if zero_attn:
            attn_out = torch.zeros_like(attn_out)
        if fb.mlp is None or fb.ln2 is None:
            return BlockRun(resid + attn_out, attn_out, None, pattern, z)
        mlp_in = resid if fb.parallel else resid + attn_out
        mlp_out = blocks.mlp(fb, fb.ln2(mlp_in))
        if zero_mlp:
            mlp_out = torch.zeros_like(mlp_out)
        out = resid + attn_out + mlp_out if fb.parallel else mlp_in + mlp_out
        return BlockRun(out, attn_out, mlp_out, pattern, z)

    def run_mlp(
        self, layer: int, resid: Float[Tensor, "batch pos d_model"]
    ) -> Float[Tensor, "batch pos d_model"]:
        """Block `layer`'s MLP write given the residual it reads (resid_mid, or resid_pre for
        parallel attention/MLP): its norm, the MLP and whatever the block applies after it.
        On the bridge's blocks: the block run on `resid` with its attention write zeroed, so
        the MLP reads `resid` itself, whatever the block's arrangement of norms."""
        if self.fast_path:
            fb = self._fast_weights(layer)
            assert fb.ln2 is not None
            return blocks.mlp(fb, fb.ln2(resid))
        run = self.run_block(layer, resid, zero_attn=True)
        if run.mlp_out is None:
            raise ModelLoadError(f"{self.architecture}: block {layer} has no MLP write")
        return run.mlp_out

    def head_writes(
        self, layer: int, z: Float[Tensor, "batch pos head d_head"], heads: list[int]
    ) -> Float[Tensor, "group batch pos d_model"]:
        """What each of `heads` adds to the residual stream (its z through its rows of W_O).

        The attention write is b_O plus the sum of these over heads, so zeroing one head's z
        changes the write by exactly minus its term (where `head_writes_are_linear`).
        """
        # A contiguous group is a slice: indexing with a list would copy it to the device
        # and wait there.
        pick: slice | list[int] = heads
        if heads == list(range(heads[0], heads[-1] + 1)):
            pick = slice(heads[0], heads[-1] + 1)
        w_o = self._w_o(layer)[pick]  # [g, d_head, d_model]
        return torch.einsum("bphk,hkd->hbpd", z[:, :, pick], w_o)

    def _w_o(self, layer: int) -> Tensor:
        if self.fast_path:
            fb = self._fast_weights(layer)
            return fb.w_o.view(fb.n_heads, fb.d_head, -1)
        kind = self.layers[layer]
        if kind.heads is None:
            raise ModelLoadError(f"{self.architecture}: block {layer} has no attention heads")
        return kind.heads.w_o(kind.attn)

    def head_writes_are_linear(self, layer: int) -> bool:
        """True when block `layer`'s attention write is b_O plus the sum over heads of
        z_h W_O[h] and its output is its input plus its writes: no norm between the output
        projection and the residual stream, as the probe of `layers` measured it too."""
        if self.fast_path:
            return True
        kind = self.layers[layer]
        structural = not (self.post_norm or blocks.has_post_sublayer_norms(self.model))
        return structural and kind.additive and kind.heads_linear

    @property
    def post_norm(self) -> bool:
        """Whether each sublayer's output is normalised before it is added to the residual
        stream (OLMo 2/3), instead of its input."""
        return self.architecture in POST_NORM_ARCHITECTURES

    @property
    def parallel(self) -> bool:
        return bool(self.cfg.parallel_attn_mlp)

    @property
    def fast_path(self) -> bool:
        """Whether every block runs the fused forward of `compute.blocks` (decided once)."""
        if "fast_path" not in self._ctx:
            refusal = blocks.fast_path_refusal(self.model)
            self._ctx["fast_path"] = refusal is None
            self._ctx["fast_path_refusal"] = refusal
        return bool(self._ctx["fast_path"])

    @property
    def block_path(self) -> str:
        """Which forward the blocks take: "fast" (fused) or "bridge" (the model's own)."""
        return "fast" if self.fast_path else "bridge"

    def _fast_weights(self, layer: int) -> blocks.FastBlock:
        cache = self._ctx.setdefault("fast_weights", {})
        if layer not in cache:
            # Normal tensors, not inference tensors, whatever mode the first caller runs in:
            # a family that differentiates through the blocks (heads_atp) saves them for
            # backward, which inference tensors refuse.
            with torch.inference_mode(False), torch.no_grad():
                cache[layer] = blocks.fast_block(self.model, layer)
        return cache[layer]

    def logits(self, resid: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_vocab"]:
        """Final norm (recomputed on this residual), W_U, b_U and any logit soft-cap: the
        model's own unembedding."""
        x = self.normed(resid)
        flat = x.reshape(-1, x.shape[-1])
        return self.logit_columns(flat, 0, self.d_vocab).view(*x.shape[:-1], self.d_vocab)

    def normed(self, resid: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        """The final norm of a residual (identity for models without one)."""
        if self.fast_path:
            if "final_norm" not in self._ctx:
                with torch.inference_mode(False), torch.no_grad():
                    self._ctx["final_norm"] = blocks.final_norm(self.model)
            return self._ctx["final_norm"](resid)
        final = self.model._modules.get("ln_final")
        x = resid if final is None else final(resid)
        # a prediction head the adapter maps between the final norm and the unembedding
        # (ModernBERT's decoder: dense, activation, LayerNorm) is part of reading a residual
        head = self.model._modules.get("prediction_head")
        return x if head is None else head(x)

    def _unembed(self) -> tuple[Tensor, Tensor]:
        """W_U [d_model, d_vocab] as stored (a view, no copy) and b_U (zeros where none)."""
        if "unembed" not in self._ctx:
            with torch.inference_mode(False), torch.no_grad():
                self._ctx["unembed"] = self._unembed_weights()
        return self._ctx["unembed"]

    def _unembed_weights(self) -> tuple[Tensor, Tensor]:
        w_u = self.model.unembed.W_U.detach()
        b_u = self.model.unembed.b_U
        if b_u is None:
            b_u = torch.zeros(w_u.shape[1], dtype=w_u.dtype, device=w_u.device)
        return w_u, b_u.detach()

    def logit_columns(
        self, x: Float[Tensor, "n d_model"], start: int, stop: int
    ) -> Float[Tensor, "n cols"]:
        """Logits of vocabulary columns start..stop-1 of a normed residual: one `addmm` on a
        column range of W_U as stored ([d_model, vocab]; BLAS reads it in place, no copy)."""
        w_u, b_u = self._unembed()
        logits = torch.addmm(b_u[start:stop], x, w_u[:, start:stop])
        # The architecture's own transform after the unembedding: a soft-cap, a logit scale
        # (Granite, Cohere), elementwise, so column blocks may be transformed one at a time.
        return self.model.adapter.apply_output_logits_transform(logits)

    @property
    def logits_are_linear(self) -> bool:
        """Whether logits are x W_U + b_U to float32 rounding: no soft-cap, and float32
        weights, whose logits are not rounded to a narrower dtype (nor computed in a wider one
        than P's float32 p). The reference distribution is then kept as W_U p
        (`compute.reduce.Reference`)."""
        from transformer_lens.model_bridge.architecture_adapter import ArchitectureAdapter

        cap = self.cfg.output_logits_soft_cap
        plain = (
            type(self.model.adapter).apply_output_logits_transform
            is ArchitectureAdapter.apply_output_logits_transform
        )
        return (
            self._unembed()[0].dtype == torch.float32
            and plain
            and not (cap is not None and cap > 0)
        )

    def pulled_back(self, p: Tensor, start: int, stop: int) -> tuple[Tensor, Tensor]:
        """(W_U[:, start:stop] p, b_U[start:stop] . p) for weights p [n, stop-start]: what
        `logit_columns` gives, read backwards (the reference's p.z for any residual)."""
        w_u, b_u = self._unembed()
        return p @ w_u[:, start:stop].T, p @ b_u[start:stop]

    def forget_derived_weights(self) -> None:
        """Drop copies derived from the weights (fused attention matrices, the unembedding's
        views, the captured block inputs), e.g. after editing weights in place or casting."""
        for key in ("fast_weights", "unembed", "final_norm", "block_inputs"):
            self._ctx.pop(key, None)

    # ---- processed weights
    def _fused_experts(self, layer: int) -> Tensor | None:
        """Block `layer`'s experts' output rows, [n_experts, d_expert, d_model] (transformers
        5's stacked `down_proj`, `compute.models.layers`); None for a dense MLP or none."""
        mlp = self.layers[layer].mlp_module
        return layers.fused_experts(mlp) if mlp is not None else None

    @property
    def n_experts(self) -> int:
        """Experts per MLP layer (1 for a dense MLP)."""
        for layer, kind in enumerate(self.layers):
            down = self._fused_experts(layer) if kind.mlp == "experts" else None
            if down is not None:
                return int(down.shape[0])
        return int(getattr(self.cfg, "num_experts", None) or 1)

    @property
    def n_neurons(self) -> int:
        """Neurons per MLP layer, the most of any layer: d_mlp, or every expert's d_mlp hidden
        units under a mixture of experts (neuron = expert * d_mlp + unit; models whose first
        layers are dense have fewer there)."""
        if not self.has_mlp:
            return 0
        if "n_neurons" not in self._ctx:
            self._ctx["n_neurons"] = max(
                int(self.w_out(layer).shape[0]) for layer in self.mlp_layers
            )
        return int(self._ctx["n_neurons"])

    @property
    def mlp_layers(self) -> tuple[int, ...]:
        """The blocks with an MLP (dense or experts)."""
        return tuple(i for i, kind in enumerate(self.layers) if kind.mlp is not None)

    def w_out(self, layer: int) -> Float[Tensor, "n_neurons d_model"]:
        """Each neuron's output row of block `layer`'s MLP. Under a mixture of experts the
        experts' rows are stacked in expert order (TransformerLens keeps an expert's W_out as
        a Linear's [d_model, d_mlp] weight)."""
        return layers.w_out(self.layers[layer])

    def w_u(self) -> Float[Tensor, "d_model d_vocab"]:
        return self.model.unembed.W_U.detach()

    def token_strings(self, ids: list[int]) -> list[str]:
        if self.tokenizer is None:
            return [f"<{i}>" for i in ids]
        return [self.tokenizer.decode([i]) for i in ids]


@dataclass
class SplitModel(LoadedModel):
    """A model split over devices (`compute.placement`). `device` is the home device: the
    embedding, the final norm and the unembedding are there, and so is everything the engine
    keeps. Each block runs on the device that holds its weights, its input moved there and what
    it returns moved back to where its input was; its MLP, its heads' rows of W_O and its
    neurons' output rows likewise. A model on one device is a plain `LoadedModel`, which moves
    nothing."""

    placement: Placement = field(kw_only=True)

    def block_device(self, layer: int) -> torch.device:
        """The device that holds block `layer`'s weights, where it runs."""
        if "block_devices" not in self._ctx:
            self._ctx["block_devices"] = tuple(torch.device(d) for d in self.placement.blocks)
        return self._ctx["block_devices"][layer]

    def run_block(
        self,
        layer: int,
        resid: Float[Tensor, "batch pos d_model"],
        *,
        zero_attn: bool = False,
        zero_mlp: bool = False,
        head_mask: Float[Tensor, "batch head"] | None = None,
        capture_pattern: bool = False,
        capture_z: bool = False,
    ) -> BlockRun:
        """`LoadedModel.run_block` on the block's device, its results on `resid`'s. Under
        autograd a captured z is moved back inside the block, and the block goes on from the
        moved copy (copied to its device again): a gradient with respect to the z returned is
        then the block's own (the head screen takes one)."""
        device, back = self.block_device(layer), resid.device
        x = resid.to(device)
        mask = head_mask.to(device) if head_mask is not None else None
        home_z: list[Tensor] = []
        if capture_z and torch.is_grad_enabled():

            def rehome(z: Tensor, hook: Any = None) -> Tensor:
                if mask is not None:
                    z = z * mask[:, None, :, None].to(z.dtype)
                home_z.append(z.to(back))
                return home_z[-1].to(device)

            if self.fast_path:
                run = self._run_fast_block(
                    layer,
                    x,
                    zero_attn=zero_attn,
                    zero_mlp=zero_mlp,
                    head_mask=None,
                    capture_pattern=capture_pattern,
                    z_hook=rehome,
                )
            else:
                # z where the block's layout reads it: TransformerLens's hook_z, or the input of
                # the attention's own o_proj split into its heads (multi-head latent attention)
                heads = self.layers[layer].heads
                if heads is None:
                    raise ComputeError(
                        f"{self.architecture}: block {layer} has no heads, so a gradient "
                        "with respect to its z cannot cross the devices the model is split over"
                    )
                at_z = (
                    _lens_hooks([(heads.hook_z, rehome)])
                    if heads.hook_z is not None
                    else _o_proj_hooked(heads, rehome)
                )
                with at_z:
                    run = super().run_block(
                        layer,
                        x,
                        zero_attn=zero_attn,
                        zero_mlp=zero_mlp,
                        capture_pattern=capture_pattern,
                        capture_z=True,
                    )
        else:
            run = super().run_block(
                layer,
                x,
                zero_attn=zero_attn,
                zero_mlp=zero_mlp,
                head_mask=mask,
                capture_pattern=capture_pattern,
                capture_z=capture_z,
            )
        z = home_z[-1] if home_z else run.z
        moved = (run.resid, run.attn_out, run.mlp_out, run.pattern, z)
        return BlockRun(*(to_device(t, back) for t in moved))

    def run_mlp(
        self, layer: int, resid: Float[Tensor, "batch pos d_model"]
    ) -> Float[Tensor, "batch pos d_model"]:
        if not self.fast_path:  # through `run_block`, which moves
            return super().run_mlp(layer, resid)
        return super().run_mlp(layer, resid.to(self.block_device(layer))).to(resid.device)

    def _w_o(self, layer: int) -> Tensor:
        return super()._w_o(layer).to(self.device)

    def w_out(self, layer: int) -> Float[Tensor, "n_neurons d_model"]:
        return super().w_out(layer).to(self.device)

    def sequences_beside_blocks(self, seq_len: int, *, patterns: bool, z: bool) -> int:
        """The most sequences a batch may have for each device of blocks to hold a block's
        working set for all of them (`compute.memory.block_bytes_per_sequence`) in 85% of its
        free memory: a split model's batch is bounded there as well as at home."""
        per_sequence = block_bytes_per_sequence(
            ModelDims.of(self), seq_len, self.dtype_bytes, patterns=patterns, z=z
        )
        elsewhere = [d for d in self.placement.devices if d != self.placement.home]
        return max(1, min(int(0.85 * device_free_bytes(d)) // per_sequence for d in elsewhere))

    @property
    def _block_inputs(self) -> BlockInputs:
        if "block_inputs" not in self._ctx:
            devices = tuple(self.block_device(i) for i in range(self.n_layers))
            split = (torch.device(self.device), devices)
            self._ctx["block_inputs"] = BlockInputs(self.model, split=split)
        return self._ctx["block_inputs"]


@contextlib.contextmanager
def _lens_hooks(hooks: list[tuple[Any, Callable[..., Any]]]) -> Iterator[None]:
    """TransformerLens hooks (`fn(activation, hook)`, returning a replacement or None) on hook
    points for the duration: through the hook point's own `add_hook`, which hands the function
    the activation in TransformerLens's layout (z as [batch, pos, head, d_head])."""
    from transformer_lens.hook_points import HookPoint

    added = [(point, point.add_hook(fn)) for point, fn in hooks if isinstance(point, HookPoint)]
    # a Hugging Face module of a block the bridge runs whole (`layers.OPAQUE_BLOCKS`): the
    # same function on its output, or on the first element of a tuple output
    modules = [
        point.register_forward_hook(_on_output(fn))
        for point, fn in hooks
        if not isinstance(point, HookPoint)
    ]
    try:
        yield
    finally:
        for point, handle in added:
            handle.hook.remove()
            if handle in point.fwd_hooks:
                point.fwd_hooks.remove(handle)
        for module_handle in modules:
            module_handle.remove()


def _on_output(fn: Callable[..., Any]) -> Callable[..., Any]:
    def hook(_module: Any, _inputs: Any, output: Any) -> Any:
        first = output[0] if isinstance(output, tuple) else output
        new = fn(first, None)
        if new is None:
            return None
        return (new, *output[1:]) if isinstance(output, tuple) else new

    return hook


@contextlib.contextmanager
def _o_proj_hooked(heads: layers.Heads, fn: Callable[..., Tensor]) -> Iterator[None]:
    """`_o_proj_z_hook` for the duration."""
    handle = _o_proj_z_hook(heads, fn)
    try:
        yield
    finally:
        handle.remove()


def _o_proj_z_hook(heads: layers.Heads, fn: Callable[..., Tensor]) -> Any:
    """`fn(z, hook)` on the input of an attention's own output projection, split into its
    heads ([batch, pos, n_heads * d_head] as [batch, pos, n_heads, d_head]); what it returns
    goes on into the projection. The hook's handle."""

    def pre(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        flat = args[0]
        z = fn(flat.unflatten(-1, (heads.n_heads, heads.d_head)), None)
        return (z.flatten(-2), *args[1:])

    return heads.o_proj.register_forward_pre_hook(pre)


def load_model(
    spec: ModelSpec, device: str = "cpu", *, devices: Sequence[DeviceMemory] | None = None
) -> LoadedModel:
    """Load and process the weights a spec names. The one entry point to TransformerLens.

    A model that `device` does not hold but the devices a run on it may use do together
    (`compute.memory.plan_devices`: for `cuda`, every GPU the process sees) is split over
    them: a `SplitModel`, its placement in its parity report. `devices` places the model over
    those instead (with their free bytes): the tests split models over CPU "devices" so."""
    allocator_for_loading()
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} requested but CUDA is not available here")
    dims = _dims_before_loading(spec)
    placement = None
    if dims is not None:  # refuse what will not fit before loading anything
        placement = check_fits(dims, spec.dtype, device, name=spec.name, devices=devices)
    split = placement is not None and placement.split
    source = SOURCES[spec.source]
    try:
        # a model to split is built on the host: no one device holds it
        loaded = source.load(spec, "cpu" if split else device)
    except StrataError:
        raise
    except Exception as exc:  # a loader's own error (corrupt weights, ...): one type for callers
        raise ModelLoadError(
            f"{spec.name} could not be loaded: {type(exc).__name__}: {exc}"
        ) from exc
    lm = _measured(spec, loaded, device, placement, devices)
    parity.check(lm.parity or parity.no_reference(lm, ""), spec.name, lm.architecture)
    return lm


def _measured(
    spec: ModelSpec,
    loaded: SourceLoad,
    device: str,
    placement: Placement | None = None,
    devices: Sequence[DeviceMemory] | None = None,
) -> LoadedModel:
    """The loaded model on its device (or split over its devices: `placement`) and dtype,
    with its parity report: measured in float32 against the Hugging Face reference, then (at
    another dtype) the noise floor."""
    model = loaded.model
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    lm = LoadedModel(spec, model, loaded.tokenizer, loaded.applied, device)
    if loaded.architecture:
        lm._ctx["architecture"] = loaded.architecture
    reference = loaded.reference
    if reference is None:
        lm.parity = parity.no_reference(lm, loaded.no_reference)
        if placement is not None and placement.split:  # built on the host, at the run's dtype
            tokens = parity.parity_tokens(lm.d_vocab_real, lm.bos_token_id, lm.n_ctx)
            host = parity.strata_log_probs(lm, tokens)
            lm = _split(lm, placement)
            _record_split(lm, host, parity.strata_log_probs(lm, tokens))
        return lm
    if not bool(torch.isfinite(reference.log_probs).all()):
        # The weights themselves are broken (the original model's own forward is NaN or
        # infinite): nothing to compare, and the run fails on its first non-finite number.
        lm.parity = parity.no_reference(
            lm, "the Hugging Face model's own forward is not finite: its weights are broken"
        )
        _place_for_run(spec, model, device)
        return lm
    lm.device = "cpu"
    diff, kl, float32_log_probs = parity.float32_parity(lm, reference)
    lm.device = device
    if placement is None and (device.startswith("cuda") or devices is not None):
        # dimensions known only now (a hub name, a GGUF file): planned on the built model
        placement = plan_devices(
            ModelDims.of(lm), spec.dtype, device, name=spec.name, devices=devices
        )
    if placement is not None and placement.split:
        lm = _split(lm, placement)
    else:
        _place_for_run(spec, model, device)
    lm.forget_derived_weights()
    floor = floor_diff = None
    run_log_probs = None
    if spec.dtype != "float32" or lm.device != "cpu" or isinstance(lm, SplitModel):
        run_log_probs = parity.strata_log_probs(lm, reference.tokens)
        if spec.dtype != "float32":
            floor = parity.mean_kl(float32_log_probs, run_log_probs)
            floor_diff = float((run_log_probs - reference.log_probs).abs().max())
    lm.parity = parity.ParityReport(
        "huggingface",
        spec.dtype,
        parity.PARITY_TOLERANCE,
        int(reference.tokens.numel()),
        parity.block_paths(lm),
        diff,
        kl,
        noise_floor_kl=floor,
        noise_floor_max_abs_logprob_diff=floor_diff,
    )
    if isinstance(lm, SplitModel) and run_log_probs is not None:
        # against the host's float32 forward: the split's own difference in a float32 run
        _record_split(lm, float32_log_probs if spec.dtype == "float32" else None, run_log_probs)
    return lm


def _split(lm: LoadedModel, placement: Placement) -> SplitModel:
    """`lm`, built on the host, placed over the devices of `placement` at the run's dtype."""
    place(lm.model, placement, TORCH_DTYPES[lm.spec.dtype])
    kept = {f.name: getattr(lm, f.name) for f in fields(lm) if f.init}
    split = SplitModel(**{**kept, "device": placement.home}, placement=placement)
    split.forget_derived_weights()
    return split


def _record_split(lm: SplitModel, host: Tensor | None, placed: Tensor) -> None:
    """The placement in the parity report, with the largest |Δ log p| of the split model's
    forward against the same weights' on the host (None where the host's was another dtype)."""
    needs = placement_needs(ModelDims.of(lm), lm.spec.dtype)
    blocks, home = module_names(lm.model)
    record = {
        **lm.placement.as_dict(),
        "device_map": lm.placement.device_map(blocks, home),
        "max_memory": planned_bytes(lm.placement, needs),
        "max_abs_logprob_diff_to_host": (
            None if host is None else float((placed - host).abs().max())
        ),
    }
    if lm.parity is not None:
        lm.parity = replace(lm.parity, placement=record)


def _place_for_run(spec: ModelSpec, model: Any, device: str) -> None:
    """Move a model built in float32 on the host to the run's device and dtype."""
    if device != "cpu":
        model.to(device, print_details=False)
    if spec.dtype != "float32":
        to_dtype(model, TORCH_DTYPES[spec.dtype])


def _dims_before_loading(spec: ModelSpec) -> ModelDims | None:
    """The model's dimensions from its config alone (None where that needs the network)."""
    if spec.source == "random" and spec.architecture is not None:
        try:
            return ModelDims.from_tl_config(spec.architecture)
        except (KeyError, TypeError, ValueError):
            return None
    if spec.source in ("zoo", "hf_dir"):
        path = zoo_path(spec.name) if spec.source == "zoo" else Path(spec.name)
        return ModelDims.from_hf_config(path)
    return None  # a GGUF file's dimensions are checked once its checkpoint exists (hf_dir)
