"""The training configuration of a tuned lens (`compute.lens.training` follows it), and where
lenses are kept.

Kept apart from the training code (light: no torch) so that `compute.metrics.base.EngineOptions`
can hold it without importing the engine, and the service can set the folder at start-up.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class LensTraining(BaseModel):
    """How a tuned lens is trained (part of the lens's key and of a run's identity when the run
    has the tuned_lens family). `lens` names a stored lens (an imported one) to use instead."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    steps: int = Field(250, ge=1, description="optimizer steps (the package: 250)")
    sequences_per_step: int = Field(8, ge=1, description="training sequences per step")
    train_sequences: int = Field(
        256, ge=1, description="training split: windows of the run's token source never evaluated"
    )
    lr: float = Field(1.0, gt=0, description="SGD learning rate, before the 1 - momentum factor")
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(1e-3, ge=0)
    warmup_steps: int = Field(0, ge=0, description="linear warm-up (the package: 0 for SGD)")
    clip_grad_norm: float = Field(1.0, gt=0)
    seed: int = 0
    lens: str | None = Field(
        None, description="key of a stored lens (e.g. imported) to evaluate instead of training"
    )


_lens_dir: Path | None = None


def set_lens_dir(path: Path) -> None:
    """Where lenses are kept (the service sets `<data_dir>/lenses`)."""
    global _lens_dir
    _lens_dir = Path(path)


def lens_dir() -> Path:
    return _lens_dir if _lens_dir is not None else Path(".strata") / "lenses"
