"""Text corpora: the built-in offline English corpus and user corpora on disk.

The built-in corpus (`python-stdlib-docs`) needs no network: it is the Python reference manual's
topic pages (`pydoc_data.topics`) followed by the docstrings of a fixed list of standard-library
modules, their public classes and functions, and the public methods of those classes: about
1.7 MB of technical English on Python 3.11. Its exact text depends on the Python version, which
is why every run records `corpus_fingerprint` of the text it used.

>>> text = builtin_corpus_text()
>>> len(text) > 1_000_000
True
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

from compute.errors import TokenSpecError

BUILTIN_CORPUS_NAME = "python-stdlib-docs"
DOCUMENT_SEPARATOR = "\n\n"
CORPUS_SUFFIXES = (".txt", ".md")

# An explicit list, so the corpus does not depend on which optional modules a build happens to
# have. Modules that fail to import (a minimal build without e.g. `sqlite3`) are skipped; the
# fingerprint records the difference.
# fmt: off
STDLIB_MODULES: tuple[str, ...] = (
    "abc", "argparse", "array", "ast", "asyncio", "base64", "binascii", "bisect", "builtins",
    "bz2", "calendar", "cmath", "cmd", "code", "codecs", "codeop", "collections", "colorsys",
    "concurrent.futures", "configparser", "contextlib", "copy", "csv", "dataclasses", "datetime",
    "decimal", "difflib", "dis", "doctest", "email", "email.message", "enum", "filecmp",
    "fileinput", "fnmatch", "fractions", "ftplib", "functools", "gc", "getopt", "gettext", "glob",
    "graphlib", "gzip", "hashlib", "heapq", "hmac", "html", "http.client", "http.cookies",
    "http.server", "imaplib", "inspect", "io", "ipaddress", "itertools", "json", "linecache",
    "locale", "logging", "lzma", "mailbox", "math", "mimetypes", "mmap", "multiprocessing",
    "netrc", "numbers", "operator", "optparse", "os", "os.path", "pathlib", "pdb", "pickle",
    "platform", "plistlib", "poplib", "pprint", "profile", "queue", "quopri", "random", "re",
    "sched", "secrets", "select", "selectors", "shlex", "shutil", "signal", "smtplib", "socket",
    "statistics", "stat", "string", "stringprep", "struct", "subprocess", "sys", "tarfile",
    "tempfile", "textwrap", "threading", "time", "timeit", "tokenize", "trace", "traceback",
    "tracemalloc", "types", "typing", "unicodedata", "unittest", "urllib.parse",
    "urllib.request", "uuid", "warnings", "wave", "weakref", "xml.etree.ElementTree",
    "xmlrpc.client", "zipfile", "zipimport", "zlib",
    "collections.abc", "compileall", "contextvars", "copyreg", "ctypes", "dbm", "email.parser",
    "email.headerregistry", "email.utils", "html.parser", "http.cookiejar", "importlib",
    "importlib.metadata", "importlib.resources", "keyword", "logging.config", "logging.handlers",
    "multiprocessing.pool", "pkgutil", "py_compile", "pyclbr", "pydoc", "reprlib", "runpy",
    "shelve", "site", "socketserver", "sqlite3", "ssl", "symtable", "sysconfig", "token",
    "tomllib", "unittest.mock", "urllib.robotparser", "venv", "wsgiref.simple_server",
    "wsgiref.handlers", "xml.dom.minidom", "xml.sax", "zipapp",
    "email.charset", "email.generator", "email.header", "email.policy", "tkinter",
    "tkinter.ttk", "turtle", "xml.dom.pulldom", "xml.sax.saxutils",
)
# fmt: on


def _public_docstrings(obj: object) -> list[str]:
    """Docstrings of a module's public classes and functions, and of those classes' methods."""
    docs: list[str] = []
    for name, member in sorted(inspect.getmembers(obj), key=lambda item: item[0]):
        if name.startswith("_"):
            continue
        if not (inspect.isclass(member) or inspect.isroutine(member)):
            continue
        doc = inspect.getdoc(member)
        if doc:
            docs.append(doc)
        if inspect.isclass(member):
            for method_name, method in sorted(inspect.getmembers(member), key=lambda i: i[0]):
                if not method_name.startswith("_") and inspect.isroutine(method):
                    method_doc = inspect.getdoc(method)
                    if method_doc:
                        docs.append(method_doc)
    return docs


def _extract_documents() -> list[str]:
    """Collect the corpus documents in *this* interpreter (run it in a fresh one)."""
    from pydoc_data.topics import topics

    documents: list[str] = [topics[key] for key in sorted(topics)]
    # Some deprecated aliases (typing.io, ...) warn when their docstring is read.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for module_name in sorted(STDLIB_MODULES):
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            module_doc = inspect.getdoc(module)
            if module_doc:
                documents.append(module_doc)
            documents.extend(_public_docstrings(module))
    seen: set[str] = set()
    unique: list[str] = []
    for doc in documents:
        doc = doc.strip()
        if doc and doc not in seen:
            seen.add(doc)
            unique.append(doc)
    return unique


def _cache_file() -> Path:
    """Where the built-in corpus of this interpreter is kept once extracted: the user's cache
    folder, named by what decides the text (the interpreter's version and standard library, and
    this module's own source, which holds the module list and the extraction)."""
    key = hashlib.sha256(
        "\0".join([sys.version, sys.base_prefix, Path(__file__).read_text("utf-8")]).encode()
    ).hexdigest()[:24]
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "strata" / "corpus" / f"{BUILTIN_CORPUS_NAME}-{key}.json"


def _extract_in_fresh_interpreter() -> list[str]:
    # Libraries monkeypatch the standard library (transformers adds methods to logging.Logger,
    # others wrap inspect functions), so extracting in this process would make the corpus depend
    # on what happens to be imported. A fresh isolated interpreter sees only the standard library.
    code = (
        "import json, sys; from compute.corpus import _extract_documents; "
        "sys.stdout.write(json.dumps(_extract_documents()))"
    )
    package_root = str(Path(__file__).resolve().parent.parent)
    script = f"import sys; sys.path.insert(0, {package_root!r}); {code}"
    try:
        result = subprocess.run(
            [sys.executable, "-I", "-S", "-c", script],
            capture_output=True,
            check=True,
            text=True,
            encoding="utf-8",
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        raise TokenSpecError(f"could not build the built-in corpus: {detail[-500:]}") from exc
    return list(json.loads(result.stdout))


@functools.lru_cache(maxsize=1)
def _builtin_documents() -> tuple[str, ...]:
    """Extracted once per interpreter and kept in the user's cache folder (every worker and
    command would otherwise start a fresh interpreter for it); a cache that cannot be read or
    written is only slower."""
    path = _cache_file()
    try:
        cached = json.loads(path.read_text("utf-8"))
        if isinstance(cached, list) and cached and all(isinstance(d, str) for d in cached):
            return tuple(cached)
    except (OSError, ValueError):
        pass
    documents = _extract_in_fresh_interpreter()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps(documents), "utf-8")
        partial.replace(path)  # atomic: a reader sees the whole file or none
    except OSError:
        pass
    return tuple(documents)


def builtin_corpus_documents() -> list[str]:
    """The built-in corpus as its documents, in order (topic pages, then docstrings).

    Topic pages come first (sorted by key), then the docstrings of `STDLIB_MODULES` in sorted
    module order, members sorted by name. Each distinct document appears once (the first
    occurrence is kept).
    """
    return list(_builtin_documents())


def builtin_corpus_text() -> str:
    """The built-in corpus as one string: its documents separated by a blank line."""
    return DOCUMENT_SEPARATOR.join(_builtin_documents())


def corpus_fingerprint(text: str) -> str:
    """A short content hash of a corpus: the first 16 hex digits of SHA-256 of its UTF-8 text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def documents_fingerprint(documents: list[str]) -> str:
    """`corpus_fingerprint` of documents joined with the document separator."""
    return corpus_fingerprint(DOCUMENT_SEPARATOR.join(documents))


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenSpecError(f"cannot read corpus file {path}: {exc}") from exc


def read_corpus(path: str | Path) -> list[str]:
    """Read a user corpus: one text file, or a folder of `.txt`/`.md` files (recursive).

    A file is one document; a folder yields one document per file, in sorted path order. Files
    that are empty after stripping whitespace are skipped. Raises `TokenSpecError` when the path
    does not exist, cannot be read as UTF-8, or holds no text.
    """
    root = Path(path)
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = sorted(
            p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in CORPUS_SUFFIXES
        )
        if not files:
            raise TokenSpecError(
                f"corpus folder {root} holds no {' or '.join(CORPUS_SUFFIXES)} files"
            )
    else:
        raise TokenSpecError(f"corpus path {root} does not exist (give a text file or a folder)")
    documents = [text.strip() for text in (_read_text(f) for f in files)]
    documents = [doc for doc in documents if doc]
    if not documents:
        raise TokenSpecError(f"corpus at {root} is empty")
    return documents
