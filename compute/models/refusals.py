"""What Strata refuses to load, and why: one entry per architecture or mechanism, read from a
checkpoint's config alone (no weights, no heavy imports), so a refusal is fast and names its
cause.

A checkpoint is loaded only if
1. its architecture is a causal language model's head (`...ForCausalLM`, `...LMHeadModel`):
   Strata's metrics read next-token predictions;
2. TransformerLens's installed version has an adapter for it (`supported_architectures`);
3. no entry of `REFUSED` matches it. Each entry names a mechanism that the bridge's hook points
   cannot take apart the way Strata's families need, found by the architecture matrix
   (`compute/zoo/architectures.py`), which holds everything else to the Hugging Face forward.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from compute.models.bridge import supported_architectures

_CAUSAL_HEADS = ("ForCausalLM", "LMHeadModel")


@dataclass(frozen=True)
class Refusal:
    """An architecture (or a mechanism within one) Strata will not run, and why."""

    architecture: str
    reason: str
    # None: every checkpoint of the architecture; else only configs it returns True for
    applies: Callable[[Mapping[str, Any]], bool] | None = None


REFUSED: tuple[Refusal, ...] = ()


def refusal_of(architecture: str, config: Mapping[str, Any]) -> str | None:
    """Why Strata refuses a checkpoint of `architecture` with config.json `config` (None:
    it does not)."""
    if not architecture.endswith(_CAUSAL_HEADS):
        return (
            "not a causal language model (Strata measures next-token predictions; it loads "
            "architectures whose head is ...ForCausalLM or ...LMHeadModel)"
        )
    if architecture not in supported_architectures():
        from importlib.metadata import version

        return (
            f"TransformerLens {version('transformer-lens')} has no adapter for this "
            "architecture, so it cannot be hooked"
        )
    for entry in REFUSED:
        if entry.architecture == architecture and (entry.applies is None or entry.applies(config)):
            return entry.reason
    return None
