"""Celery's filesystem transport, with a lost or unreadable broker folder treated as a lost
connection: the worker waits and reconnects (as it does for Redis or RabbitMQ) instead of
exiting on the first `OSError`."""

from __future__ import annotations

from kombu.transport import filesystem


class Transport(filesystem.Transport):
    connection_errors = (*filesystem.Transport.connection_errors, OSError)  # type: ignore[assignment]
