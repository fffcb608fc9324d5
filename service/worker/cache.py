"""Loaded models kept per worker process, least recently used first out, keyed by model spec
and device: consecutive jobs on one model do not reload it."""

from __future__ import annotations

import gc
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: `strata beat` imports this module and needs no torch
    from compute.models import LoadedModel, ModelSpec


class ModelCache:
    def __init__(self, size: int, load: Callable[[ModelSpec, str], LoadedModel]) -> None:
        self.size = size
        self.load = load
        self._models: OrderedDict[tuple[str, str], LoadedModel] = OrderedDict()
        self.loads = 0

    def get(self, spec: ModelSpec, device: str) -> LoadedModel:
        key = (spec.model_dump_json(), device)
        if key in self._models:
            self._models.move_to_end(key)
            return self._models[key]
        if self.size == 0:
            self.loads += 1
            return self.load(spec, device)
        while len(self._models) >= self.size:  # free memory before loading the next one
            self._models.popitem(last=False)
            _release()
        self.loads += 1
        model = self._models[key] = self.load(spec, device)
        return model


def _release() -> None:
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # torch missing a backend is no reason to fail a job
        pass


_cache: ModelCache | None = None


def process_cache(size: int) -> ModelCache:
    """This process's cache (made on first use; a recycled process starts empty)."""
    global _cache
    if _cache is None:
        from compute.models import load_model

        _cache = ModelCache(size, load_model)
    return _cache


__all__: list[Any] = ["ModelCache", "process_cache"]
