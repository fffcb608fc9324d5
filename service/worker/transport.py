"""Celery's filesystem transport, made safe for the one-machine default:

- a lost or unreadable broker folder is a lost connection: the worker waits and reconnects (as
  it does for Redis or RabbitMQ) instead of exiting on the first `OSError`;
- a message appears in the queue folder whole. Kombu's own `_put` creates the message file under
  its final name and then writes it; a consumer polling in between (a loaded machine's scheduler
  need only pause the producer there) takes the empty file, fails to decode it and stops
  consuming, and the message is lost (seen: a worker of the job tests, 2026-12-07). Here the
  message is written under a name no consumer reads and renamed into place, which is atomic
  within one folder;
- messages are read in the order they were put. Kombu names a message by the millisecond, and
  its consumers read names in sorted order, so messages put within one millisecond came out in
  the order of their random suffixes. Here the name starts with the monotonic clock in
  nanoseconds (shared by every process of the machine), zero-padded so that sorting the names
  sorts the times;
- a message file that does not decode (written by something else, or cut short by a full disk)
  is logged and skipped; kombu's consumer raised and stopped. The message is lost either way
  (kombu removes the file before decoding it); the API's leases requeue its job.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

log = logging.getLogger("strata.broker")
_last_ns = 0
_clock = threading.Lock()


def _stamp() -> str:
    """The monotonic clock in nanoseconds, strictly increasing within this process, as 20
    digits."""
    global _last_ns
    with _clock:
        _last_ns = max(time.monotonic_ns(), _last_ns + 1)
        return f"{_last_ns:020d}"


class Channel(filesystem.Channel):
    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:  # type: ignore[override]  # kombu passes **kwargs
        """Put `message` onto `queue`: written in full, then renamed to the name kombu's
        consumers look for (`<time>_<uuid>.<queue>.msg`, read in sorted order)."""
        name = f"{_stamp()}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f"{uuid.uuid4()}.partial")  # never "<q>.msg"
        data = str_to_bytes(dumps(message))
        try:
            with open(partial, "wb", buffering=0) as f:
                f.write(data)
            os.replace(partial, final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _get(self, queue: str, timeout: Any = None) -> Any:
        """The next message of `queue`, skipping any that does not decode."""
        while True:
            try:
                return super()._get(queue)
            except ValueError as exc:  # json's JSONDecodeError, UnicodeDecodeError
                log.error(
                    "broker folder %s: skipped a message of queue %s that does not decode "
                    "(%s); its job, if any, is requeued when its lease runs out",
                    self.data_folder_in,
                    queue,
                    exc,
                )


class Transport(filesystem.Transport):
    Channel = Channel
    connection_errors = (*filesystem.Transport.connection_errors, OSError)  # type: ignore[assignment]
