"""Several devices on one CPU, told apart: what lets a test run a model split over devices
(`compute.placement`) where there is only the CPU, and still catch every missing move.

`torch.device("cpu:1")` is a device of its own to torch's bookkeeping (it is not equal to
`torch.device("cpu")`), but a tensor moved there is a CPU tensor like any other, so a forgotten
move would go unnoticed. `VirtualDevices`, a torch function mode, remembers which "device" each
tensor is on — the one it was moved to (`.to("cpu:1")`), the one of the module it belongs to
(`place`), or the one of the tensors it was computed from — and refuses, as CUDA refuses two
GPUs' tensors in one operation, any operation that mixes tensors of two of them. A tensor made
without a device of its own (`torch.zeros(n)`, `device=x.device`, which reads `cpu` on all of
them) belongs to none and mixes with any, as a CPU scalar does with a GPU tensor.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

# What moves a tensor to a device (its first argument is the tensor moved).
_MOVES = {torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda}
# What may read a tensor of another device: a copy into a tensor of its own.
_COPIES = {torch.Tensor.copy_}


class CrossDeviceError(RuntimeError):
    """An operation read tensors of two devices."""


def _tensors(value: Any) -> Iterator[Tensor]:
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _device_of(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The device a move names (None: not a move, e.g. a cast to a dtype)."""
    if func is torch.Tensor.cpu:
        return "cpu"
    candidates = [kwargs.get("device"), *args[1:]]
    for c in candidates:
        if isinstance(c, torch.device) or (isinstance(c, str) and c.split(":")[0] == "cpu"):
            return str(torch.device(c))
    return None


class VirtualDevices(TorchFunctionMode):
    """Tags tensors with the device they are on (`cpu`, `cpu:1`, ...) and refuses operations
    that mix two. `moves` counts the moves between two devices it saw."""

    def __init__(self) -> None:
        super().__init__()
        self.where: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.moves = 0
        self.checked = 0

    def place(self, module: torch.nn.Module, device: str | torch.device) -> None:
        """Say that `module`'s parameters and buffers are on `device`."""
        for t in (*module.parameters(), *module.buffers()):
            self.where[t] = str(torch.device(device))

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in _MOVES:
            target = _device_of(func, args, kwargs)
            out = func(*args, **kwargs)
            source = self.where.get(args[0])
            if target is None:  # a cast: where its input was
                if source is not None and isinstance(out, Tensor):
                    self.where[out] = source
                return out
            if out is args[0] and source != target:
                out = out.clone()  # the same CPU tensor: two devices must not share it
            if source is not None and source != target:
                self.moves += 1
            self.where[out] = target
            return out
        inputs = list(_tensors(args)) + list(_tensors(kwargs))
        seen = {self.where[t] for t in inputs if t in self.where}
        if func in _COPIES and inputs:
            seen = {self.where[inputs[0]]} if inputs[0] in self.where else set()
        if len(seen) > 1:
            raise CrossDeviceError(f"{getattr(func, '__name__', func)} mixes {sorted(seen)}")
        self.checked += 1
        out = func(*args, **kwargs)
        device = next(iter(seen), None)
        if device is None:
            explicit = kwargs.get("device")
            if explicit is not None and torch.device(explicit).index is not None:
                device = str(torch.device(explicit))
        if device is not None:
            for t in _tensors(out):
                self.where[t] = device
        return out
