"""A cause flag that raises when read (a remote flag store that is down, a context property that
fails) is taken as not set and recorded as a ``flag_unreadable`` anomaly: the stream's own ending is
recorded, the inner stream is closed, and every forwarded event is stored.

Before, the read's error ended the guard's bookkeeping halfway: every ending asks for the flags, so
the row stayed ``in_progress`` for good, the inner stream was never closed, and the client got the
flag's error instead of the ``completed`` the stream produced."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from eventguard import guard
from eventguard.sink import SqlSink
from eventguard.store import ResponseStore

from .conftest import Target
from .helpers import script


class FailsAfter:
    """A flag whose ``is_set()`` answers False ``ok`` times, then raises."""

    def __init__(self, ok: int) -> None:
        self.ok = ok
        self.calls = 0

    def is_set(self) -> bool:
        self.calls += 1
        if self.calls > self.ok:
            raise ConnectionError("the flag store is unreachable")
        return False


class Context:
    """A host context whose ``client_cancelled`` property or ``shutdown`` flag raises."""

    def __init__(self, broken: str) -> None:
        self.response_id = None
        self._broken = broken
        self.shutdown: Any = FailsAfter(0) if broken == "shutdown" else None

    @property
    def client_cancelled(self) -> bool:
        if self._broken == "client_cancelled":
            raise LookupError("the session is gone")
        return False


CASES = {
    "signal": ({"cancellation_signal": FailsAfter(0)}, "cancellation_signal"),
    "signal, after it answered once": ({"cancellation_signal": FailsAfter(1)}, "cancellation_signal"),
    "process_shutdown": ({"process_shutdown": FailsAfter(0)}, "process_shutdown"),
    "context.client_cancelled": ({"context": Context("client_cancelled")}, "context.client_cancelled"),
    "context.shutdown": ({"context": Context("shutdown")}, "context.shutdown"),
}


@pytest.mark.parametrize("stop_after", [None, 3], ids=["to the end", "consumer breaks after 3"])
@pytest.mark.parametrize("case", list(CASES))
async def test_a_flag_that_raises_when_read_is_recorded_and_the_streams_own_ending_stands(
    target: Target, case: str, stop_after: int | None
) -> None:
    kwargs, flag = CASES[case]
    kwargs = {"cancellation_signal": asyncio.Event(), **kwargs}
    rid = f"resp_flag_{len(case)}_{stop_after}"
    closed: list[int] = []

    async def inner() -> AsyncIterator[Any]:
        try:
            for ev in script(rid, n_deltas=4):
                await asyncio.sleep(0)
                yield ev
        finally:
            closed.append(1)

    sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
    await sink.start()
    seen: list[Any] = []
    try:
        async with asyncio.timeout(30):
            g = guard(inner(), sink=sink, cancel_grace=None, **kwargs)
            async with g:
                async for ev in g:
                    seen.append(ev)
                    if stop_after is not None and len(seen) == stop_after:
                        break
    finally:
        await sink.aclose()
    async with ResponseStore(target.url, schema=target.schema) as store, asyncio.timeout(30):
        record = await store.get(rid)
        history = await store.history(rid)
        found = await store.anomalies(response_id=rid, kind="flag_unreadable")
    assert closed == [1]
    assert record is not None and history is not None
    if stop_after is None:
        assert [ev["type"] for ev in seen][-1] == "response.completed"
        assert (record.status, record.cause) == ("completed", "normal")
    else:
        assert len(seen) == stop_after
        assert (record.status, record.cause) == ("failed", "closed_early")
    assert record.event_count == len(seen)
    assert sum(len(a.events) for a in history.attempts) == len(seen)
    # Once per flag, whatever the number of reads; the reason names the flag and the error's type.
    assert [a.reason for a in found.items] == [f"{flag} raised {_error(case)} when read: taken as not set"]


def _error(case: str) -> str:
    return "LookupError" if case == "context.client_cancelled" else "ConnectionError"


class Answers:
    """A flag whose ``is_set()`` answers ``value``, whatever it is."""

    def __init__(self, value: object) -> None:
        self.value = value

    def is_set(self) -> object:
        return self.value


class PlainContext:
    """A host context whose flags are plain values, as given."""

    def __init__(self, client_cancelled: object = False, shutdown: object = None) -> None:
        self.response_id = None
        self.client_cancelled = client_cancelled
        self.shutdown = shutdown


NOT_BOOLS = {
    "context.client_cancelled is 'false'": (
        {"context": PlainContext(client_cancelled="false")},
        "context.client_cancelled",
    ),
    "context.shutdown is 'no'": ({"context": PlainContext(shutdown="no")}, "context.shutdown"),
    "signal.is_set() answers an object": ({"cancellation_signal": Answers(object())}, "cancellation_signal"),
    "process_shutdown.is_set() answers 'False'": ({"process_shutdown": Answers("False")}, "process_shutdown"),
}


@pytest.mark.parametrize("case", list(NOT_BOOLS))
async def test_a_flag_that_is_not_a_bool_is_unreadable_not_read_for_its_truth(
    target: Target, case: str
) -> None:
    """Read for its truth, ``"false"`` was a cancel: the stream's ``completed`` was withheld and the
    response recorded ``cancelled``, the opposite of what was sent."""
    kwargs, flag = NOT_BOOLS[case]
    kwargs = {"cancellation_signal": asyncio.Event(), **kwargs}
    rid = f"resp_not_bool_{len(case)}"
    events = script(rid, n_deltas=2)
    sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
    await sink.start()
    seen: list[Any] = []

    async def inner() -> AsyncIterator[Any]:
        for ev in events:
            yield ev

    try:
        async with asyncio.timeout(30):
            async with guard(inner(), sink=sink, cancel_grace=None, **kwargs) as g:
                seen.extend([ev async for ev in g])
    finally:
        await sink.aclose()
    async with ResponseStore(target.url, schema=target.schema) as store, asyncio.timeout(30):
        record = await store.get(rid)
        found = await store.anomalies(response_id=rid, kind="flag_unreadable")
    assert seen == events
    assert record is not None and (record.status, record.cause) == ("completed", "normal")
    assert [a.reason for a in found.items] == [f"{flag} raised TypeError when read: taken as not set"]
