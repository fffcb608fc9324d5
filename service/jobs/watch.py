"""The watch folder: a checkpoint folder that appears in it is registered under its folder name,
and a GGUF file under its stem (and so computed, by reconciliation).

A folder is taken once it holds `config.json` and nothing in it has changed for `settle_s`
seconds; a `.gguf` file once it has not changed for `settle_s` seconds (a copy in progress is
left alone). What fails to register is tried again only after it changes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("strata.jobs")


def _newest_mtime(folder: Path) -> float:
    return max((p.stat().st_mtime for p in folder.iterdir()), default=folder.stat().st_mtime)


class WatchFolder:
    def __init__(self, root: Path, register: Callable[[Path], bool], settle_s: float = 2.0) -> None:
        self.root = root
        self.register = register
        self.settle_s = settle_s
        self._seen: dict[Path, float] = {}  # folder -> mtime when it was last tried

    def scan(self) -> list[Path]:
        """Register new settled checkpoint folders; the folders registered this time."""
        if not self.root.is_dir():
            return []
        registered = []
        now = time.time()
        for folder in sorted(self.root.iterdir()):
            try:
                if folder.is_file() and folder.suffix.lower() == ".gguf":
                    mtime = folder.stat().st_mtime
                elif (folder / "config.json").is_file():
                    mtime = _newest_mtime(folder)
                else:
                    continue
            except OSError:  # removed or unreadable meanwhile: next round
                continue
            if now - mtime < self.settle_s or self._seen.get(folder) == mtime:
                continue
            self._seen[folder] = mtime
            try:
                if self.register(folder):
                    registered.append(folder)
            except Exception as exc:  # one bad folder must not stop the others
                log.warning("watch folder: %s not registered: %s", folder, exc)
        return registered
