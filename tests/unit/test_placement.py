"""Models larger than one device (`compute.placement`, `compute.models.split`).

- The plan, given device sizes: placements worked out by hand for a few geometries, the
  refusal when even all the devices together are too small, Accelerate's `device_map` and
  `max_memory`, and `check_fits` on a real geometry.
- End to end on the CPU: models of both block paths split over three CPU "devices" that a
  torch function mode tells apart (`tests.virtual_devices`: any operation mixing two devices'
  tensors fails, as on GPUs), every family swept, and the records equal to the same model's on
  one device; a whole `compute_run` records the placement.
- On CUDA (skipped without it): a real split over two GPUs, and over one GPU and the host.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from compute.engine import sweep
from compute.errors import ModelTooLargeError
from compute.memory import GIB, ModelDims, check_fits, placement_needs, plan_devices
from compute.metrics.base import EngineOptions
from compute.models import LoadedModel, ModelSpec, load_model, resolve_model_spec
from compute.models.loaded import SplitModel, _dims_before_loading
from compute.placement import DeviceMemory, Placement, PlacementNeeds, plan_placement
from compute.zoo.architectures import CASES_BY_NAME, build_checkpoint
from tests.virtual_devices import CrossDeviceError, VirtualDevices

pytestmark = pytest.mark.usefixtures("single_torch_thread")

# --------------------------------------------------------------------------- the plan

# 6 blocks of 100 bytes, 100 bytes of embedding and unembedding; a sequence of the batch costs
# 50 bytes at home and 10 on a device of blocks.
NEEDS = PlacementNeeds(
    n_layers=6, home_weights=100, block_weights=100, home_per_sequence=50, block_per_sequence=10
)


def devices(*sizes: int) -> list[DeviceMemory]:
    return [DeviceMemory(f"cuda:{i}", size) for i, size in enumerate(sizes)]


def test_a_model_the_first_device_holds_stays_there() -> None:
    # 700 bytes of weights and 50 of one sequence: 1000 hold them, with 6 sequences of room
    plan = plan_placement(NEEDS, devices(1000, 1000))
    assert not plan.split
    assert plan.blocks == ("cuda:0",) * 6
    assert plan.batch == 6
    assert plan.devices == ("cuda:0",)


def test_blocks_go_where_the_batch_is_largest_in_proportion_to_room() -> None:
    """700 + 250 bytes: at a batch of 4 the first device holds (700 - 100 - 200) / 100 = 4
    blocks and the second (250 - 40) / 100 = 2; at 5, 3 and 2: too few. So 4 and 2."""
    plan = plan_placement(NEEDS, devices(700, 250))
    assert plan.split
    assert plan.batch == 4
    assert plan.blocks == ("cuda:0",) * 4 + ("cuda:1",) * 2
    assert plan.ranges() == [("cuda:0", 0, 4), ("cuda:1", 4, 6)]
    # what each device is given: home 100 + 4 x 50 + 4 x 100, the other 4 x 10 + 2 x 100
    assert plan.max_memory(NEEDS) == {0: 700, 1: 240}
    names = [f"model.layers.{i}" for i in range(6)]
    assert plan.device_map(names, ["model.embed_tokens", "lm_head"]) == {
        "model.embed_tokens": 0,
        "lm_head": 0,
        **{n: 0 for n in names[:4]},
        **{n: 1 for n in names[4:]},
    }
    assert plan.as_dict() == {
        "home": "cuda:0",
        "blocks": [
            {"device": "cuda:0", "first": 0, "last": 3},
            {"device": "cuda:1", "first": 4, "last": 5},
        ],
        "planned_batch": 4,
    }


def test_a_home_device_may_keep_no_block() -> None:
    """600, 500, 300 bytes: up to a batch of 10 the home device keeps its 100 bytes and the
    batch's 500 (no block); the others hold (500 - 100) / 100 = 4 and (300 - 100) / 100 = 2
    blocks then. At 11 the home device cannot hold the batch."""
    plan = plan_placement(NEEDS, devices(600, 500, 300))
    assert plan.batch == 10
    assert plan.blocks == ("cuda:1",) * 4 + ("cuda:2",) * 2
    assert plan.devices == ("cuda:0", "cuda:1", "cuda:2")
    assert plan.max_memory(NEEDS) == {0: 600, 1: 500, 2: 300}


def test_blocks_are_shared_out_by_largest_remainder() -> None:
    """Room for 3, 3 and 3 blocks at the best batch, 6 blocks: 2 each. Room for 1, 1 and 5
    (7 blocks' room, 3 blocks): shares 3/7, 3/7 and 15/7, so 0, 0, 2 and the remaining block
    to the largest remainder, the first device's 3/7 (ties go to the earlier device)."""
    needs = PlacementNeeds(6, 0, 100, 1000, 0)
    even = plan_placement(needs, devices(1300, 300, 300))  # 1000 for one sequence at home
    assert even.blocks == ("cuda:0",) * 2 + ("cuda:1",) * 2 + ("cuda:2",) * 2
    three = PlacementNeeds(3, 0, 100, 1000, 0)
    assert plan_placement(three, devices(1100, 100, 500)).blocks == ("cuda:0", "cuda:2", "cuda:2")


def test_refused_only_where_all_the_devices_together_are_too_small() -> None:
    # together 600 bytes hold the 6 blocks (at a batch of 1: 3 + 3)
    assert plan_placement(NEEDS, devices(450, 310)).split
    with pytest.raises(ModelTooLargeError, match=r"more than 2 devices together, which have"):
        plan_placement(NEEDS, devices(300, 300))
    with pytest.raises(ModelTooLargeError, match=r"more than cuda:0, where"):
        plan_placement(NEEDS, devices(700))
    with pytest.raises(ModelTooLargeError, match=r"the first holds the embedding"):
        plan_placement(NEEDS, devices(120, 10_000))  # the home device cannot hold its part


# Pythia-6.9B's geometry (docs/performance.md): 12.8 GiB of weights in bfloat16 plus 4 GiB of
# the fast path's fused attention matrices.
PYTHIA_6_9B = ModelDims(
    n_layers=32,
    d_model=4096,
    n_heads=32,
    d_head=128,
    d_mlp=16384,
    d_vocab=50432,
    n_ctx=2048,
    learned_positions=False,
)


def test_the_needs_add_up_to_the_estimate_check_fits_has_always_made() -> None:
    needs = placement_needs(PYTHIA_6_9B, "bfloat16")
    whole = PYTHIA_6_9B.weight_bytes("bfloat16") + PYTHIA_6_9B.fast_path_extra_bytes("bfloat16")
    assert needs.weights == whole
    assert 16.5 < whole / GIB < 17.0
    assert needs.block_weights * 32 > 20 * needs.home_weights  # the blocks are most of it


def test_a_model_one_gpu_does_not_hold_is_split_over_two() -> None:
    """The device side of `check_fits` (whose host side would refuse Pythia-6.9B's float32
    load on a test machine)."""
    two = [DeviceMemory("cuda:0", 12 * GIB), DeviceMemory("cuda:1", 12 * GIB)]
    plan = plan_devices(PYTHIA_6_9B, "bfloat16", "cuda", name="pythia-6.9b", devices=two)
    assert plan.split
    assert plan.devices == ("cuda:0", "cuda:1")
    assert len(plan.blocks) == 32
    assert plan.batch >= 1
    one = [DeviceMemory("cuda:0", 80 * GIB)]
    assert not plan_devices(PYTHIA_6_9B, "bfloat16", "cuda", name="p", devices=one).split
    small = [DeviceMemory("cuda:0", 8 * GIB), DeviceMemory("cuda:1", 8 * GIB)]
    with pytest.raises(ModelTooLargeError, match=r"pythia-6.9b: 6.86B parameters.*16.0 GiB free"):
        check_fits(PYTHIA_6_9B, "bfloat16", "cuda", name="pythia-6.9b", devices=small)


# --------------------------------------------------------------------------- end to end on CPU

OPTS = EngineOptions(
    batch_size=2, induction_n=6, induction_sequences=2, top_neurons=2, top_tokens=2
)
FAMILIES = [
    "intervention",
    "logit_lens",
    "neurons",
    "similarity",
    "attention",
    "norms",
    "heads",
    "heads_atp",
    "pruning",
    "pruning_drops",
]
RANDOM = dict(
    n_layers=4,
    d_model=32,
    n_heads=4,
    d_head=8,
    d_mlp=64,
    d_vocab=100,
    n_ctx=64,
    act_fn="gelu_new",
    normalization_type="LN",
    positional_embedding_type="rotary",
)
# fast: Llama (grouped-query attention, rotary tables from the model's own module), GPT-2 and
# GPT-NeoX (the zoo's tiny-4l-s0 and demo-4l: learned positions at home; rotary), the native
# model (one rotary module every block shares, copied per device); bridge: Bloom (ALiBi, a block
# input made per batch), Gemma 2 (norms after the sublayers, soft-caps, sliding windows),
# Mixtral (experts: neurons read across devices), Jamba (a hybrid: Mamba blocks without heads
# beside an attention block)
MODELS = [
    "llama",
    "tiny-4l-s0",
    "demo-4l",
    "random",
    "bloom",
    "gemma-2",
    "mixtral",
    "jamba",
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("placement")


def spec_of(name: str, root: Path) -> ModelSpec:
    if name == "random":
        return ModelSpec(source="random", name="split", architecture=RANDOM, seed=3)
    if name in ("tiny-4l-s0", "demo-4l"):
        return resolve_model_spec(f"zoo:{name}")
    path = root / name
    if not (path / "config.json").is_file():
        build_checkpoint(CASES_BY_NAME[name], path)
    return resolve_model_spec(str(path))


def three_devices(spec: ModelSpec, one: LoadedModel) -> list[DeviceMemory]:
    """Sizes that put one block at home, one on `cpu:1` and the rest on `cpu:2`: at a batch of
    one sequence each device holds exactly that many blocks, and at two fewer."""
    needs = placement_needs(_dims_before_loading(spec) or ModelDims.of(one), spec.dtype)
    rest = one.n_layers - 2
    return [
        DeviceMemory("cpu", needs.home_weights + needs.home_per_sequence + needs.block_weights),
        DeviceMemory("cpu:1", needs.block_weights + needs.block_per_sequence),
        DeviceMemory("cpu:2", rest * needs.block_weights + needs.block_per_sequence),
    ]


def records(lm: LoadedModel, tokens: torch.Tensor) -> dict[tuple[Any, ...], float]:
    out = {}
    for r in sweep(lm, tokens, FAMILIES, OPTS).records:
        out[(r.metric, r.layer, r.component, r.head, r.neuron)] = r.value
    return out


def watched(lm: SplitModel) -> VirtualDevices:
    """A mode that knows where `lm`'s weights are."""
    vd = VirtualDevices()
    vd.place(lm.model, lm.device)
    if isinstance(getattr(lm.model, "original_model", None), torch.nn.Module):
        vd.place(lm.model.original_model, lm.device)
    for layer, device in enumerate(lm.placement.blocks):
        vd.place(lm.model.blocks[layer], device)
    return vd


@pytest.mark.parametrize("name", MODELS)
def test_a_split_model_gives_the_records_of_one_device(name: str, checkpoints: Path) -> None:
    spec = spec_of(name, checkpoints)
    one = load_model(spec)
    split = load_model(spec, devices=three_devices(spec, one))
    assert isinstance(split, SplitModel)
    assert split.block_path == one.block_path
    n = one.n_layers
    assert split.placement.blocks == ("cpu", "cpu:1", *(["cpu:2"] * (n - 2)))
    for layer, device in enumerate(split.placement.blocks):
        params = list(split.model.blocks[layer].parameters())
        assert params, device
        assert all(p.device.type == "cpu" for p in params), device
    # the parity report carries the placement, and the split forward is the host's
    assert split.parity is not None
    assert split.parity.placement is not None
    record = split.parity.as_dict()["placement"]
    assert record["home"] == "cpu"
    assert record["blocks"][-1] == {"device": "cpu:2", "first": 2, "last": n - 1}
    assert record["max_abs_logprob_diff_to_host"] == 0.0
    assert set(record["max_memory"]) == {"cpu", "cpu:1", "cpu:2"}
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, one.d_vocab_real, (3, 20), generator=gen)
    tokens[:, 0] = one.bos_token_id
    expected = records(one, tokens)
    vd = watched(split)
    with vd:
        got = records(split, tokens)
    assert vd.moves > 0
    assert got.keys() == expected.keys()
    worst = max(abs(got[k] - expected[k]) / max(1.0, abs(expected[k])) for k in expected)
    assert worst <= 1e-6, f"{name}: records differ by {worst:.2e} (relative)"
    assert all(math.isfinite(v) for v in got.values())


def test_the_mode_catches_a_missing_move(checkpoints: Path) -> None:
    """What the end-to-end test relies on: a block run on a residual left at home fails."""
    spec = spec_of("llama", checkpoints)
    split = load_model(spec, devices=three_devices(spec, load_model(spec)))
    assert isinstance(split, SplitModel)
    tokens = torch.zeros(1, 8, dtype=torch.long)
    with watched(split), torch.inference_mode():
        split.run_block(2, split.embed(tokens))  # moved to the block's device and back
        with pytest.raises(CrossDeviceError, match="mixes"):
            LoadedModel.run_block(split, 2, split.embed(tokens))  # not moved


def test_a_run_records_where_the_model_was(checkpoints: Path, tmp_path: Path) -> None:
    import numpy as np

    from compute.run import RunConfig, compute_run, result_metadata
    from compute.tokens import TokenSpec

    spec = spec_of("random", checkpoints)
    split = load_model(spec, devices=three_devices(spec, load_model(spec)))
    ids = np.random.default_rng(0).integers(1, 100, size=(2, 12))
    ids[:, 0] = 0
    np.save(tmp_path / "ids.npy", ids)
    tokens = TokenSpec(source="npy", path=str(tmp_path / "ids.npy"), n_sequences=0, seq_len=0)
    config = RunConfig(
        model=spec, tokens=tokens, families=("intervention", "logit_lens"), options=OPTS
    )
    meta = result_metadata(compute_run(config, lm=split))
    placement = meta["model"]["parity"]["placement"]
    assert placement["blocks"][0] == {"device": "cpu", "first": 0, "last": 0}
    assert placement["device_map"]["layers.3"] == "cpu:2"
    assert placement["max_abs_logprob_diff_to_host"] == 0.0
    assert meta["device"] == "cpu"


def test_a_split_batch_is_bounded_by_the_devices_of_its_blocks(
    checkpoints: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from compute.engine import auto_batch_size
    from compute.memory import block_bytes_per_sequence

    spec = spec_of("random", checkpoints)
    split = load_model(spec, devices=three_devices(spec, load_model(spec)))
    assert isinstance(split, SplitModel)
    per = block_bytes_per_sequence(
        ModelDims.of(split), 16, split.dtype_bytes, patterns=False, z=False
    )
    free = {"cpu:1": 10 * per, "cpu:2": 100 * per}
    monkeypatch.setattr("compute.models.loaded.device_free_bytes", lambda d: free[d])
    assert split.sequences_beside_blocks(16, patterns=False, z=False) == 8  # 85% of 10
    roomy = EngineOptions(memory_budget_mb=1024, tokens_per_batch=10**6)
    assert auto_batch_size(split, 16, roomy) == 8


# --------------------------------------------------------------------------- on CUDA


def _cuda_split(devices_: list[DeviceMemory]) -> None:
    spec = ModelSpec(source="random", name="split", architecture=RANDOM, seed=3)
    one = load_model(spec, "cuda:0")
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 100, (3, 20), generator=gen)
    tokens[:, 0] = 0
    split = load_model(spec, "cuda:0", devices=devices_)
    assert isinstance(split, SplitModel)
    for layer, device in enumerate(split.placement.blocks):
        assert all(p.device == torch.device(device) for p in split.model.blocks[layer].parameters())
    expected, got = records(one, tokens), records(split, tokens)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-4, rel=1e-3), key


def _sized(spec_devices: list[str]) -> list[DeviceMemory]:
    spec = ModelSpec(source="random", name="split", architecture=RANDOM, seed=3)
    one = load_model(spec)
    sizes = three_devices(spec, one)
    return [DeviceMemory(d, s.free_bytes) for d, s in zip(spec_devices, sizes, strict=True)]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_a_model_split_over_two_gpus_gives_the_records_of_one() -> None:
    _cuda_split(_sized(["cuda:0", "cuda:1", "cuda:1"]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_model_split_over_a_gpu_and_the_host_gives_the_records_of_one() -> None:
    """Real moves between two real devices on a machine with one GPU: blocks on the host."""
    _cuda_split(_sized(["cuda:0", "cpu", "cpu"]))


def test_placement_is_a_plain_value() -> None:
    plan = Placement("cuda:0", ("cuda:0", "cuda:1"), 3)
    assert plan.devices == ("cuda:0", "cuda:1")
    assert plan == Placement("cuda:0", ("cuda:0", "cuda:1"), 3)


def test_a_split_latent_attention_model_screens_its_heads_as_on_one_device(
    checkpoints: Path,
) -> None:
    """Multi-head latent attention's z is read at its o_proj's input (TransformerLens's hook_z
    splits it by another width): the head screen's z crosses devices from there, and a split
    DeepSeek V2 gives the records of one device. (No virtual devices here: their mode does not
    follow the complex tensors of DeepSeek V2's rotary embedding.)"""
    spec = spec_of("deepseek-v2", checkpoints)
    one = load_model(spec)
    split = load_model(spec, devices=three_devices(spec, one))
    assert isinstance(split, SplitModel)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, one.d_vocab_real, (2, 16), generator=gen)
    tokens[:, 0] = one.bos_token_id

    def heads_of(lm: LoadedModel) -> dict[tuple[Any, ...], float]:
        return {
            (r.metric, r.layer, r.head): r.value
            for r in sweep(lm, tokens, ["heads", "heads_atp"], OPTS).records
        }

    expected, got = heads_of(one), heads_of(split)
    assert got.keys() == expected.keys()
    assert {k[2] for k in got} == set(range(4))  # its 4 heads, not TransformerLens's 8 slices
    assert all(abs(got[k] - expected[k]) <= 1e-6 * max(1.0, abs(expected[k])) for k in got)
