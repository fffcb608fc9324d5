"""The API process's upkeep thread: every few seconds, re-queue jobs whose worker was lost,
send jobs no message was sent for, and look at the watch folder; now and then, say on the
console how far the jobs are."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from service.jobs.service import JobService
from service.jobs.watch import WatchFolder

log = logging.getLogger("strata.jobs")


class Upkeep:
    def __init__(
        self, jobs: JobService, watch: WatchFolder | None, say: Callable[[str], None] | None = None
    ) -> None:
        self.jobs = jobs
        self.watch = watch
        self.say = say
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_said = 0.0
        self._last_line = ""

    def start(self) -> None:
        self.jobs.grace_running()
        if self.jobs.settings.jobs.reconcile:
            self.jobs.reconcile_soon()
        self._thread = threading.Thread(target=self._loop, name="strata-upkeep", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.jobs.stop()

    def tick(self) -> None:
        self.jobs.requeue_lost()
        if self.watch is not None and self.watch.scan() and self.jobs.settings.jobs.reconcile:
            self.jobs.reconcile()
        self.report()

    def report(self) -> None:
        """A console line on the jobs while any are queued or running (and one when the last
        ends), at most every `progress_log_s` seconds."""
        every = self.jobs.settings.jobs.progress_log_s
        if self.say is None or not every or time.monotonic() - self._last_said < every:
            return
        line = self.jobs.summary()
        active = "running" in line or "queued" in line
        if line and (active or line != self._last_line):
            self.say(line)
        self._last_line = line
        self._last_said = time.monotonic()

    def _loop(self) -> None:
        interval = self.jobs.settings.jobs.maintenance_interval_s
        while not self._stop.wait(interval):
            try:
                self.tick()
            except Exception:  # logged; the next round tries again
                log.exception("job upkeep failed")
