"""A model split over devices (`compute.placement`), on the torch side: the weights moved where
the plan puts them, and tensors moved between devices.

The bridge is built on the host in float32 (the parity reference needs the Hugging Face model
there, and TransformerLens processes the weights in place), so a split model is placed after its
parity is measured: each block's parameters and buffers go to the block's device, everything
else (the embedding, positions, rotary tables, the final norm, the unembedding) to the home
device, cast to the run's dtype on the way, one tensor at a time (no device ever holds more than
its share). TransformerLens 4.3 would split only a model it loads itself (its `device_map` is
refused beside a Hugging Face model handed to it), and Accelerate's dispatch hooks move each
block's output on to the next block's device, where Strata wants every block's writes home.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch

from compute.errors import ModelLoadError
from compute.placement import Placement

_WRAPPED = "._original_component"


def _modules(bridge: Any) -> Iterator[torch.nn.Module]:
    """Every module of the bridge and of the model it wraps, once each."""
    seen: set[int] = set()
    roots = [bridge, getattr(bridge, "original_model", None)]
    for root in roots:
        if not isinstance(root, torch.nn.Module):
            continue
        for module in root.modules():
            if id(module) not in seen:
                seen.add(id(module))
                yield module


def _module_devices(bridge: Any, placement: Placement) -> dict[int, str]:
    """The device of every module inside a block (by identity): the block's."""
    where: dict[int, str] = {}
    for layer, device in enumerate(placement.blocks):
        for module in bridge.blocks[layer].modules():
            if where.setdefault(id(module), device) != device:
                raise ModelLoadError(
                    f"blocks on {where[id(module)]} and {device} share a module: the model "
                    "cannot be split over devices"
                )
    return where


def _unshare(bridge: Any, placement: Placement) -> None:
    """A module that blocks on different devices share and that holds no parameter (the native
    model's one rotary table for every block) copied for each device after the first that
    uses it; one that holds parameters (weights tied across blocks) is refused."""
    first: dict[int, str] = {}
    found: list[tuple[torch.nn.Module, str, torch.nn.Module, str]] = []

    def walk(parent: torch.nn.Module, device: str) -> None:
        for name, child in parent._modules.items():
            if child is None:
                continue
            if first.setdefault(id(child), device) == device:
                walk(child, device)
            elif any(True for _ in child.parameters()):
                raise ModelLoadError(
                    f"blocks on {first[id(child)]} and {device} share weights: the model "
                    "cannot be split over devices"
                )
            else:
                found.append((parent, name, child, device))

    for layer, device in enumerate(placement.blocks):
        block = bridge.blocks[layer]
        first.setdefault(id(block), device)
        walk(block, device)
    copies: dict[tuple[int, str], torch.nn.Module] = {}
    for parent, name, child, device in found:
        key = (id(child), device)
        if key not in copies:
            copies[key] = copy.deepcopy(child)
        parent._modules[name] = copies[key]


def place(bridge: Any, placement: Placement, dtype: torch.dtype) -> None:
    """Move the bridge's weights where `placement` puts them, floating point ones cast to
    `dtype`, one module's at a time: a block's modules to the block's device, every other
    module home. A parameter two devices would share (tied weights) is refused."""
    _unshare(bridge, placement)
    inside = _module_devices(bridge, placement)
    modules = [(m, inside.get(id(m), placement.home)) for m in _modules(bridge)]
    owner: dict[int, str] = {}
    for module, device in modules:
        for p in module.parameters(recurse=False):
            if owner.setdefault(id(p), device) != device:
                raise ModelLoadError(
                    f"a weight is used on {owner[id(p)]} and on {device}: the model cannot be "
                    "split over devices"
                )
    for module, device in modules:
        target = torch.device(device)
        module._apply(
            lambda t, d=target: t.to(d, dtype) if t.is_floating_point() else t.to(d),
            recurse=False,
        )
    bridge.cfg.device = placement.home
    if hasattr(bridge.cfg, "dtype"):
        bridge.cfg.dtype = dtype


def module_names(bridge: Any) -> tuple[list[str], list[str]]:
    """Each block's module name and the names of the modules outside the blocks that hold
    weights, as the wrapped model names them (a Hugging Face model's own names: what a
    transformers `device_map` takes)."""
    root = getattr(bridge, "original_model", None)
    if not isinstance(root, torch.nn.Module):
        root = bridge
    names = {id(m): n.replace(_WRAPPED, "") for n, m in root.named_modules()}
    blocks = [names.get(id(b)) or names.get(id(b.original_component), "") for b in bridge.blocks]
    inside = {id(m) for b in bridge.blocks for m in b.modules()}
    home = []
    for name, module in root.named_modules():
        owns = any(True for _ in module.parameters(recurse=False)) or any(
            True for _ in module.buffers(recurse=False)
        )
        clean = name.replace(_WRAPPED, "")
        if owns and id(module) not in inside and clean not in home:
            home.append(clean)
    return blocks, home
