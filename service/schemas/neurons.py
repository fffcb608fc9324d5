"""Neurons: the top of a class per layer, with their tokens; and class counts per layer."""

from __future__ import annotations

import msgspec

from service.schemas.common import ModelRef, RunRef


class NeuronRow(msgspec.Struct):
    layer: int
    neuron: int
    relative_depth: float | None
    vocab_mean: float
    vocab_var: float
    vocab_skew: float
    vocab_kurt: float
    n: int
    prediction: bool
    suppression: bool
    partition: bool
    promoted: list[str] | None
    promoted_ids: list[int] | None
    suppressed: list[str] | None
    suppressed_ids: list[int] | None


class Neurons(msgspec.Struct):
    model: ModelRef
    run: RunRef
    neuron_class: str
    top: int
    rows: list[NeuronRow]


class NeuronCountRow(msgspec.Struct):
    layer: int
    relative_depth: float | None
    n_prediction: int | None
    n_suppression: int | None
    n_partition: int | None
    frac_prediction: float | None
    frac_suppression: float | None
    frac_partition: float | None


class NeuronCounts(msgspec.Struct):
    model: ModelRef
    run: RunRef
    rows: list[NeuronCountRow]
