"""Token specifications and the deterministic token batches a run evaluates.

Sources (`TokenSpec.source`):
  builtin  the built-in corpus (`compute.corpus`, "python-stdlib-docs")
  corpus   a user text file or folder of .txt/.md files (`path`)
  npy      a `.npy` array [n_sequences, seq_len] of token ids, used exactly as given (`path`)
  pile     the deduplicated Pile (`EleutherAI/the_pile_deduplicated`) streamed with `datasets`:
           documents sampled at random, seeded (needs network access to the Hugging Face hub)

For text sources every document is tokenized with the model's tokenizer, documents are joined
with the BOS/EOS id between them, the stream is cut into non-overlapping windows of seq_len-1
tokens, `n_sequences` windows are chosen with `numpy.random.default_rng(seed)` (a permutation,
no replacement), and BOS is prepended: `seq_len` counts the BOS. Evaluated positions are
1..seq_len-2 (docs/metrics.md), so seq_len must be at least 3.

The Pile is too large to read in order: its documents are streamed in a seeded random order
(`IterableDataset.shuffle(seed=seed, buffer_size=PILE_SHUFFLE_BUFFER)`: the dataset's shards in a
seeded order, each document drawn at random from a buffer of the next 10,000) and taken until
their tokens fill PILE_OVERSAMPLE times the windows asked for; the windows are then chosen as for
any text source. `windows_fingerprint` (SHA-256 of the exact token windows) identifies what any
source yielded; a Pile spec that carries it as `fingerprint` is pinned: a stream that no longer
yields those windows is refused.

>>> spec = TokenSpec(source="builtin", n_sequences=8, seq_len=128)
>>> spec = resolve_token_spec(spec)        # fills in the corpus fingerprint
>>> tokens = load_tokens(spec, tokenizer, bos_token_id=0, d_vocab=4096, n_ctx=128)  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from jaxtyping import Int
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from compute.corpus import (
    builtin_corpus_documents,
    documents_fingerprint,
    read_corpus,
)
from compute.errors import TokenSpecError

TokenSource = Literal["builtin", "corpus", "npy", "pile"]
MIN_SEQ_LEN = 3  # BOS, one evaluated position, one target
PILE_DATASET = "EleutherAI/the_pile_deduplicated"
PILE_SHUFFLE_BUFFER = 10_000
PILE_OVERSAMPLE = 2  # stream twice the tokens the windows need, so windows are chosen among them
PILE_MAX_DOCUMENTS = 100_000
TOKENIZE_BATCH = 256


class TokenSpec(BaseModel):
    """Which tokens a run evaluates. Stored with the run; `fingerprint` pins the content."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    source: TokenSource
    path: str | None = None
    n_sequences: int = Field(ge=0)  # 0 (npy only): take it from the file
    seq_len: int = Field(ge=0)  # total length, BOS included; 0 (npy only): from the file
    seed: int = 0
    fingerprint: str | None = None


def _check_spec(spec: TokenSpec) -> None:
    if spec.source in ("corpus", "npy") and not spec.path:
        raise TokenSpecError(f"token source {spec.source!r} needs a path")
    if spec.source != "npy":
        if spec.n_sequences < 1:
            raise TokenSpecError(f"n_sequences must be at least 1, got {spec.n_sequences}")
        if spec.seq_len < MIN_SEQ_LEN:
            raise TokenSpecError(
                f"seq_len={spec.seq_len} leaves no evaluated positions (positions 1..seq_len-2); "
                f"use seq_len >= {MIN_SEQ_LEN}"
            )


def _file_fingerprint(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as exc:
        raise TokenSpecError(f"cannot read token file {path}: {exc}") from exc
    return digest.hexdigest()[:16]


def _load_npy(path: Path, *, mmap: bool = False) -> np.ndarray:
    if not path.is_file():
        raise TokenSpecError(f"token file {path} does not exist")
    try:
        array = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise TokenSpecError(
            f"cannot read {path} as a .npy array ({exc}); save tokens with numpy.save"
        ) from exc
    if not isinstance(array, np.ndarray):
        raise TokenSpecError(f"{path} holds no single .npy array (an .npz archive?)")
    return array


def resolve_token_spec(spec: TokenSpec) -> TokenSpec:
    """Fill in the content fingerprint (and, for npy, a 0 n_sequences/seq_len from the file).

    Two runs with the same resolved spec evaluate the same tokens. The Pile cannot be
    fingerprinted before it is streamed: its spec keeps the fingerprint it was given (the
    `windows_fingerprint` of an earlier run, which pins it) or none.
    """
    _check_spec(spec)
    update: dict[str, Any] = {}
    if spec.source == "builtin":
        update["fingerprint"] = documents_fingerprint(builtin_corpus_documents())
    elif spec.source == "corpus":
        update["fingerprint"] = documents_fingerprint(read_corpus(str(spec.path)))
    elif spec.source == "npy":
        path = Path(str(spec.path))
        array = _load_npy(path, mmap=True)
        if array.ndim == 2:
            if spec.n_sequences == 0:
                update["n_sequences"] = int(array.shape[0])
            if spec.seq_len == 0:
                update["seq_len"] = int(array.shape[1])
        update["fingerprint"] = _file_fingerprint(path)
    found = update.get("fingerprint")
    if spec.fingerprint is not None and found is not None and found != spec.fingerprint:
        raise TokenSpecError(
            f"the {spec.source} tokens changed: fingerprint {found} does not match the spec's "
            f"{spec.fingerprint} (a different file, or another Python version for the built-in "
            "corpus)"
        )
    return spec.model_copy(update=update)


def validate_tokens(
    tokens: Int[Tensor, "batch pos"], *, d_vocab: int, n_ctx: int, what: str = "tokens"
) -> None:
    """Checks shared by every source: shape, seq_len within the context, ids within the vocab."""
    if tokens.ndim != 2:
        raise TokenSpecError(f"{what} must be 2-D [n_sequences, seq_len], got {tokens.ndim}-D")
    n_sequences, seq_len = tokens.shape
    if n_sequences < 1:
        raise TokenSpecError(f"{what} hold no sequences")
    if seq_len < MIN_SEQ_LEN:
        raise TokenSpecError(
            f"{what} have seq_len={seq_len}: no evaluated positions (positions 1..seq_len-2); "
            f"use seq_len >= {MIN_SEQ_LEN}"
        )
    if seq_len > n_ctx:
        raise TokenSpecError(
            f"{what} have seq_len={seq_len} but the model's context is n_ctx={n_ctx}; "
            f"use seq_len <= {n_ctx}"
        )
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0:
        raise TokenSpecError(f"{what} contain a negative id ({low}); ids must be >= 0")
    if high >= d_vocab:
        raise TokenSpecError(
            f"{what} contain id {high} but the model's vocabulary has d_vocab={d_vocab} "
            f"(ids 0..{d_vocab - 1}); were they made with another tokenizer?"
        )


def _tokenizer_fingerprint(tokenizer: Any) -> str | None:
    """SHA-256 of a fast tokenizer's whole definition (vocabulary, merges, normalizer,
    pre-tokenizer, added tokens: `backend_tokenizer.to_str()`), its class and the one wrapper
    option that changes encoding (`split_special_tokens`); None for a slow tokenizer or one
    whose definition cannot be written out (a custom Python component)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        definition = backend.to_str()
    except Exception:  # custom components do not serialise: not remembered
        return None
    wrapper = f"{type(tokenizer).__qualname__} {getattr(tokenizer, 'split_special_tokens', None)}"
    return hashlib.sha256(f"{wrapper}\n{definition}".encode()).hexdigest()


# The token streams of the last few (tokenizer, documents, separator) a process tokenized: a
# worker runs job after job with one model's tokenizer on the built-in corpus (~0.5 s to
# tokenize for a 4k vocabulary, seconds for a large one). Read-only arrays, so no caller can
# change what the next one reads.
_STREAMS: OrderedDict[tuple[str, str, int], np.ndarray] = OrderedDict()
STREAM_CACHE_SIZE = 4
STREAM_CACHE_MAX_BYTES = 64 << 20  # 8M tokens; a larger stream (a big user corpus) is not kept
_streams_lock = threading.Lock()


def _documents_key(documents: Sequence[str]) -> str:
    """SHA-256 of the documents, each as its length and its UTF-8 bytes (where one document
    ends is part of the key: the separator id goes between documents)."""
    digest = hashlib.sha256()
    for document in documents:
        data = document.encode("utf-8")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def tokenized_stream(tokenizer: Any, documents: Sequence[str], separator_id: int) -> np.ndarray:
    """`_tokenize_stream`, remembered per process for a fast tokenizer: the key is the
    tokenizer's fingerprint, the documents' key and the separator."""
    tokenizer_key = _tokenizer_fingerprint(tokenizer)
    if tokenizer_key is None:
        return _tokenize_stream(tokenizer, documents, separator_id)
    key = (tokenizer_key, _documents_key(documents), separator_id)
    with _streams_lock:
        if key in _STREAMS:
            _STREAMS.move_to_end(key)
            return _STREAMS[key]
    stream = _tokenize_stream(tokenizer, documents, separator_id)
    stream.flags.writeable = False
    if stream.nbytes > STREAM_CACHE_MAX_BYTES:
        return stream
    with _streams_lock:
        _STREAMS[key] = stream
        while len(_STREAMS) > STREAM_CACHE_SIZE:
            _STREAMS.popitem(last=False)
    return stream


def _tokenize_stream(tokenizer: Any, documents: Sequence[str], separator_id: int) -> np.ndarray:
    """Tokenize documents in batches and join them with `separator_id` between them."""
    pieces: list[np.ndarray] = []
    separator = np.array([separator_id], dtype=np.int64)
    for start in range(0, len(documents), TOKENIZE_BATCH):
        batch = list(documents[start : start + TOKENIZE_BATCH])
        for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]:
            if pieces:
                pieces.append(separator)
            pieces.append(np.asarray(ids, dtype=np.int64))
    if not pieces:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(pieces)


def pack_windows(
    stream: np.ndarray, *, n_sequences: int, seq_len: int, seed: int, bos_token_id: int
) -> Int[Tensor, "n_sequences seq_len"]:
    """Choose `n_sequences` non-overlapping windows of seq_len-1 tokens, each prefixed by BOS.

    Windows are chosen with `numpy.random.default_rng(seed).permutation` (no replacement).
    """
    body = seq_len - 1
    available = available_windows(len(stream), seq_len)
    if available < n_sequences:
        raise _too_few(available, len(stream), n_sequences, seq_len)
    chosen = window_order(available, seed)[:n_sequences]
    return _with_bos(stream[: available * body].reshape(available, body)[chosen], bos_token_id)


def available_windows(n_tokens: int, seq_len: int) -> int:
    """How many windows of `seq_len` tokens (BOS included) a text of `n_tokens` tokens yields."""
    return n_tokens // (seq_len - 1)


def _too_few(available: int, n_tokens: int, n_sequences: int, seq_len: int) -> TokenSpecError:
    return TokenSpecError(
        f"the text yields only {available} sequences of seq_len={seq_len} "
        f"({n_tokens} tokens) but {n_sequences} were requested; ask for at most "
        f"{available}, shorten seq_len, or give more text"
    )


def _longest_piece(tokenizer: Any) -> int | None:
    """The most characters one token of the tokenizer's vocabulary spells, if it lists one."""
    try:
        return max((len(piece) for piece in tokenizer.get_vocab()), default=None)
    except Exception:  # a tokenizer without a vocabulary to list: no bound
        return None


def check_text_yields(spec: TokenSpec, tokenizer: Any) -> None:
    """Refuse a text source (builtin, corpus) that asks for more sequences than its text yields
    with this tokenizer: the `TokenSpecError` `load_tokens` would raise in a worker, raised
    where a job is submitted, with the model's tokenizer alone (no weights).

    Cheap when the request plainly fits: every token spells at most `longest` characters of
    the text (a byte-level piece one byte per character, a SentencePiece piece its own
    characters; byte fallbacks fewer), so a text of C characters yields at least C / longest
    tokens. Otherwise the text is tokenized as the worker will (`tokenized_stream`, kept per
    process) and its windows counted as `pack_windows` counts them. Other sources, and a
    model without a tokenizer, are not checked here."""
    if spec.source not in ("builtin", "corpus") or tokenizer is None:
        return
    _check_spec(spec)
    documents = (
        builtin_corpus_documents() if spec.source == "builtin" else read_corpus(str(spec.path))
    )
    needed = spec.n_sequences * (spec.seq_len - 1)
    longest = _longest_piece(tokenizer)
    if longest and needed * longest <= sum(len(d) for d in documents):
        return
    separator = next(
        (
            int(v)
            for v in (getattr(tokenizer, a, None) for a in ("bos_token_id", "eos_token_id"))
            if v is not None
        ),
        0,
    )  # the worker's (`LoadedModel.bos_token_id`), so its stream is the one kept here
    stream = tokenized_stream(tokenizer, documents, separator)
    available = available_windows(len(stream), spec.seq_len)
    if available < spec.n_sequences:
        raise _too_few(available, len(stream), spec.n_sequences, spec.seq_len)


def _with_bos(windows: np.ndarray, bos_token_id: int) -> Int[Tensor, "n seq_len"]:
    bos = np.full((windows.shape[0], 1), bos_token_id, dtype=np.int64)
    return torch.from_numpy(np.concatenate([bos, windows], axis=1))


def window_order(available: int, seed: int) -> np.ndarray:
    """The seeded order of a text's windows: a run evaluates the first `n_sequences`, a tuned
    lens trains on the last ones (`training_windows`)."""
    return np.random.default_rng(seed).permutation(available)


def window_split(
    available: int, *, n_evaluated: int, n_training: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the evaluated windows (the head of `window_order`) and of the training split
    (its tail). Disjoint by construction; refused when the text has too few windows for both."""
    if n_evaluated + n_training > available:
        raise TokenSpecError(
            f"the text yields {available} windows: too few for {n_evaluated} evaluated and "
            f"{n_training} training sequences that do not overlap; evaluate fewer sequences, "
            "train on fewer, shorten seq_len or give more text"
        )
    order = window_order(available, seed)
    return order[:n_evaluated], order[available - n_training :]


# Token sources a tuned lens can be trained on (`training_windows`).
TRAINING_SOURCES = ("builtin", "corpus")


def check_training_source(spec: TokenSpec) -> None:
    """Refuse a token source with no training split (before anything is loaded)."""
    if spec.source not in TRAINING_SOURCES:
        raise TokenSpecError(
            f"token source {spec.source!r} has no training split for a tuned lens (only the "
            "built-in corpus and text corpora do); train on a text source, or import a lens"
        )


def training_windows(
    spec: TokenSpec,
    tokenizer: Any,
    *,
    n_training: int,
    bos_token_id: int,
    d_vocab: int,
    n_ctx: int,
) -> Int[Tensor, "n_training seq_len"]:
    """The training split of a text source: the last `n_training` windows of the seeded order
    whose first `spec.n_sequences` windows the run evaluates, so the two never overlap; BOS
    prepended as for the run. Only text sources (built-in corpus, text file or folder) have one:
    a `.npy` is evaluated exactly as given, and the Pile's stream depends on the windows asked
    for."""
    check_training_source(spec)
    if tokenizer is None:
        raise TokenSpecError("this model has no tokenizer: its lens cannot be trained on text")
    _check_spec(spec)
    if spec.seq_len > n_ctx:
        raise TokenSpecError(f"seq_len={spec.seq_len} exceeds the model's context n_ctx={n_ctx}")
    documents = (
        builtin_corpus_documents() if spec.source == "builtin" else read_corpus(str(spec.path))
    )
    stream = tokenized_stream(tokenizer, documents, bos_token_id)
    body = spec.seq_len - 1
    available = len(stream) // body
    _, chosen = window_split(
        available, n_evaluated=spec.n_sequences, n_training=n_training, seed=spec.seed
    )
    tokens = _with_bos(stream[: available * body].reshape(available, body)[chosen], bos_token_id)
    validate_tokens(tokens, d_vocab=d_vocab, n_ctx=n_ctx, what="training tokens")
    return tokens


def windows_fingerprint(tokens: Int[Tensor, "n_sequences seq_len"]) -> str:
    """SHA-256 (64 hex digits) of the exact token windows: their shape, then the ids as
    little-endian int64, row by row. Equal fingerprints mean the same tokens in the same order.

    >>> windows_fingerprint(torch.tensor([[0, 1, 2]]))[:16]
    '02e7291bc62c733a'
    """
    array = np.ascontiguousarray(tokens.detach().cpu().numpy().astype("<i8"))
    digest = hashlib.sha256(f"int64 {array.shape[0]} {array.shape[1]}\n".encode())
    digest.update(array.tobytes())
    return digest.hexdigest()


def _open_pile() -> Any:
    """The deduplicated Pile's train split as a `datasets` stream (nothing is downloaded whole)."""
    try:
        import datasets
    except ImportError as exc:
        raise TokenSpecError(
            "token source 'pile' needs the `datasets` package: pip install 'strata[pile]'"
        ) from exc
    return datasets.load_dataset(PILE_DATASET, split="train", streaming=True)


def sample_documents(dataset: Any, seed: int) -> Iterator[str]:
    """The non-empty `text` of a streamed dataset's rows in a seeded random order
    (`dataset.shuffle(seed=seed, buffer_size=PILE_SHUFFLE_BUFFER)`)."""
    for row in dataset.shuffle(seed=seed, buffer_size=PILE_SHUFFLE_BUFFER):
        text = str(row["text"])
        if text.strip():
            yield text


def _pile_stream(spec: TokenSpec, tokenizer: Any, separator_id: int) -> np.ndarray:
    """Token ids of randomly sampled Pile documents joined with `separator_id`, enough for
    PILE_OVERSAMPLE times the windows the spec asks for (or PILE_MAX_DOCUMENTS documents)."""
    need = PILE_OVERSAMPLE * spec.n_sequences * (spec.seq_len - 1)
    pieces: list[np.ndarray] = []
    n_tokens = 0
    separator = np.array([separator_id], dtype=np.int64)
    try:
        for n_docs, text in enumerate(sample_documents(_open_pile(), spec.seed), start=1):
            if pieces:
                pieces.append(separator)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            pieces.append(np.asarray(ids, dtype=np.int64))
            n_tokens += len(ids) + 1
            if n_tokens >= need or n_docs >= PILE_MAX_DOCUMENTS:
                break
    except TokenSpecError:
        raise
    except Exception as exc:
        raise TokenSpecError(
            f"could not stream {PILE_DATASET} ({type(exc).__name__}: {exc}); the Pile needs "
            "network access to the Hugging Face hub; use source 'builtin', 'corpus' or 'npy'"
        ) from exc
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


def _load_npy_tokens(spec: TokenSpec) -> Int[Tensor, "n_sequences seq_len"]:
    path = Path(str(spec.path))
    array = _load_npy(path)
    if array.ndim != 2:
        raise TokenSpecError(
            f"{path} has shape {array.shape}; token arrays must be 2-D [n_sequences, seq_len]"
        )
    if not np.issubdtype(array.dtype, np.integer):
        raise TokenSpecError(
            f"{path} has dtype {array.dtype}; token ids must be integers (e.g. int64)"
        )
    n_sequences, seq_len = (int(d) for d in array.shape)
    for field, expected, actual in (
        ("n_sequences", spec.n_sequences, n_sequences),
        ("seq_len", spec.seq_len, seq_len),
    ):
        if expected not in (0, actual):
            raise TokenSpecError(
                f"the spec says {field}={expected} but {path} has {field}={actual} "
                f"(shape {array.shape}); fix the spec or leave {field}=0 to take it from the file"
            )
    if np.issubdtype(array.dtype, np.unsignedinteger) and array.size and array.max() > 2**62:
        raise TokenSpecError(f"{path} contains ids too large for int64")
    return torch.from_numpy(array.astype(np.int64, copy=True))


def load_tokens(
    spec: TokenSpec,
    tokenizer: Any,
    *,
    bos_token_id: int,
    d_vocab: int,
    n_ctx: int,
) -> Int[Tensor, "n_sequences seq_len"]:
    """The token batch a spec describes, validated against the model: int64 [n, seq_len].

    `tokenizer` is the model's Hugging Face tokenizer (unused for npy). If the spec carries a
    fingerprint, the content must still match it. Raises `TokenSpecError` with what to fix.
    """
    _check_spec(spec)
    fingerprint: str | None
    if spec.source == "npy":
        tokens = _load_npy_tokens(spec)
        fingerprint = _file_fingerprint(Path(str(spec.path)))
        what = f"tokens in {spec.path}"
    else:
        if spec.seq_len > n_ctx:
            raise TokenSpecError(
                f"seq_len={spec.seq_len} exceeds the model's context n_ctx={n_ctx}; "
                f"use seq_len <= {n_ctx}"
            )
        if tokenizer is None:
            raise TokenSpecError(
                "this model has no tokenizer, so text cannot be tokenized for it; give "
                "pre-tokenized ids as a .npy file (--tokens)"
            )
        if spec.source == "pile":
            stream = _pile_stream(spec, tokenizer, bos_token_id)
        else:
            documents = (
                builtin_corpus_documents()
                if spec.source == "builtin"
                else read_corpus(str(spec.path))
            )
            fingerprint = documents_fingerprint(documents)
            stream = tokenized_stream(tokenizer, documents, bos_token_id)
        tokens = pack_windows(
            stream,
            n_sequences=spec.n_sequences,
            seq_len=spec.seq_len,
            seed=spec.seed,
            bos_token_id=bos_token_id,
        )
        what = f"{spec.source} tokens"
        if spec.source == "pile":
            fingerprint = windows_fingerprint(tokens)
            if spec.fingerprint is not None and fingerprint != spec.fingerprint:
                raise TokenSpecError(
                    f"the Pile sample differs from the pinned one: its windows' fingerprint is "
                    f"{fingerprint}, the spec's {spec.fingerprint} ({PILE_DATASET} changed "
                    "upstream, or another tokenizer); these are not the same data"
                )
    if spec.fingerprint is not None and fingerprint is not None and fingerprint != spec.fingerprint:
        raise TokenSpecError(
            f"the {spec.source} tokens changed: fingerprint {fingerprint} does not match the "
            f"spec's {spec.fingerprint}"
        )
    validate_tokens(tokens, d_vocab=d_vocab, n_ctx=n_ctx, what=what)
    return tokens


def random_repeated_tokens(
    n_sequences: int, n: int, d_vocab: int, bos_token_id: int, seed: int
) -> Int[Tensor, "n_sequences seq"]:
    """BOS, r_1..r_n, r_1..r_n per row: the induction-head probe, [n_sequences, 1 + 2n].

    r is drawn uniformly from ids [0, d_vocab) excluding `bos_token_id`, with a
    `torch.Generator` seeded with `seed` (the global RNG is untouched).

    >>> t = random_repeated_tokens(2, 4, 50, 0, seed=0)
    >>> t.shape, bool((t[:, 1:5] == t[:, 5:]).all()), bool((t[:, 0] == 0).all())
    (torch.Size([2, 9]), True, True)
    """
    if n_sequences < 1 or n < 1:
        raise TokenSpecError(f"need n_sequences >= 1 and n >= 1, got {n_sequences} and {n}")
    if d_vocab < 2:
        raise TokenSpecError(f"d_vocab={d_vocab} leaves no ids besides BOS")
    generator = torch.Generator().manual_seed(seed)
    draws = torch.randint(0, d_vocab - 1, (n_sequences, n), generator=generator)
    if 0 <= bos_token_id < d_vocab:
        draws = draws + (draws >= bos_token_id).long()  # skip over the BOS id
    bos = torch.full((n_sequences, 1), bos_token_id, dtype=torch.long)
    return torch.cat([bos, draws, draws], dim=1)
