"""The guard's side of the sink seam, with a small in-memory recorder."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from eventguard import InvalidEvent, Lifecycle, State, guard
from eventguard.testing.streams import Scripted, block_ignoring_signal, host_context, stream_events


@dataclass
class SlowRecorder:
    lifecycle: Lifecycle
    close_delay: float = 0.0
    events: list[tuple[int, str | None, Any]] = field(default_factory=list)
    changes: int = 0
    closed_with: State | None = None

    def event(self, index: int, event_type: str | None, event: object) -> None:
        self.events.append((index, event_type, event))

    def changed(self) -> None:
        self.changes += 1

    async def close(self) -> None:
        await asyncio.sleep(self.close_delay)
        self.closed_with = self.lifecycle.state


@dataclass
class MemorySink:
    close_delay: float = 0.0
    recorders: list[SlowRecorder] = field(default_factory=list)

    def recorder(self, lifecycle: Lifecycle) -> SlowRecorder:
        rec = SlowRecorder(lifecycle, self.close_delay)
        self.recorders.append(rec)
        return rec


async def test_recorder_sees_every_forwarded_event_in_order_and_the_ending() -> None:
    sink = MemorySink()
    events = stream_events(4)
    async with asyncio.timeout(5):
        out = [e async for e in guard(Scripted(events), asyncio.Event(), sink=sink)]
    (rec,) = sink.recorders
    assert [i for i, _, _ in rec.events] == list(range(len(out)))
    assert [e for _, _, e in rec.events] == out
    assert rec.closed_with is State.COMPLETED
    assert rec.changes >= 2  # started, ended


async def test_final_flush_survives_the_cancellation_of_the_guarding_task() -> None:
    sink = MemorySink(close_delay=0.2)
    inner = Scripted(stream_events(3), before={3: block_ignoring_signal})
    g = guard(inner, asyncio.Event(), context=host_context(), sink=sink)

    async def consume() -> None:
        async for _ in g:
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    task.cancel()  # the guard starts its final flush...
    await asyncio.sleep(0.05)
    task.cancel()  # ...and the host cancels again while it runs
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(5):
            await task
    (rec,) = sink.recorders
    async with asyncio.timeout(5):
        while rec.closed_with is None:  # noqa: ASYNC110 - polling a plain attribute of the fake
            await asyncio.sleep(0.01)
    assert rec.closed_with is State.CANCELLED


async def test_a_hanging_sink_cannot_hang_the_host() -> None:
    sink = MemorySink(close_delay=3600)
    g = guard(Scripted(stream_events(2)), asyncio.Event(), sink=sink, flush_timeout=0.05)
    async with asyncio.timeout(5):
        out = [e async for e in g]
    assert out[-1]["type"] == "response.completed"


async def test_the_count_includes_the_terminal_when_the_terminal_is_recorded() -> None:
    # The row's terminal is written at once and is final: its event count must already include it.
    counts: list[int] = []
    sink = MemorySink()
    g = guard(Scripted(stream_events(3)), asyncio.Event(), sink=sink)
    async with asyncio.timeout(5):
        async for e in g:
            if e["type"] == "response.completed":
                counts.append(g.lifecycle.events_forwarded)
    assert counts == [6]


async def test_a_synthesised_terminal_is_recorded_like_any_forwarded_event() -> None:
    sink = MemorySink()
    async with asyncio.timeout(5):
        out = [e async for e in guard(Scripted(stream_events(2, final=None)), asyncio.Event(), sink=sink)]
    (rec,) = sink.recorders
    assert out[-1]["type"] == "response.failed"
    assert [e for _, _, e in rec.events] == out


async def test_strict_mode_error_still_ends_the_lifecycle() -> None:
    sink = MemorySink()
    g = guard(
        Scripted([*stream_events(1)[:2], 42, *stream_events(1)[2:]]), asyncio.Event(), sink=sink, strict=True
    )
    with pytest.raises(InvalidEvent):
        async with asyncio.timeout(5):
            async for _ in g:
                pass
    assert g.lifecycle.state is State.FAILED
    assert sink.recorders[0].closed_with is State.FAILED


@dataclass
class DeltaObject:
    """An event object rather than a dict (the slow path's first step), of a type the hot path forwards."""

    type: str
    delta: str


async def test_the_recorders_indices_are_ints_counted_without_a_gap_past_the_small_int_cache() -> None:
    """The hot loop counts in a float (cheaper per event); what it hands on is an int, every time:
    the recorder's index, and the lifecycle's count, past 256 and across the slow path's steps."""
    sink = MemorySink()
    events: list[Any] = stream_events(600)
    for i in range(5, len(events) - 1, 97):
        events[i] = DeltaObject(events[i]["type"], events[i]["delta"])
    async with asyncio.timeout(10):
        g = guard(Scripted(events), asyncio.Event(), sink=sink)
        out = [e async for e in g]
    (rec,) = sink.recorders
    indices = [i for i, _, _ in rec.events]
    assert indices == list(range(len(out))) and len(out) == len(events)
    assert {type(i) for i in indices} == {int}
    assert [e for _, _, e in rec.events] == out
    assert type(g.lifecycle.events_forwarded) is int and g.lifecycle.events_forwarded == len(out)
