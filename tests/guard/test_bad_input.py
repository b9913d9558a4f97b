"""Bad input (not in strict mode): a malformed, out-of-order or late lifecycle event is explained by an
anomaly, forwarded only when the host can take it, and never moves the recorded ending.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from eventguard import Cause, State, guard
from eventguard.testing.streams import (
    Scripted,
    event,
    host_context,
    stream_events,
)

from .helpers import (
    collect,
    drain,
)


async def test_queued_after_in_progress_is_out_of_order_and_changes_nothing() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    events = stream_events(1)
    events.insert(2, event("response.queued"))
    g = guard(Scripted(events), asyncio.Event())
    out = await drain(g)
    assert len(out) == len(events)
    assert [a.kind for a in g.lifecycle.anomalies] == ["out_of_order"]
    assert g.lifecycle.anomalies[0].event_type == "response.queued"
    assert [t.to_state for t in g.lifecycle.transitions] == [State.IN_PROGRESS, State.COMPLETED]


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ({"delta": "x"}, "event has no 'type'"),
        ({"type": None}, "event has no 'type'"),
        ({"type": ""}, "event has no 'type'"),
        ({"type": 5}, "event 'type' is 5"),
    ],
)
async def test_a_mapping_without_a_usable_type_is_explained(bad: dict[str, Any], reason: str) -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    events = stream_events(1)
    events.insert(2, bad)
    g = guard(Scripted(events), asyncio.Event())
    await drain(g)
    (anomaly,) = g.lifecycle.anomalies
    assert anomaly.reason.startswith(reason)
    assert anomaly.payload == bad


async def test_an_invalid_lifecycle_event_is_forwarded_with_an_anomaly() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    bad = {"type": "response.in_progress", "response": "not an object"}
    events = stream_events(1)
    events.insert(2, bad)
    g = guard(Scripted(events), asyncio.Event())
    out = await drain(g)
    assert bad in out
    (anomaly,) = g.lifecycle.anomalies
    assert anomaly.kind == "invalid_lifecycle_event"
    assert anomaly.event_type == "response.in_progress"


async def test_an_invalid_terminal_still_ends_the_lifecycle_by_its_type() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    events = stream_events(1, final=None)
    events.append({"type": "response.incomplete", "response": "not an object"})
    g = guard(Scripted(events), asyncio.Event())
    out = await drain(g)
    assert out[-1]["type"] == "response.incomplete"
    assert g.lifecycle.state is State.INCOMPLETE
    # Recorded as forwarded, never as a failure, but flagged: nothing in it could be checked.
    assert g.lifecycle.unverified
    assert [a.kind for a in g.lifecycle.anomalies] == ["invalid_lifecycle_event", "unverified_completion"]


async def test_a_status_that_contradicts_the_terminal_type_is_explained() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    events = stream_events(1, final=None)
    events.append({"type": "response.completed", "response": {"id": "resp_1", "status": "failed"}})
    g = guard(Scripted(events), asyncio.Event())
    await drain(g)
    assert g.lifecycle.state is State.COMPLETED
    (anomaly,) = g.lifecycle.anomalies
    assert anomaly.kind == "status_mismatch"
    assert anomaly.reason.endswith("; the event type wins")


async def test_a_lifecycle_event_after_the_recorded_ending_is_not_forwarded_nor_applied() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    ctx = host_context(background=False)
    sig = asyncio.Event()
    events = stream_events(1)
    events.insert(1, event("response.queued"))
    g = guard(Scripted(events), sig, context=ctx, cancel_grace=0.05)
    async with asyncio.timeout(5):
        it = aiter(g)
        await anext(it)
        ctx.shutdown.set()
        await asyncio.sleep(0.3)  # the host stopped iterating: the ending is recorded (abandoned)
        assert g.lifecycle.ended
        rest = [e async for e in it]
    assert rest == []
    assert [a.kind for a in g.lifecycle.anomalies] == ["abandoned", "event_after_terminal"]
    assert g.lifecycle.anomalies[1].event_type == "response.queued"
    assert [t.to_state for t in g.lifecycle.transitions] == [State.IN_PROGRESS, State.FAILED]


async def test_bytes_that_are_not_utf8_in_a_snapshot_neither_stop_the_stream_nor_the_written_terminal() -> (
    None
):
    """Origin: a fuzzed stream (tests/reliability/test_hostile.py) whose ``response.created`` held
    ``b"\\x80"`` killed the guard's iteration with ``UnicodeDecodeError`` (pydantic's JSON dump)."""
    events = stream_events(1, final=None)
    events[1] = {
        "type": "response.in_progress",
        "response": {"id": "resp_1", "status": "in_progress", "raw": b"\x80"},
    }
    g = guard(Scripted(events), asyncio.Event())
    async with asyncio.timeout(5):
        out = await drain(g)
    assert out[: len(events)] == events
    # The stream ended without a terminal: the one the guard writes carries the snapshot, as JSON.
    written = out[-1]
    assert written["type"] == "response.failed"
    assert written["response"]["raw"] == "gA=="  # b"\x80" as base64
    orjson.dumps(written)
    assert "not_serialisable" in [a.kind for a in g.lifecycle.anomalies]
    assert g.lifecycle.state is State.FAILED


class _Halt(BaseException):
    """A BaseException that is none of asyncio's or the host's."""


class _TypeRaises:
    """An event object whose ``type`` cannot be read."""

    @property
    def type(self) -> str:
        raise RuntimeError("reading the type failed")


class _TypeRaisesBase:
    """An event object whose ``type`` raises a BaseException when read."""

    @property
    def type(self) -> str:
        raise _Halt("reading the type failed")


class _LookupRaisesBase:
    """An event whose ``event["type"]`` raises a BaseException."""

    def __getitem__(self, key: str) -> Any:
        raise _Halt("reading the type failed")


@pytest.mark.parametrize(
    ("odd", "error"),
    [(_TypeRaises(), RuntimeError), (_TypeRaisesBase(), _Halt), (_LookupRaisesBase(), _Halt)],
)
async def test_an_event_whose_type_cannot_be_read_is_the_guards_own_error_recorded_and_raised(
    odd: object, error: type[BaseException]
) -> None:
    """Reading an event's type is the guard's own work, so what it raises is the guard's error (phase 1
    of the hot loop): the stream ends failed with that error, the inner stream is closed, the error goes
    through. Not the inner stream's ending (a BaseException from the inner stream is ``interrupted``
    for recovery), and not an error thrown in by the consumer (which records nothing of its own).
    Iterated without ``async with``, whose exit would record an ending for the consumer's error.
    Origin: the 2026-12-02 mutation run over core.py (``phase = 1`` made 2 or 0 in both of the hot
    loop's ``except`` clauses around the type's lookup; the ``except BaseException`` clause made one
    that never matches)."""
    events = stream_events(1)
    g = guard(Scripted([*events[:3], odd, *events[3:]]), asyncio.Event())
    with pytest.raises(error, match="reading the type failed"):
        await collect(g)
    assert (g.lifecycle.state, g.lifecycle.cause) == (State.FAILED, Cause.ERROR)
    assert g.lifecycle.error is not None and g.lifecycle.error.message == "reading the type failed"
    assert g.inner_closed == 1
