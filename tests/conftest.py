"""Test-wide setup: nothing may reach the Hugging Face hub."""

import gc
import os
import subprocess
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Several test processes share the machine's cores (pytest-xdist): one thread each, for
    # them and for the services they start, rather than every process thrashing every core.
    os.environ["OMP_NUM_THREADS"] = "1"

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# Bytecode is cached even where the environment says not to (PYTHONDONTWRITEBYTECODE, set on
# the development machines): otherwise every test process rewrote the asserts of every test
# module anew (about 4 CPU-s each, five processes a run) and every `strata` process compiled
# the project again. Set before the test modules are collected and the test processes and
# services start, so they inherit it; __pycache__ is ignored by git.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# --------------------------------------------------------------------------- tiny models
# Shared by the engine-vs-reference tests and the invariant tests. Everything is built here,
# deterministically, on the CPU: random TransformerLens models and Hugging Face checkpoints
# saved into a session temporary directory (nothing is downloaded).

TINY_ARCH: dict[str, Any] = dict(n_layers=3, d_model=32, n_heads=4, d_head=8, d_mlp=64,
                                 d_vocab=100, n_ctx=64, act_fn="gelu_new",
                                 normalization_type="LN")


def _word_level_tokenizer(n_tokens: int) -> Any:
    """A tiny offline tokenizer: id 0 is <|endoftext|> (BOS/EOS/PAD), then w1..w{n-1}."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    special = "<|endoftext|>"
    vocab = {special: 0, **{f"w{i}": i for i in range(1, n_tokens)}}
    raw = Tokenizer(models.WordLevel(vocab, unk_token=special))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=raw, bos_token=special, eos_token=special,
                                   unk_token=special, pad_token=special)


def _randomise_norms_and_biases(model: Any, seed: int) -> None:
    """Non-trivial LayerNorm gains/biases and biases, so weight processing has work to do."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "ln" in name or "layernorm" in name or "layer_norm" in name:
                p.copy_(1.0 + 0.5 * noise if name.endswith("weight") else 0.3 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)


def build_hf_checkpoint(path: Path, kind: str, *, vocab: int = 100, tokenizer_vocab: int = 100,
                        n_layers: int = 3, seed: int = 0) -> Path:
    """Save a tiny checkpoint with a tokenizer to `path`: `gpt2`, `neox` (rotary, parallel),
    `llama` (RMSNorm, rotary, grouped-query attention 4 query heads over 2 key/value heads,
    SiLU-gated MLP, tied embeddings, as SmolLM2) or `neo` (GPT-Neo: global and local attention
    layers alternating, window 4, learned positions)."""
    import torch
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        GPTNeoConfig,
        GPTNeoForCausalLM,
        GPTNeoXConfig,
        GPTNeoXForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
    )

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if kind == "gpt2":
            config = GPT2Config(vocab_size=vocab, n_positions=64, n_embd=32, n_layer=n_layers,
                                n_head=4, bos_token_id=0, eos_token_id=0, initializer_range=0.2)
            model = GPT2LMHeadModel(config)
        elif kind == "neox":
            config = GPTNeoXConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=n_layers,
                                   num_attention_heads=4, intermediate_size=64,
                                   max_position_embeddings=64, rotary_pct=0.5,
                                   use_parallel_residual=True, bos_token_id=0, eos_token_id=0,
                                   initializer_range=0.2, tie_word_embeddings=False)
            model = GPTNeoXForCausalLM(config)
        elif kind == "llama":
            config = LlamaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=n_layers,
                                 num_attention_heads=4, num_key_value_heads=2,
                                 intermediate_size=48, max_position_embeddings=64,
                                 rms_norm_eps=1e-5, rope_theta=10_000.0, hidden_act="silu",
                                 tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
                                 initializer_range=0.2)
            model = LlamaForCausalLM(config)
        elif kind == "neo":
            pairs, odd = divmod(n_layers, 2)
            config = GPTNeoConfig(vocab_size=vocab, hidden_size=32, num_layers=n_layers,
                                  attention_types=[[["global", "local"], pairs],
                                                   [["global"], odd]],
                                  num_heads=4, window_size=4,
                                  max_position_embeddings=64, bos_token_id=0, eos_token_id=0,
                                  initializer_range=0.2)
            model = GPTNeoForCausalLM(config)
        else:
            raise ValueError(kind)
    model.eval()
    _randomise_norms_and_biases(model, seed + 1)
    model.save_pretrained(path)
    # A checkpoint without tokenizer files does not load (see the test report); ship one.
    _word_level_tokenizer(tokenizer_vocab).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def hf_gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GPT-2 (LayerNorm, sequential), 3 layers; the tokenizer knows 90 of W_U's 100 columns."""
    return build_hf_checkpoint(tmp_path_factory.mktemp("hf") / "gpt2", "gpt2",
                               tokenizer_vocab=90)


@pytest.fixture(scope="session")
def hf_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama (RMSNorm, rotary, grouped-query attention, gated MLP, tied embeddings), 3 layers."""
    return build_hf_checkpoint(tmp_path_factory.mktemp("hf") / "llama", "llama")


@pytest.fixture(scope="session")
def hf_neo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GPT-Neo, 3 layers: global, local (window 4), global."""
    return build_hf_checkpoint(tmp_path_factory.mktemp("hf") / "neo", "neo")


@pytest.fixture(scope="session")
def hf_neox_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GPT-NeoX (rotary on half of each head, parallel attention and MLP), 3 layers."""
    return build_hf_checkpoint(tmp_path_factory.mktemp("hf") / "neox", "neox")


def load_random_model(seed: int = 1, processing: dict[str, bool] | None = None,
                      **arch: Any) -> Any:
    """A randomly initialised TransformerLens model (TINY_ARCH with overrides)."""
    from compute.models import ModelSpec, Processing, load_model

    spec = ModelSpec(source="random", name="tiny-random", architecture={**TINY_ARCH, **arch},
                     seed=seed, processing=Processing(**(processing or {})))
    return load_model(spec)


def load_checkpoint(ref: str | Path, processing: dict[str, bool] | None = None) -> Any:
    """A zoo name (`zoo:...`) or checkpoint directory, loaded with the given processing."""
    from compute.models import Processing, load_model, resolve_model_spec

    return load_model(resolve_model_spec(str(ref), processing=Processing(**(processing or {}))))


def random_tokens(n_sequences: int, seq_len: int, d_vocab: int, bos_token_id: int,
                  seed: int = 0) -> Any:
    """Seeded uniform token ids with BOS at position 0: [n_sequences, seq_len]."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, d_vocab, (n_sequences, seq_len), generator=gen)
    tokens[:, 0] = bos_token_id
    return tokens


@pytest.fixture(scope="session")
def tiny_factories() -> dict[str, Callable[..., Any]]:
    """The builders above, for test modules (conftest is not importable as a module)."""
    return {"random": load_random_model, "checkpoint": load_checkpoint, "tokens": random_tokens}


# --------------------------------------------------------------------------- the zygote
# The harnesses fork `strata` processes from one warm interpreter per session (tests/launcher.py).
# The session's first process starts it while the tests are collected (pytest-xdist's test
# processes inherit its socket's address); a run of unit tests alone needs none.
_zygote: subprocess.Popen[bytes] | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _zygote
    from tests.launcher import SOCKET_ENV, forking, start_zygote

    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist's: keep LONGEST_FIRST's order
        config.option.loadscopereorder = False

    if os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get(SOCKET_ENV) or not forking():
        return
    unit = (Path(__file__).parent / "unit").resolve()
    paths = [Path(str(a).split("::")[0]).resolve() for a in config.args] or [Path.cwd()]
    if all(p == unit or unit in p.parents for p in paths):
        return
    _zygote = start_zygote()


def pytest_unconfigure(config: pytest.Config) -> None:
    from tests.launcher import stop_zygote

    if _zygote is not None:
        stop_zygote(_zygote)


@pytest.fixture(scope="session", autouse=True)
def no_launched_process_outlives_the_session() -> Iterator[None]:
    """Processes the harnesses forked that a failed test left running are killed with their
    sessions when the test session ends."""
    yield
    from tests.launcher import kill_leftovers

    kill_leftovers()


@pytest.fixture(scope="module")
def single_torch_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread, and two busy cores make more threads thrash."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --------------------------------------------------------------------------- parallel runs
# The README's test command runs the tests in several processes (pytest-xdist, `--dist
# loadgroup`), a module's tests together in one process, so that its module-scoped fixtures are
# made once. Modules marked `spread` (each test builds its own deployment) have their tests
# dealt out one by one. Tests that share something that is not theirs alone go together too:
# the session's API server and dashboard service (made once per process), and the machine's
# RabbitMQ, whose queues a test purges.
SHARED = {"server": "api-server", "web": "web-service"}
# xdist hands a process the next group when it is free, in collection order (its default
# reordering, by number of tests per group, is turned off in `pytest_configure`: it put the
# one-test groups, the longest of all, last): the longest groups and the modules of long single
# tests go first (longest first, by the seconds each took with four processes on two cores,
# measured 2026-12-04), the many short unit tests last, so that none starts late and runs on
# alone while the other processes sit idle.
LONGEST_FIRST = ["tests/integration/test_smollm2.py", "tests/integration/test_doc_commands.py",
                 "tests/integration/test_gemma3.py", "tests/integration/test_qwen.py",
                 "web-service",
                 "tests/unit/test_reference_engine.py", "api-server",
                 "tests/unit/test_architectures.py",
                 "tests/integration/test_first_run.py", "tests/integration/test_family_jobs.py",
                 "tests/unit/test_tuned_lens.py", "tests/integration/test_lifetime.py",
                 "tests/integration/test_families.py", "rabbitmq",
                 "tests/unit/test_reference_mechanisms.py", "test_jobs-running",
                 "tests/unit/test_reduce.py", "tests/integration/test_store_ingest.py",
                 "tests/integration/test_job_states.py", "tests/unit/test_schedule.py",
                 "tests/unit/test_hub_source.py", "tests/unit/test_planted.py",
                 "tests/integration/test_store_kill.py", "tests/integration/test_jobs.py",
                 "tests/integration/test_job_priority.py", "tests/integration/test_faults.py"]


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the groups into the test ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        fixtures = getattr(item, "fixturenames", ())
        group = next((g for f, g in SHARED.items() if f in fixtures), None)
        if "rabbitmq" in item.nodeid:
            group = "rabbitmq"
        if group is None and not item.get_closest_marker("spread"):
            group = item.nodeid.split("::")[0]
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))

    def rank(item: pytest.Item) -> int:
        marker = item.get_closest_marker("xdist_group")
        group = marker.args[0] if marker and marker.args else item.nodeid.split("::")[0]
        return LONGEST_FIRST.index(group) if group in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each group's tests keep their order


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Back in the collector's sight before the summary: a plugin's late import (Hypothesis,
    via trio) checks with `gc.get_referrers`, which does not look at frozen objects."""
    gc.unfreeze()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Everything imported so far lives as long as the process: `gc.freeze()` moves it out of
    the garbage collector's sight, so that each full collection (automatic, or the one after a
    checkpoint load) scans only what the tests made, not torch's, TransformerLens's and every
    test module's objects again (0.4 s a collection in a test process).

    Under `--dist loadgroup`, each grouped test's id carries its group (xdist reads it from
    there): if not, the groups above were added too late and every module's fixtures would be
    made in every process."""
    gc.freeze()
    if not session.config.getoption("loadgroup", False) or not os.environ.get(
        "PYTEST_XDIST_WORKER"
    ):
        return
    ungrouped = [i.nodeid for i in session.items
                 if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if ungrouped:
        message = (f"xdist groups not applied to {len(ungrouped)} tests, e.g. {ungrouped[0]} "
                   "(see tests/conftest.py)")
        # xdist reports a worker's failure here only as a crash; its stderr reaches the terminal
        print(message, file=sys.__stderr__, flush=True)
        raise pytest.UsageError(message)
