"""Token specs, deterministic packing, .npy pass-through and every error path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from compute.corpus import builtin_corpus_documents
from compute.errors import TokenSpecError
from compute.tokens import (
    PILE_DATASET,
    TokenSpec,
    load_tokens,
    pack_windows,
    random_repeated_tokens,
    resolve_token_spec,
    sample_documents,
    validate_tokens,
    windows_fingerprint,
)
from compute.zoo.tokenizer import train_bpe_tokenizer

BOS = 0
VOCAB = 400


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return train_bpe_tokenizer(builtin_corpus_documents()[:300], vocab_size=VOCAB)


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    docs = builtin_corpus_documents()[:40]
    for i, doc in enumerate(docs):
        (tmp_path / f"{i:03d}.txt").write_text(doc)
    return tmp_path


def _load(spec: TokenSpec, tokenizer, n_ctx: int = 64) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return load_tokens(spec, tokenizer, bos_token_id=BOS, d_vocab=VOCAB, n_ctx=n_ctx)


def test_corpus_packing_is_deterministic(tokenizer, corpus_dir: Path) -> None:  # type: ignore[no-untyped-def]
    spec = TokenSpec(source="corpus", path=str(corpus_dir), n_sequences=6, seq_len=32, seed=3)
    a, b = _load(spec, tokenizer), _load(spec, tokenizer)
    assert a.shape == (6, 32)
    assert a.dtype == torch.long
    assert torch.equal(a, b)
    other = _load(spec.model_copy(update={"seed": 4}), tokenizer)
    assert not torch.equal(a, other)
    assert (a[:, 0] == BOS).all()


def test_builtin_source_and_fingerprint(tokenizer) -> None:  # type: ignore[no-untyped-def]
    spec = resolve_token_spec(TokenSpec(source="builtin", n_sequences=4, seq_len=16))
    assert spec.fingerprint is not None
    assert len(spec.fingerprint) == 16
    tokens = _load(spec, tokenizer)
    assert tokens.shape == (4, 16)
    assert (tokens[:, 0] == BOS).all()
    stale = spec.model_copy(update={"fingerprint": "0" * 16})
    with pytest.raises(TokenSpecError, match="changed"):
        _load(stale, tokenizer)
    with pytest.raises(TokenSpecError, match="changed"):
        resolve_token_spec(stale)


def test_windows_are_disjoint_slices_of_the_stream() -> None:
    stream = np.arange(1, 101, dtype=np.int64)  # 100 tokens -> 11 windows of 9
    tokens = pack_windows(stream, n_sequences=11, seq_len=10, seed=0, bos_token_id=BOS)
    bodies = tokens[:, 1:]
    assert sorted(bodies[:, 0].tolist()) == list(range(1, 100, 9))
    assert (bodies[:, 1:] - bodies[:, :-1] == 1).all()
    with pytest.raises(TokenSpecError, match="only 11 sequences"):
        pack_windows(stream, n_sequences=12, seq_len=10, seed=0, bos_token_id=BOS)


def test_too_little_text_says_how_many_are_available(tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "t.txt").write_text("a short text " * 5)
    spec = TokenSpec(source="corpus", path=str(tmp_path), n_sequences=50, seq_len=16)
    with pytest.raises(TokenSpecError, match=r"yields only \d+ sequences"):
        _load(spec, tokenizer)


def test_text_source_seq_len_checks(tokenizer, corpus_dir: Path) -> None:  # type: ignore[no-untyped-def]
    spec = TokenSpec(source="corpus", path=str(corpus_dir), n_sequences=2, seq_len=65)
    with pytest.raises(TokenSpecError, match="n_ctx=64"):
        _load(spec, tokenizer)
    with pytest.raises(TokenSpecError, match="no evaluated positions"):
        _load(spec.model_copy(update={"seq_len": 2}), tokenizer)
    with pytest.raises(TokenSpecError, match="needs a path"):
        _load(TokenSpec(source="corpus", n_sequences=2, seq_len=8), tokenizer)


def test_npy_is_used_exactly(tmp_path: Path) -> None:
    array = np.random.default_rng(0).integers(1, VOCAB, size=(5, 12), dtype=np.int32)
    path = tmp_path / "t.npy"
    np.save(path, array)
    spec = resolve_token_spec(TokenSpec(source="npy", path=str(path), n_sequences=0, seq_len=0))
    assert (spec.n_sequences, spec.seq_len) == (5, 12)
    assert spec.fingerprint
    tokens = _load(spec, None)
    assert tokens.dtype == torch.long
    assert torch.equal(tokens, torch.from_numpy(array.astype(np.int64)))  # no BOS added


@pytest.mark.parametrize(
    ("array", "match"),
    [
        (np.zeros((2, 3, 4), dtype=np.int64), "2-D"),
        (np.zeros((2, 8), dtype=np.float32), "integers"),
        (np.full((2, 8), -1, dtype=np.int64), "negative"),
        (np.full((2, 8), VOCAB, dtype=np.int64), f"id {VOCAB}.*d_vocab={VOCAB}"),
        (np.zeros((2, 65), dtype=np.int64), "n_ctx=64"),
        (np.zeros((2, 2), dtype=np.int64), "no evaluated positions"),
        (np.zeros((0, 8), dtype=np.int64), "no sequences"),
    ],
)
def test_npy_errors(tmp_path: Path, array: np.ndarray, match: str) -> None:
    path = tmp_path / "t.npy"
    np.save(path, array)
    with pytest.raises(TokenSpecError, match=match):
        _load(TokenSpec(source="npy", path=str(path), n_sequences=0, seq_len=0), None)


def test_npy_unreadable_and_mismatched(tmp_path: Path) -> None:
    missing = str(tmp_path / "no.npy")
    with pytest.raises(TokenSpecError, match="does not exist"):
        _load(TokenSpec(source="npy", path=missing, n_sequences=0, seq_len=0), None)
    garbage = tmp_path / "g.npy"
    garbage.write_bytes(b"not an array")
    with pytest.raises(TokenSpecError, match="cannot read"):
        _load(TokenSpec(source="npy", path=str(garbage), n_sequences=0, seq_len=0), None)
    good = tmp_path / "ok.npy"
    np.save(good, np.ones((3, 8), dtype=np.int64))
    with pytest.raises(TokenSpecError, match="n_sequences=4"):
        _load(TokenSpec(source="npy", path=str(good), n_sequences=4, seq_len=8), None)
    with pytest.raises(TokenSpecError, match="seq_len=9"):
        _load(TokenSpec(source="npy", path=str(good), n_sequences=3, seq_len=9), None)


def test_validate_tokens_vocab_message() -> None:
    with pytest.raises(TokenSpecError, match=r"id 500 .*d_vocab=400"):
        validate_tokens(torch.tensor([[0, 1, 500]]), d_vocab=400, n_ctx=8)


def test_pile_without_network_is_a_clear_error(tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    import builtins

    real_import = builtins.__import__

    def no_datasets(name: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        if name == "datasets":
            raise ImportError("no datasets")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_datasets)
    with pytest.raises(TokenSpecError, match="datasets"):
        _load(TokenSpec(source="pile", n_sequences=2, seq_len=16), tokenizer)


def test_random_repeated_tokens_structure() -> None:
    tokens = random_repeated_tokens(8, 20, d_vocab=7, bos_token_id=3, seed=1)
    assert tokens.shape == (8, 41)
    assert tokens.dtype == torch.long
    assert (tokens[:, 0] == 3).all()
    first, second = tokens[:, 1:21], tokens[:, 21:]
    assert torch.equal(first, second)
    assert not (first == 3).any()
    assert first.min() >= 0
    assert first.max() < 7
    assert set(first.unique().tolist()) == {0, 1, 2, 4, 5, 6}
    assert torch.equal(tokens, random_repeated_tokens(8, 20, 7, 3, seed=1))
    assert not torch.equal(tokens, random_repeated_tokens(8, 20, 7, 3, seed=2))
    with pytest.raises(TokenSpecError):
        random_repeated_tokens(0, 4, 7, 3, seed=0)


def test_text_sources_need_a_tokenizer() -> None:
    from compute.errors import TokenSpecError
    from compute.tokens import TokenSpec, load_tokens

    spec = TokenSpec(source="builtin", n_sequences=2, seq_len=16)
    with pytest.raises(TokenSpecError, match="no tokenizer"):
        load_tokens(spec, None, bos_token_id=0, d_vocab=100, n_ctx=64)


# --------------------------------------------------------------------------- the Pile, offline


PILE_DOCS = builtin_corpus_documents()[:600]


@pytest.fixture
def fake_pile(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, bool]]:
    """`datasets.load_dataset` answering with a local stream of documents (a real
    `datasets.IterableDataset`, so its real seeded shuffle runs); records how it was called."""
    datasets = pytest.importorskip("datasets")
    calls: list[tuple[str, str, bool]] = []

    def rows():  # type: ignore[no-untyped-def]
        for i, text in enumerate(PILE_DOCS):
            yield {"text": text, "meta": {"index": i}}

    def load_dataset(name: str, split: str, streaming: bool = False, **kwargs):  # type: ignore[no-untyped-def]
        calls.append((name, split, streaming))
        return datasets.IterableDataset.from_generator(rows)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_pile_documents_are_sampled_at_random_seeded(fake_pile) -> None:  # type: ignore[no-untyped-def]
    import itertools

    import datasets

    stream = datasets.load_dataset(PILE_DATASET, split="train", streaming=True)
    first = list(itertools.islice(sample_documents(stream, seed=0), 50))
    assert first == list(itertools.islice(sample_documents(stream, seed=0), 50))
    assert first != list(itertools.islice(sample_documents(stream, seed=1), 50))
    positions = [PILE_DOCS.index(doc) for doc in first]
    assert positions != sorted(positions)  # not the stream's order ...
    assert max(positions) > 200  # ... and not its head: documents from all over it


def test_pile_tokens_are_a_seeded_sample_with_a_fingerprint(tokenizer, fake_pile) -> None:  # type: ignore[no-untyped-def]
    from compute.tokens import _tokenize_stream

    spec = resolve_token_spec(TokenSpec(source="pile", n_sequences=4, seq_len=32, seed=0))
    assert spec.fingerprint is None  # nothing to pin before it is streamed
    a, b = _load(spec, tokenizer), _load(spec, tokenizer)
    assert fake_pile == [(PILE_DATASET, "train", True)] * 2
    assert a.shape == (4, 32)
    assert (a[:, 0] == BOS).all()
    assert torch.equal(a, b)
    assert windows_fingerprint(a) == windows_fingerprint(b)
    other = _load(spec.model_copy(update={"seed": 1}), tokenizer)
    assert windows_fingerprint(other) != windows_fingerprint(a)
    # Not the windows the first documents of the stream give.
    head = pack_windows(_tokenize_stream(tokenizer, PILE_DOCS[:100], BOS), n_sequences=4,
                        seq_len=32, seed=0, bos_token_id=BOS)
    assert not torch.equal(a, head)
    # A spec pinned to the fingerprint loads the same windows; a stream that no longer yields
    # them (here: pinned to other windows) is refused.
    pinned = resolve_token_spec(spec.model_copy(update={"fingerprint": windows_fingerprint(a)}))
    assert pinned.fingerprint == windows_fingerprint(a)
    assert torch.equal(_load(pinned, tokenizer), a)
    stale = spec.model_copy(update={"fingerprint": windows_fingerprint(other)})
    with pytest.raises(TokenSpecError, match="not the same data"):
        _load(stale, tokenizer)


def test_pile_stream_failure_is_a_clear_error(tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    datasets = pytest.importorskip("datasets")

    def offline(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise ConnectionError("no route to huggingface.co")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(TokenSpecError, match="network access"):
        _load(TokenSpec(source="pile", n_sequences=2, seq_len=16), tokenizer)


def test_windows_fingerprint_against_a_byte_by_byte_reference() -> None:
    import hashlib
    import struct

    tokens = torch.tensor([[0, 5, 70000], [0, 2**40, 3]])
    reference = hashlib.sha256(b"int64 2 3\n" + b"".join(
        struct.pack("<q", int(t)) for t in tokens.flatten())).hexdigest()
    assert windows_fingerprint(tokens) == reference
    assert len(reference) == 64
    small = torch.tensor([[0, 5, 7], [0, 9, 3]])
    assert windows_fingerprint(small.int()) == windows_fingerprint(small)  # ids, not dtype
    assert windows_fingerprint(tokens.reshape(3, 2)) != reference  # the shape counts
    changed = tokens.clone()
    changed[1, 2] = 4
    assert windows_fingerprint(changed) != reference


def test_builtin_windows_fingerprint_is_stable(tokenizer) -> None:  # type: ignore[no-untyped-def]
    spec = resolve_token_spec(TokenSpec(source="builtin", n_sequences=3, seq_len=16, seed=2))
    first = windows_fingerprint(_load(spec, tokenizer))
    assert first == windows_fingerprint(_load(spec, tokenizer))
    assert first != windows_fingerprint(_load(spec.model_copy(update={"seed": 3}), tokenizer))


def test_token_streams_are_remembered_per_tokenizer_and_documents(
        tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """A process tokenizes the same documents with the same tokenizer once: the remembered
    stream is what tokenizing again would give (read-only); another tokenizer, other
    documents, documents split elsewhere or another separator are tokenized afresh."""
    import compute.tokens as tokens_module

    monkeypatch.setattr(tokens_module, "_STREAMS", type(tokens_module._STREAMS)())
    calls: list[int] = []
    real = tokens_module._tokenize_stream

    def counted(tok, documents, separator_id):  # type: ignore[no-untyped-def]
        calls.append(len(documents))
        return real(tok, documents, separator_id)

    monkeypatch.setattr(tokens_module, "_tokenize_stream", counted)
    docs = builtin_corpus_documents()[:50]
    first = tokens_module.tokenized_stream(tokenizer, docs, BOS)
    again = tokens_module.tokenized_stream(tokenizer, list(docs), BOS)
    assert len(calls) == 1
    assert again is first
    assert not first.flags.writeable
    assert np.array_equal(first, real(tokenizer, docs, BOS))  # the reference: no memory
    other_tokenizer = train_bpe_tokenizer(builtin_corpus_documents()[300:500], vocab_size=VOCAB)
    other = tokens_module.tokenized_stream(other_tokenizer, docs, BOS)
    assert np.array_equal(other, real(other_tokenizer, docs, BOS))
    assert not np.array_equal(other, first)
    joined = [docs[0] + "\n\n" + docs[1], *docs[2:]]  # the same text, one document fewer
    assert not np.array_equal(tokens_module.tokenized_stream(tokenizer, joined, BOS), first)
    assert np.array_equal(tokens_module.tokenized_stream(tokenizer, docs, 1),
                          real(tokenizer, docs, 1))
    assert len(calls) == 4
    # a slow tokenizer (no backend to fingerprint) is never remembered
    class Slow:
        def __call__(self, batch, add_special_tokens):  # type: ignore[no-untyped-def]
            return {"input_ids": [[len(text) % VOCAB] for text in batch]}

    for _ in range(2):
        assert tokens_module.tokenized_stream(Slow(), docs, BOS).tolist()[:3] == \
            [len(docs[0]) % VOCAB, BOS, len(docs[1]) % VOCAB]
    assert len(calls) == 6
    # a bounded memory: the least recently used stream goes first (the first one here)
    assert tokens_module.STREAM_CACHE_SIZE == len(tokens_module._STREAMS) == 4
    tokens_module.tokenized_stream(tokenizer, docs[:10], BOS)
    assert len(tokens_module._STREAMS) == 4
    tokens_module.tokenized_stream(other_tokenizer, docs, BOS)  # still remembered
    assert len(calls) == 7
    assert np.array_equal(tokens_module.tokenized_stream(tokenizer, docs, BOS), first)
    assert len(calls) == 8


def test_token_stream_keys_see_the_wrapper_and_big_streams_are_not_kept(
        tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Same tokenizer.json, but special tokens split: another key. A stream over the byte
    budget is tokenized every time, never kept."""
    import copy

    import compute.tokens as tokens_module

    splitting = copy.deepcopy(tokenizer)
    splitting.split_special_tokens = not getattr(tokenizer, "split_special_tokens", False)
    assert tokens_module._tokenizer_fingerprint(splitting) != \
        tokens_module._tokenizer_fingerprint(tokenizer)
    assert tokens_module._tokenizer_fingerprint(copy.deepcopy(tokenizer)) == \
        tokens_module._tokenizer_fingerprint(tokenizer)
    monkeypatch.setattr(tokens_module, "_STREAMS", type(tokens_module._STREAMS)())
    monkeypatch.setattr(tokens_module, "STREAM_CACHE_MAX_BYTES", 1)
    docs = builtin_corpus_documents()[:5]
    first = tokens_module.tokenized_stream(tokenizer, docs, BOS)
    again = tokens_module.tokenized_stream(tokenizer, docs, BOS)
    assert again is not first
    assert np.array_equal(again, first)
    assert len(tokens_module._STREAMS) == 0
