"""A tuned lens: one affine translator per lens point, and its safetensors file.

Point i (0..L-1: the embeddings, then the output of block i-1) is read as
unembed(h + h A_i^T + b_i), where unembed is the model's final norm (recomputed on that residual),
W_U and b_U (`LoadedModel.logits`). A_i and b_i start at zero, so an untrained lens is the raw
logit lens; point L, the final residual, has no translator. This is the tuned-lens package's
parametrisation (a `torch.nn.Linear` added residually), so its published lenses load as they are.

The file is safetensors: tensors `{i}.weight` ([d_model, d_model], `Linear`'s [out, in]) and
`{i}.bias` ([d_model]) for i = 0..L-1 — the key names of the package's `layer_translators`
state dict (a `layer_translators.` prefix is accepted too) — and, in the header's metadata, a
`strata` entry: the lens's identity as JSON (`LensInfo`). A file without it (one converted from
the package's `params.pt`) imports as a lens in the Hugging Face residual basis.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from compute.errors import LensError

METADATA_KEY = "strata"
FORMAT = "strata-tuned-lens/1"
# Where a lens's translators were fitted: Strata's processed residual stream (the run's
# processing applied), or the Hugging Face model's own hidden states (the tuned-lens package).
BASIS_STRATA = "strata"
BASIS_HUGGINGFACE = "huggingface"
_KEY = re.compile(r"^(?:layer_translators\.)?(\d+)\.(weight|bias)$")


@dataclass(frozen=True)
class LensInfo:
    """What a lens is: its key, what it was fitted on and how (stored in the file)."""

    key: str
    n_layers: int
    d_model: int
    basis: str
    model: dict[str, Any] = field(default_factory=dict)  # the ModelSpec it was trained for
    tokens: dict[str, Any] = field(default_factory=dict)  # the token source of its training split
    training: dict[str, Any] = field(default_factory=dict)  # LensTraining, or the import's origin
    report: dict[str, Any] = field(default_factory=dict)  # budget used, losses, wall time

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TunedLens:
    """Translators for points 0..L-1: `weight` [L, d, d] (A_i as [out, in]), `bias` [L, d]."""

    weight: Float[Tensor, "points d_out d_in"]
    bias: Float[Tensor, "points d_model"]
    info: LensInfo

    @classmethod
    def identity(cls, info: LensInfo) -> TunedLens:
        """Every translator zero (h -> h): the raw logit lens, where training starts."""
        d = info.d_model
        return cls(
            torch.zeros(info.n_layers, d, d, dtype=torch.float32),
            torch.zeros(info.n_layers, d, dtype=torch.float32),
            info,
        )

    @property
    def n_points(self) -> int:
        return int(self.weight.shape[0])

    def translate(
        self, point: int, resid: Float[Tensor, "... d_model"]
    ) -> Float[Tensor, "... d_model"]:
        """h + h A^T + b at a point below L, in float32, returned in the residual's dtype."""
        h = resid.float()
        w = self.weight[point].to(h.device)
        b = self.bias[point].to(h.device)
        return torch.addmm(b, h.reshape(-1, h.shape[-1]), w.T).view_as(h).add_(h).to(resid.dtype)

    def to(self, device: str) -> TunedLens:
        return TunedLens(self.weight.to(device), self.bias.to(device), self.info)

    # ---- the file
    def tensors(self) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        for i in range(self.n_points):
            out[f"{i}.weight"] = self.weight[i].detach().float().cpu().contiguous()
            out[f"{i}.bias"] = self.bias[i].detach().float().cpu().contiguous()
        return out

    def save(self, path: Path) -> None:
        """Write the safetensors file (atomically: a half-written lens is never read)."""
        from safetensors.torch import save_file

        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {METADATA_KEY: json.dumps({"format": FORMAT, **self.info.as_dict()})}
        tmp = path.with_name(f".{path.name}.tmp")
        save_file(self.tensors(), str(tmp), metadata=meta)
        tmp.replace(path)


def read_lens_file(path: Path) -> tuple[dict[str, Tensor], dict[str, Any] | None]:
    """The tensors of a safetensors lens file and its Strata metadata (None if it has none)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise LensError(f"lens file {path} does not exist")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise LensError(
            f"cannot read {path} as a safetensors lens ({exc}); a tuned-lens package lens "
            "(params.pt) is converted with safetensors.torch.save_file(torch.load(path))"
        ) from exc
    return tensors, read_lens_metadata(path)


def read_lens_metadata(path: Path) -> dict[str, Any] | None:
    """A lens file's Strata metadata (None if it has none), read from the safetensors header
    alone: what a submission checks without loading the translators."""
    if not path.is_file():
        raise LensError(f"lens file {path} does not exist")
    try:
        with path.open("rb") as fh:
            header_len = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(header_len))
    except (OSError, ValueError) as exc:
        raise LensError(f"cannot read {path}'s safetensors header ({exc})") from exc
    if not isinstance(header, dict):
        raise LensError(f"{path}: its safetensors header is not a JSON object")
    raw = (header.get("__metadata__") or {}).get(METADATA_KEY)
    if raw is None:
        return None
    try:
        meta = json.loads(raw)
    except ValueError as exc:
        raise LensError(f"{path}: its '{METADATA_KEY}' metadata is not JSON ({exc})") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise LensError(f"{path}: not a {FORMAT} file (metadata format {meta.get('format')!r})")
    return meta


def stack_translators(
    tensors: dict[str, Tensor], *, n_layers: int, d_model: int, what: str
) -> tuple[Tensor, Tensor]:
    """[L, d, d] weights and [L, d] biases from `{i}.weight` / `{i}.bias` tensors, checked
    against the model: exactly one weight and one bias for each point 0..L-1, of its width."""
    found: dict[tuple[int, str], Tensor] = {}
    for name, tensor in tensors.items():
        match = _KEY.match(name)
        if match is None:
            raise LensError(
                f"{what}: unexpected tensor {name!r}; a lens holds '<i>.weight' and '<i>.bias' "
                "for each point i (the tuned-lens package's layer_translators)"
            )
        found[(int(match.group(1)), match.group(2))] = tensor
    points = sorted({i for i, _ in found})
    if points != list(range(n_layers)):
        raise LensError(
            f"{what} has translators for {len(points)} points "
            f"({points[0] if points else '-'}..{points[-1] if points else '-'}) but the model has "
            f"{n_layers} layers: a lens has one translator per point 0..{n_layers - 1}"
        )
    weights, biases = [], []
    for i in points:
        w, b = found.get((i, "weight")), found.get((i, "bias"))
        if w is None or b is None:
            raise LensError(f"{what}: point {i} lacks its {'weight' if w is None else 'bias'}")
        if tuple(w.shape) != (d_model, d_model) or tuple(b.shape) != (d_model,):
            raise LensError(
                f"{what}: point {i} has weight {tuple(w.shape)} and bias {tuple(b.shape)}; "
                f"the model's d_model is {d_model} (expected ({d_model}, {d_model}) and "
                f"({d_model},))"
            )
        weights.append(w.float())
        biases.append(b.float())
    weight, bias = torch.stack(weights), torch.stack(biases)
    if not (torch.isfinite(weight).all() and torch.isfinite(bias).all()):
        raise LensError(f"{what} holds NaN or infinite values")
    return weight, bias
