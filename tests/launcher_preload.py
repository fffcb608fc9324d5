"""Imported once by the tests' zygote (tests/launcher.py) before it forks `strata`
processes: what a worker and the API import first, and nothing that reads the settings (each
child reads them from its own environment). Imports only, and pure-Python caches: a process that
has run a torch operation before forking leaves its children's thread pools deadlocked."""
# ruff: noqa: F401

import celery.bin.worker
import celery.worker
import kombu.transport.filesystem
import litestar
import uvicorn

import compute.run
import service.api.app
import service.cli
import service.exports
import service.serve
from compute.corpus import builtin_corpus_documents
from compute.models import import_engine

import_engine()
builtin_corpus_documents()
