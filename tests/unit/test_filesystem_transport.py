"""The one-machine broker (`service.worker.transport`, Celery's filesystem transport): a consumer
that polls while a message is being put sees no message or the whole message, never a part; and
messages come out in the order they were put.

Kombu's own transport creates the message file under its final name before it writes it; a
worker that polled in that moment took the empty file, failed to decode it and stopped consuming
(a job of the job tests stayed queued, 2026-12-07, on a loaded 2-core machine). The moment is
reached here deterministically: each file the put opens for writing in the broker folder makes a
second connection poll the queue before the put may write to it."""

from __future__ import annotations

import builtins
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection

TRANSPORT = "service.worker.transport:Transport"


def queue_name(folder: Path) -> str:
    """A queue of this test's own: kombu keeps the bindings it declared in memory, per transport
    class, and would not write a queue's exchange table into a second test's control folder."""
    return "jobs-" + folder.name.replace(".", "-")


def connection(folder: Path, transport: str = TRANSPORT) -> Connection:
    # the exchange tables too (kombu's default control folder is ./control; it must exist)
    (folder / "control").mkdir(exist_ok=True)
    return Connection(transport=transport, transport_options={
        "data_folder_in": str(folder), "data_folder_out": str(folder),
        "control_folder": str(folder / "control")})


def test_a_consumer_polling_during_a_put_sees_nothing_then_the_whole_message(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with connection(tmp_path) as producer, connection(tmp_path) as consumer:
        name = queue_name(tmp_path)
        out, into = producer.SimpleQueue(name), consumer.SimpleQueue(name)
        seen: list[str] = []

        def poll() -> str:
            try:
                message = into.get(block=False)
            except into.Empty:
                return "nothing"
            except Exception as e:  # what the consumer met is the finding
                return f"an error: {e!r}"
            return f"a message: {message.payload!r}"

        real_open = builtins.open

        def open_then_poll(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            f = real_open(file, mode, *args, **kwargs)
            if "w" in mode and Path(file).parent == tmp_path:
                seen.append(poll())  # the file exists, nothing is written to it yet
            return f

        monkeypatch.setattr(builtins, "open", open_then_poll)
        out.put({"job": 7, "padding": "x" * 100_000})
        monkeypatch.undo()
        assert seen  # the put opened at least one file in the folder
        assert set(seen) == {"nothing"}, seen
        message = into.get(timeout=5)
        assert message.payload == {"job": 7, "padding": "x" * 100_000}
        message.ack()
        with pytest.raises(into.Empty):
            into.get(block=False)
        # nothing is left behind: no partial file, no second copy
        assert [p for p in tmp_path.iterdir() if p.is_file()] == []


def test_the_broker_folder_holds_one_file_per_queued_message(tmp_path: Path) -> None:
    with connection(tmp_path) as producer, connection(tmp_path) as consumer:
        name = queue_name(tmp_path)
        out, into = producer.SimpleQueue(name), consumer.SimpleQueue(name)
        for i in range(3):
            out.put({"job": i})
        assert sorted(p.name.split(".", 1)[1] for p in tmp_path.iterdir() if p.is_file()) == [
            f"{name}.msg"] * 3
        assert into.qsize() == 3
        got = []
        for _ in range(3):
            m = into.get(timeout=5)
            got.append(m.payload["job"])
            m.ack()
        assert got == [0, 1, 2]  # oldest first


def test_a_message_that_does_not_decode_is_skipped_and_logged_not_fatal(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A cut-short file (a full disk) or a stranger's: kombu's consumer raised on it and stopped
    consuming; here the consumer logs it and takes the next message."""
    with connection(tmp_path) as producer, connection(tmp_path) as consumer:
        name = queue_name(tmp_path)
        out, into = producer.SimpleQueue(name), consumer.SimpleQueue(name)
        (tmp_path / f"00000000000000000001_cut-short.{name}.msg").write_bytes(b'{"body": "ab')
        out.put({"job": 8})
        message = into.get(timeout=5)
        assert message.payload == {"job": 8}
        message.ack()
    assert any("does not decode" in r.getMessage() and r.levelname == "ERROR"
               for r in caplog.records), caplog.text
