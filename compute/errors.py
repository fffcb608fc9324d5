"""The exception tree of `compute`.

Every error that a user can cause is raised as one of these, with a message that says what to
fix. The CLI maps them to exit codes, the service to HTTP statuses; nothing else catches them.

    StrataError
    ├── SpecError                 a model, token or run specification is invalid
    │   ├── UnknownModelError     no source recognises the model reference
    │   ├── UnknownMetricError    a metric family that is not registered
    │   ├── TokenSpecError        unreadable tokens, ids out of range, seq_len > n_ctx, ...
    │   ├── ModelTooLargeError    the model (estimated from its config) will not fit the device
    │   └── LensError             a tuned lens that cannot be read, does not fit the model, or
    │                             cannot be trained on the run's token source
    ├── ModelLoadError            the source was recognised but loading failed
    │   └── UnsupportedArchitectureError  a mechanism Strata cannot run exactly (named)
    │       └── ParityError       Strata's forward differs from Hugging Face's beyond tolerance
    └── ComputeError              the computation itself failed (NaN/inf, shape mismatch)
"""

from __future__ import annotations


class StrataError(Exception):
    """Root of every error Strata raises on purpose."""


class SpecError(StrataError, ValueError):
    """A specification (model, tokens, run options) is invalid."""


class UnknownModelError(SpecError):
    """No model source recognises the reference."""


class UnknownMetricError(SpecError):
    """A metric family that is not in the registry."""


class TokenSpecError(SpecError):
    """Tokens cannot be produced or do not fit the model."""


class ModelTooLargeError(SpecError):
    """The memory a model needs, estimated from its config before loading, exceeds what the
    device (or host) has."""


class LensError(SpecError):
    """A tuned lens file that cannot be read or does not match the model, or a token source
    that has no training split for one."""


class ModelLoadError(StrataError):
    """A recognised model could not be loaded."""


class UnsupportedArchitectureError(ModelLoadError):
    """The checkpoint's architecture has a mechanism that Strata cannot run exactly; the message
    names the architecture and the mechanism. Refused at registration and at compute."""


class ParityError(UnsupportedArchitectureError):
    """Strata's clean forward of this model differs from the Hugging Face forward by more than
    the parity tolerance: it would measure another model. `report` is the parity report
    (`compute.models.parity.ParityReport.as_dict()`)."""

    def __init__(self, message: str, report: dict[str, object] | None = None) -> None:
        super().__init__(message)
        self.report = report or {}


class ComputeError(StrataError):
    """The computation produced an invalid result (NaN, inf, shape mismatch)."""
