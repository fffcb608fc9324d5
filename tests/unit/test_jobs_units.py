"""The job system's pure parts: leases, device matching, run configurations of submissions,
the worker's model cache, watch-folder settling."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from compute.errors import SpecError
from compute.models import resolve_model_spec
from service.jobs.board import Board
from service.jobs.configs import JobRequest, LensRequest, lens_training, run_config
from service.jobs.estimate import estimate, uneven_architectures
from service.jobs.service import device_matches
from service.jobs.watch import WatchFolder
from service.settings import Settings
from service.store.registry import model_identity
from service.store.tables import RegisteredModelRow
from service.worker.cache import ModelCache
from service.worker.execute import with_worker_budgets


def test_a_lease_expires_without_heartbeats_and_a_heartbeat_renews_it() -> None:
    board = Board(lease_s=0.2)
    board.start(1, 0, "w")
    board.start(2, 3, "w")
    time.sleep(0.12)
    board.beat(2, 3, "w", done=1, total=4, tokens_per_s=10.0, elapsed_s=1.0)
    time.sleep(0.12)
    assert board.expired() == [(1, 0)]
    live = board.live(2)
    assert live is not None
    assert live.eta_s == pytest.approx(3.0)  # 1 of 4 units in 1 s: 3 s to go
    board.forget(1)
    assert board.live(1) is None


def test_grace_gives_unknown_running_jobs_a_fresh_lease_and_keeps_known_ones() -> None:
    board = Board(lease_s=0.1)
    board.start(1, 0, "a")
    time.sleep(0.15)
    board.grace([(1, 0, "a"), (2, 1, "b")])
    assert board.expired() == [(1, 0)]  # known: not renewed by grace
    assert board.live(2) is not None


def test_device_matching() -> None:
    assert device_matches(None, "cpu")
    assert device_matches("cuda", "cuda")
    assert device_matches("cuda:1", "cuda")
    assert not device_matches("cuda", "cpu")
    assert not device_matches("cpu", "cuda")


SPEC = model_identity(resolve_model_spec("zoo:tiny-2l-s0"))


def test_run_config_takes_defaults_caps_seq_len_at_the_context_and_is_deterministic() -> None:
    settings = Settings(jobs={"seq_len": 4096, "n_sequences": 3})  # type: ignore[arg-type]
    config = run_config(JobRequest(model="x"), SPEC, 128, settings)
    assert config.tokens.seq_len == 128
    assert config.tokens.n_sequences == 3
    assert config.tokens.fingerprint  # the content is pinned
    assert set(config.families) == set(settings.jobs.families)
    assert config.config_hash() == run_config(JobRequest(model="y"), SPEC, 128,
                                              settings).config_hash()
    other = run_config(JobRequest(model="x", dtype="bfloat16"), SPEC, 128, settings)
    assert other.config_hash() != config.config_hash()


def test_a_workers_budgets_fill_only_what_the_job_left_unset_and_keep_the_identity() -> None:
    settings = Settings(worker={"memory_budget_mb": 2048, "tokens_per_batch": 512})  # type: ignore[arg-type]
    config = run_config(JobRequest(model="x"), SPEC, 128, Settings())
    filled = with_worker_budgets(config, settings)
    assert (filled.options.memory_budget_mb, filled.options.tokens_per_batch) == (2048, 512)
    assert filled.config_hash() == config.config_hash()
    assert with_worker_budgets(config, Settings()) is config
    own = config.model_copy(update={"options": config.options.model_copy(
        update={"tokens_per_batch": 64})})
    assert with_worker_budgets(own, settings).options.tokens_per_batch == 64


@pytest.mark.parametrize(("request_fields", "words"), [
    ({"seq_len": 129}, "beyond the model's context of 128"),
    ({"metrics": ("intervention", "astrology")}, "astrology"),
    ({"dtype": "int4"}, "dtype 'int4'"),
    ({"tokens": "corpus:/tmp"}, "configured root"),
    ({"tokens": "youtube"}, "not a token source"),
    ({"n_sequences": 0}, "n_sequences"),
])
def test_bad_requests_name_the_problem(request_fields: dict[str, object], words: str) -> None:
    with pytest.raises(SpecError, match=words.replace("(", r"\(")):
        run_config(JobRequest(model="x", **request_fields), SPEC, 128,  # type: ignore[arg-type]
                   Settings())


def test_tuned_lens_settings_of_a_job(tmp_path: Path) -> None:
    """Set fields reach the run's training configuration; a bad value is named as
    `tuned_lens.<field>`; a lens to train needs a token source with a training split."""
    from compute.tokens import TokenSpec

    settings = Settings()
    config = run_config(JobRequest(model="x", metrics=("tuned_lens",), n_sequences=2, seq_len=16,
                                   tuned_lens=LensRequest(steps=7, seed=3)), SPEC, 128, settings)
    assert (config.options.tuned_lens.steps, config.options.tuned_lens.seed) == (7, 3)
    assert config.options.tuned_lens.train_sequences == 256  # the recipe's default
    with pytest.raises(SpecError, match=r"tuned_lens\.momentum"):
        lens_training(LensRequest(momentum=1.5), ["tuned_lens"],
                      TokenSpec(source="builtin", n_sequences=2, seq_len=16))
    npy = TokenSpec(source="npy", path=str(tmp_path / "t.npy"), n_sequences=2, seq_len=16)
    with pytest.raises(SpecError, match="'npy' has no training split"):
        lens_training(None, ["tuned_lens"], npy)
    lens_training(LensRequest(lens="0123456789abcdef"), ["tuned_lens"], npy)  # a stored lens
    lens_training(None, ["logit_lens"], npy)  # no tuned lens: nothing to train


def test_a_corpus_under_an_allowed_root_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("The quick brown fox jumps over the lazy dog. " * 200)
    settings = Settings(jobs={"corpus_roots": [str(tmp_path)]})  # type: ignore[arg-type]
    config = run_config(JobRequest(model="x", tokens=f"corpus:{tmp_path / 'a.txt'}",
                                   n_sequences=2, seq_len=8), SPEC, 128, settings)
    assert config.tokens.source == "corpus"
    assert config.tokens.path == str((tmp_path / "a.txt").resolve())


def test_model_cache_keeps_the_most_recently_used_models() -> None:
    loads: list[str] = []

    def load(spec: object, device: str) -> object:
        loads.append(spec.name)  # type: ignore[attr-defined]
        return object()

    cache = ModelCache(2, load)  # type: ignore[arg-type]
    a, b, c = (resolve_model_spec(f"zoo:{n}") for n in ("tiny-2l-s0", "tiny-4l-s0",
                                                         "tiny-4l-s1"))
    first = cache.get(a, "cpu")
    assert cache.get(a, "cpu") is first  # no reload
    cache.get(b, "cpu")
    cache.get(a, "cpu")  # a is now the most recent
    cache.get(c, "cpu")  # evicts b
    cache.get(a, "cpu")
    cache.get(b, "cpu")  # reloaded
    assert loads == ["tiny-2l-s0", "tiny-4l-s0", "tiny-4l-s1", "tiny-4l-s0"]
    assert cache.get(a.model_copy(update={"dtype": "bfloat16"}), "cpu") is not first


def test_watch_folder_waits_for_a_folder_to_settle_and_retries_it_only_after_it_changes(
        tmp_path: Path) -> None:
    seen: list[str] = []
    outcome = {"ok": False}

    def register(folder: Path) -> bool:
        seen.append(folder.name)
        if not outcome["ok"]:
            raise ValueError("weights incomplete")
        return True

    watch = WatchFolder(tmp_path, register, settle_s=0.3)
    model = tmp_path / "new-model"
    model.mkdir()
    (tmp_path / "not-a-checkpoint").mkdir()
    (model / "config.json").write_text("{}")
    assert watch.scan() == []  # still being written
    time.sleep(0.35)
    assert watch.scan() == []  # registration failed
    assert watch.scan() == []  # not retried: unchanged
    assert seen == ["new-model"]
    outcome["ok"] = True
    time.sleep(0.01)
    (model / "model.safetensors").write_bytes(b"...")  # the copy finishes
    time.sleep(0.35)
    assert watch.scan() == [model]
    assert seen == ["new-model", "new-model"]


def test_watch_folder_takes_settled_gguf_files(tmp_path: Path) -> None:
    seen: list[str] = []

    def register(path: Path) -> bool:
        seen.append(path.name)
        return True

    watch = WatchFolder(tmp_path, register, settle_s=0.3)
    gguf = tmp_path / "tiny.Q4_0.gguf"
    gguf.write_bytes(b"GGUF")
    (tmp_path / "notes.txt").write_text("not a model")
    assert watch.scan() == []  # still being written
    time.sleep(0.35)
    assert watch.scan() == [gguf]
    assert watch.scan() == []  # taken once
    assert seen == ["tiny.Q4_0.gguf"]


def test_progress_rates_read_to_three_figures_however_slow() -> None:
    """A real model's run sweeps under one token per second on a CPU: the bar says how much
    under, never '0 tok/s' or '1 tok/s' for 0.42 (issue 37: 'tells a user nothing')."""
    from service.cli.outputs import format_rate

    assert format_rate(0.4249) == "0.425 tok/s"
    assert format_rate(0.0123) == "0.0123 tok/s"
    assert format_rate(12.34) == "12.3 tok/s"
    assert format_rate(1234.5) == "1,234 tok/s"
    assert format_rate(0.0) == "0 tok/s"


def _registered(architecture: str) -> RegisteredModelRow:
    return RegisteredModelRow(
        name="m", source="hf_dir", spec={"source": "hf_dir", "name": "m"},
        architecture=architecture, n_layers=4, d_model=64, n_heads=4, d_mlp=256, d_vocab=1000,
        n_ctx=256,
    )


def test_an_estimate_says_when_the_blocks_are_not_what_the_formulas_count() -> None:
    """The FLOP and memory formulas count attention plus a dense MLP in every block: for a
    hybrid, a state-space model or experts the estimate says it is a transformer's of that
    shape; for a plain decoder it says nothing of the kind."""
    config = run_config(JobRequest(model="m", metrics=["intervention"], n_sequences=2, seq_len=16),
                        {"source": "hf_dir", "name": "m"}, 256, Settings())
    kinds = {"JambaForCausalLM", "MambaForCausalLM", "MixtralForCausalLM",
             "Qwen3NextForCausalLM", "LlamaForCausalLM", "GPT2LMHeadModel"}
    assert kinds - uneven_architectures() == {"LlamaForCausalLM", "GPT2LMHeadModel"}
    for architecture in kinds:
        found = estimate(config, _registered(architecture), device="cpu", workers=[],
                         finished=[])
        said = [note for note in found.notes if "not all attention plus one dense MLP" in note]
        assert bool(said) == (architecture in uneven_architectures()), (architecture, found)
        assert found.flops is not None
        assert found.flops > 0
