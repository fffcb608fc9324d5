"""What identifies the weights a run analyses: `ModelSpec`, stored with every run, with the
weight processing it asks for and the dtype it runs in.

A user's reference (`zoo:tiny-4l-s0`, a checkpoint folder, a GGUF file, a TransformerLens name)
becomes a spec through the source registry (`compute.models.sources.resolve_model_spec`).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

DType = Literal["float32", "bfloat16", "float16"]
TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


class Processing(BaseModel):
    """TransformerLens weight processing requested for a run (docs/metrics.md, shared
    conventions)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    fold_ln: bool = True
    center_writing_weights: bool = True
    center_unembed: bool = True
    fold_value_biases: bool = True

    @classmethod
    def none(cls) -> Processing:
        """No processing at all (`--no-processing`): the weights as the checkpoint has them."""
        return cls(
            fold_ln=False,
            center_writing_weights=False,
            center_unembed=False,
            fold_value_biases=False,
        )


class ModelSpec(BaseModel):
    """Everything that identifies the weights a run analyses. Stored with every run."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    source: Literal["zoo", "hf_dir", "gguf", "transformer_lens", "random"]
    name: str
    revision: str | None = None
    # Only for weights read from a quantized file (source="gguf"): its quantization type, e.g.
    # "Q4_1". Left out of the identity when None, so specs from before it keep their hashes.
    quantization: str | None = Field(default=None, exclude_if=lambda v: v is None)
    dtype: DType = "float32"
    processing: Processing = Processing()
    # Only for source="random": HookedTransformer config fields (TransformerLens 4's native
    # model) and the init seed.
    architecture: dict[str, Any] | None = None
    seed: int | None = None
