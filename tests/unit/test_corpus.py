"""The built-in corpus and user corpora on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compute.corpus import (
    BUILTIN_CORPUS_NAME,
    builtin_corpus_documents,
    builtin_corpus_text,
    corpus_fingerprint,
    documents_fingerprint,
    read_corpus,
)
from compute.errors import TokenSpecError


def test_builtin_corpus_is_large_and_deterministic() -> None:
    text = builtin_corpus_text()
    assert 1_000_000 < len(text) < 3_000_000
    assert BUILTIN_CORPUS_NAME == "python-stdlib-docs"
    docs = builtin_corpus_documents()
    assert len(docs) == len(set(docs)), "documents are deduplicated"
    assert all(d == d.strip() and d for d in docs)
    assert "\n\n".join(docs) == text
    assert documents_fingerprint(docs) == corpus_fingerprint(text)


def test_builtin_corpus_ignores_monkeypatching(monkeypatch: pytest.MonkeyPatch) -> None:
    """Extraction runs in a fresh interpreter, so patches in this process do not leak in."""
    import logging

    import compute.corpus as corpus

    before = corpus_fingerprint(builtin_corpus_text())

    def shout(self: logging.Logger, msg: str) -> None:
        """A method some library bolted onto Logger."""

    monkeypatch.setattr(logging.Logger, "shout", shout, raising=False)
    fresh = corpus._extract_in_fresh_interpreter()  # what a cache miss stores
    assert documents_fingerprint(fresh) == before


def test_builtin_corpus_is_cached_per_interpreter(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Extracted once, kept in the user's cache folder, read back as it was written; a damaged
    cache file is extracted again and replaced."""
    import compute.corpus as corpus

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    want = builtin_corpus_documents()
    corpus._builtin_documents.cache_clear()
    try:
        assert not corpus._cache_file().exists()
        assert builtin_corpus_documents() == want  # a miss: extracted, then stored
        path = corpus._cache_file()
        assert path.parent.parent == tmp_path / "strata"
        assert json.loads(path.read_text("utf-8")) == want
        assert [p.name for p in path.parent.iterdir()] == [path.name]  # no partial file left
        path.write_text(json.dumps(["only this"]), "utf-8")
        corpus._builtin_documents.cache_clear()
        assert builtin_corpus_documents() == ["only this"]  # a hit reads the file
        path.write_text("{not json", "utf-8")
        corpus._builtin_documents.cache_clear()
        assert builtin_corpus_documents() == want  # damaged: extracted again
        assert json.loads(path.read_text("utf-8")) == want
    finally:
        corpus._builtin_documents.cache_clear()


def test_fingerprint_is_a_sha256_prefix() -> None:
    assert corpus_fingerprint("a") == corpus_fingerprint("a")
    assert corpus_fingerprint("a") != corpus_fingerprint("b")
    assert len(corpus_fingerprint("a")) == 16


def test_read_corpus_file_and_folder(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "two.md").write_text("second\n")
    (tmp_path / "a.txt").write_text("  first  ")
    (tmp_path / "empty.txt").write_text("   \n")
    (tmp_path / "skip.json").write_text("{}")
    assert read_corpus(tmp_path) == ["first", "second"]
    assert read_corpus(tmp_path / "a.txt") == ["first"]


def test_read_corpus_errors(tmp_path: Path) -> None:
    with pytest.raises(TokenSpecError, match="does not exist"):
        read_corpus(tmp_path / "missing")
    with pytest.raises(TokenSpecError, match="holds no"):
        read_corpus(tmp_path)
    (tmp_path / "e.txt").write_text("")
    with pytest.raises(TokenSpecError, match="empty"):
        read_corpus(tmp_path)
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\xfa")
    with pytest.raises(TokenSpecError, match="cannot read"):
        read_corpus(tmp_path / "bad.txt")
