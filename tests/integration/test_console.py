"""`strata serve`'s console filter: Strata's own records and everyone's errors reach the
console; what libraries say goes to the log file. The console of a real first start, run as
the README says, is checked in `test_first_run.py`."""

from __future__ import annotations

import logging
from pathlib import Path

from service.serve import _ConsoleFilter

ROOT = Path(__file__).resolve().parents[2]
CHATTER = ["Loading model config from local directory", "No hostname was supplied",
           "Changing model dtype", "Loading weights", "Uvicorn running on"]


def test_the_console_filter_keeps_stratas_records_and_everyones_errors() -> None:
    def record(name: str, level: int) -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, "m", None, None)

    keep = _ConsoleFilter().filter
    assert keep(record("strata.jobs", logging.INFO))
    assert keep(record("strata", logging.WARNING))
    assert keep(record("kombu.connection", logging.ERROR))
    assert not keep(record("kombu.connection", logging.WARNING))
    assert not keep(record("root", logging.INFO))
    assert not keep(record("stratasphere", logging.WARNING))
    assert not keep(record("uvicorn.error", logging.INFO))
