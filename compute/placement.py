"""Where a model's weights go when one device does not hold it: the placement plan.

Strata's sweep is not a pipeline. It runs one block at a time on a residual it keeps (the clean
pass's cache, `compute.engine`), so a model split over devices has one *home* device, which holds
the embedding, the final norm and the unembedding, the batch's cache and its reference
distribution; every other device holds a contiguous range of blocks. A block runs on the device
that holds its weights, with the residual moved there and its writes moved home
(`compute.models.loaded.LoadedModel.run_block`). The unembedding stays home, beside the
reference distribution its logits are reduced against: on the last device, as a pipeline would
put it, every logit block ([tokens, vocabulary] floats) would cross between devices.

The plan is pure arithmetic on byte counts (`PlacementNeeds`, made from a model's dimensions by
`compute.memory.placement_needs`) and the devices' free bytes (`DeviceMemory`):

- a model whose weights and one sequence of the sweep fit the first device stays on it, as
  every model did before splitting existed;
- otherwise its blocks are spread over the devices so that the batch they leave room for is as
  large as can be (the home device pays `home_per_sequence` for each sequence of a batch, a
  device of blocks only `block_per_sequence`, one block's temporaries and the moved residuals),
  in proportion to what each device holds at that batch;
- where even all the devices together do not hold it, `ModelTooLargeError`, with the figures.

>>> needs = PlacementNeeds(n_layers=4, home_weights=100, block_weights=50,
...                        home_per_sequence=10, block_per_sequence=1)
>>> plan = plan_placement(needs, [DeviceMemory("cuda:0", 200), DeviceMemory("cuda:1", 200)])
>>> plan.blocks
('cuda:0', 'cuda:1', 'cuda:1', 'cuda:1')
>>> plan.device_map(["model.layers.0", "model.layers.1", "model.layers.2", "model.layers.3"],
...                 ["model.embed_tokens", "model.norm", "lm_head"])["model.layers.1"]
1
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from compute.errors import ModelTooLargeError

GIB = 2**30


@dataclass(frozen=True)
class DeviceMemory:
    """A device a model may be placed on (`cuda:0`, `cpu`) and its free bytes."""

    device: str
    free_bytes: int


@dataclass(frozen=True)
class PlacementNeeds:
    """What placing a model takes, in bytes at the run's dtype."""

    n_layers: int
    home_weights: int  # embedding, positions, final norm and unembedding
    block_weights: int  # one block's weights (and the fused copies of the fast path)
    home_per_sequence: int  # one sequence of a batch on the home device (`compute.memory`)
    block_per_sequence: int  # one sequence on a device of blocks: a block's working set

    @property
    def weights(self) -> int:
        return self.home_weights + self.n_layers * self.block_weights


@dataclass(frozen=True)
class Placement:
    """The home device and the device of each block (`blocks[layer]`); `batch` is the most
    sequences per batch the plan leaves room for (for a model on one device: as many as the
    device holds beyond the weights)."""

    home: str
    blocks: tuple[str, ...]
    batch: int

    @property
    def devices(self) -> tuple[str, ...]:
        """Every device used, home first."""
        return tuple(dict.fromkeys((self.home, *self.blocks)))

    @property
    def split(self) -> bool:
        return len(self.devices) > 1

    def ranges(self) -> list[tuple[str, int, int]]:
        """(device, first block, one past the last) for each run of consecutive blocks."""
        out: list[tuple[str, int, int]] = []
        for layer, device in enumerate(self.blocks):
            if out and out[-1][0] == device:
                out[-1] = (device, out[-1][1], layer + 1)
            else:
                out.append((device, layer, layer + 1))
        return out

    def device_map(
        self, block_modules: Sequence[str], home_modules: Sequence[str]
    ) -> dict[str, int | str]:
        """The placement as transformers / Accelerate write a `device_map`: module name to a
        CUDA index (or `cpu`). `block_modules[layer]` names each block's module
        (`model.layers.0`, ...), `home_modules` what lives on the home device."""
        if len(block_modules) != len(self.blocks):
            raise ValueError(f"{len(block_modules)} block modules for {len(self.blocks)} blocks")
        out: dict[str, int | str] = dict.fromkeys(home_modules, _accelerate(self.home))
        for name, device in zip(block_modules, self.blocks, strict=True):
            out[name] = _accelerate(device)
        return out

    def max_memory(self, needs: PlacementNeeds) -> dict[int | str, int]:
        """Accelerate's `max_memory`: what this plan puts on each device, in bytes (weights,
        and the working memory of the planned batch)."""
        return {_accelerate(d): b for d, b in planned_bytes(self, needs).items()}

    def as_dict(self) -> dict[str, Any]:
        """For a run's record (the parity report's `placement`)."""
        return {
            "home": self.home,
            "blocks": [
                {"device": device, "first": first, "last": stop - 1}
                for device, first, stop in self.ranges()
            ],
            "planned_batch": self.batch,
        }


def _accelerate(device: str) -> int | str:
    """`cuda:1` -> 1, as Accelerate's maps name CUDA devices; anything else as it is."""
    kind, _, index = device.partition(":")
    return int(index) if kind == "cuda" and index.isdigit() else device


def planned_bytes(placement: Placement, needs: PlacementNeeds) -> dict[str, int]:
    """Bytes the plan puts on each device at its planned batch."""
    counts = {d: placement.blocks.count(d) for d in placement.devices}
    out = {}
    for device, n in counts.items():
        if device == placement.home:
            work = needs.home_weights + placement.batch * needs.home_per_sequence
        else:
            work = placement.batch * needs.block_per_sequence
        out[device] = work + n * needs.block_weights
    return out


def one_device(device: str, needs: PlacementNeeds, free_bytes: int) -> Placement:
    """Everything on `device` (the batch: what its free memory holds beyond the weights)."""
    room = free_bytes - needs.weights
    batch = max(0, room // needs.home_per_sequence) if needs.home_per_sequence else 0
    return Placement(device, (device,) * needs.n_layers, int(batch))


def _capacities(needs: PlacementNeeds, devices: Sequence[DeviceMemory], batch: int) -> list[int]:
    """Blocks each device holds beside a batch of `batch` sequences (-1: the home device cannot
    hold even its own part)."""
    home_room = devices[0].free_bytes - needs.home_weights - batch * needs.home_per_sequence
    if home_room < 0:
        return [-1] * len(devices)
    out = [home_room // needs.block_weights]
    for device in devices[1:]:
        out.append(
            max(0, (device.free_bytes - batch * needs.block_per_sequence)) // needs.block_weights
        )
    return out


def _holds(needs: PlacementNeeds, devices: Sequence[DeviceMemory], batch: int) -> bool:
    capacities = _capacities(needs, devices, batch)
    return capacities[0] >= 0 and sum(capacities) >= needs.n_layers


def _largest_batch(needs: PlacementNeeds, devices: Sequence[DeviceMemory]) -> int:
    """The most sequences per batch with which the devices hold every block (0: not even
    one); the home device's memory bounds it."""
    if not _holds(needs, devices, 1):
        return 0
    low, high = 1, max(1, devices[0].free_bytes // max(needs.home_per_sequence, 1)) + 1
    while high - low > 1:  # _holds(low), not _holds(high)
        mid = (low + high) // 2
        low, high = (mid, high) if _holds(needs, devices, mid) else (low, mid)
    return low


def _spread(n_layers: int, capacities: list[int]) -> list[int]:
    """`n_layers` blocks in proportion to `capacities` (largest remainders first, the earlier
    device on a tie), never more than a device holds."""
    total = sum(capacities)
    shares = [n_layers * c / total for c in capacities]
    counts = [int(s) for s in shares]
    order = sorted(range(len(capacities)), key=lambda i: (-(shares[i] - counts[i]), i))
    for i in order[: n_layers - sum(counts)]:
        counts[i] += 1
    return counts


def plan_placement(
    needs: PlacementNeeds,
    devices: Sequence[DeviceMemory],
    *,
    what: str = "the model",
    dtype: str = "",
) -> Placement:
    """Where a model goes on `devices` (the first is home): all on the first where its weights
    and one sequence fit there, else split over them, else
    `ModelTooLargeError` naming the figures (`what` begins the message)."""
    if not devices:
        raise ValueError("no device to place a model on")
    if needs.weights + needs.home_per_sequence <= devices[0].free_bytes:
        return one_device(devices[0].device, needs, devices[0].free_bytes)
    batch = _largest_batch(needs, devices) if len(devices) > 1 else 0
    if batch == 0:
        raise ModelTooLargeError(_refusal(needs, devices, what, dtype))
    counts = _spread(needs.n_layers, _capacities(needs, devices, batch))
    blocks = tuple(d.device for d, n in zip(devices, counts, strict=True) for _ in range(n))
    return Placement(devices[0].device, blocks, batch)


def _refusal(needs: PlacementNeeds, devices: Sequence[DeviceMemory], what: str, dtype: str) -> str:
    need = needs.weights + needs.home_per_sequence
    free = ", ".join(f"{d.device} {d.free_bytes / GIB:.1f}" for d in devices)
    where = (
        f"{devices[0].device}, where {devices[0].free_bytes / GIB:.1f} GiB is free"
        if len(devices) == 1
        else f"{len(devices)} devices together, which have "
        f"{sum(d.free_bytes for d in devices) / GIB:.1f} GiB free ({free} GiB); split, the "
        f"first holds the embedding, the unembedding and the batch "
        f"({(needs.home_weights + needs.home_per_sequence) / GIB:.2f} GiB) and each block "
        f"takes {needs.block_weights / GIB:.2f} GiB where it is placed"
    )
    return (
        f"{what} needs about {need / GIB:.1f} GiB{' in ' + dtype if dtype else ''} (weights "
        f"{needs.weights / GIB:.1f} GiB + one sequence's activations): more than {where}. Use "
        "bfloat16, more or larger devices, or free them."
    )
