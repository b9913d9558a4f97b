"""The hot path: output and delta events are forwarded untouched, whatever they are, and only the first
of each type takes the slow path.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from eventguard import guard
from eventguard.guard.referee import Referee
from eventguard.testing.streams import Scripted, stream_events, terminal

from .helpers import (
    ClaimsEveryClass,
    CountingSink,
    drain,
)


@pytest.fixture
def slow_path(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every event the slow path (``Referee.event``) is given, in order."""
    seen: list[Any] = []
    original = Referee.event

    def counting(self: Referee, e: Any) -> Any:
        seen.append(e)
        return original(self, e)

    monkeypatch.setattr(Referee, "event", counting)
    return seen


async def test_an_object_event_with_an_unhashable_type_is_forwarded_untouched() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    odd = SimpleNamespace(type=["not", "a", "string"])
    events = stream_events(1)
    out = await drain(guard(Scripted([*events[:3], odd, *events[3:]]), asyncio.Event()))
    assert out[3] is odd
    assert out[-1]["type"] == "response.completed"


async def test_an_event_that_claims_to_equal_everything_is_still_forwarded() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""

    class EqualsAll:
        type = "response.custom.odd"  # a type not seen before: the first one takes the slow path

        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = object.__hash__

    odd = EqualsAll()
    events = stream_events(1)
    out = await drain(guard(Scripted([*events[:3], odd, odd, *events[3:]]), asyncio.Event()))
    assert [e is odd for e in out].count(True) == 2


async def test_the_slow_path_runs_once_per_output_type_then_the_hot_path_takes_over(
    slow_path: list[Any],
) -> None:
    # The hot path is the guard's cost model (README, benchmarks): an output or delta type goes through
    # the slow path once, and every later event of that type is forwarded without it.
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    events = stream_events(50)
    out = await drain(guard(Scripted(events), asyncio.Event()))
    assert out == events
    assert [e["type"] for e in slow_path] == [
        "response.created",
        "response.in_progress",
        "response.output_text.delta",
        "response.completed",
    ]


async def test_event_objects_of_a_type_already_forwarded_take_the_hot_path_numbered_and_recorded(
    slow_path: list[Any],
) -> None:
    """An event object (an SDK's typed event) has its type as an attribute, not a key: the hot loop's
    lookup fails on it, and the object is forwarded from its own lane after that lookup, as a dict of
    that type is: without the slow path, numbered in order, handed to the recorder.

    Origin: the 2026-12-06 rewrite of the hot loop; with that lane gone every such object took the slow
    path, and with its recorder call gone the sink missed them."""
    deltas = [SimpleNamespace(type="response.output_text.delta", delta=f"d{i}") for i in range(5)]
    events = [*stream_events(0, final=None), *deltas, terminal()]
    sink = CountingSink()
    async with asyncio.timeout(5):
        out = await drain(guard(Scripted(events), asyncio.Event(), sink=sink))
    assert out == events
    assert [e for e in slow_path if e in deltas] == deltas[:1]  # the first of its type, then the hot path
    assert sink.events == list(range(len(out)))


async def test_an_event_type_that_is_a_str_subclass_never_joins_the_hot_path(
    slow_path: list[Any],
) -> None:
    """Only plain ``str`` types join the hot path's set: a ``str`` subclass (other than a string enum,
    which is read as its value) can hash and compare as it likes, so every such event is looked at on the
    slow path, and forwarded as it is.

    Origin: a mutant that survived the run over guard/referee.py (docs/mutation.md): ``type(etype) is
    str and not self.slow`` becoming ``or`` took a ``str`` subclass onto the hot path."""

    class Tag(str):
        """An event type wrapped in a ``str`` subclass, as a typed client may hand it out."""

    delta = Tag("response.output_text.delta")
    events = [*stream_events(0, final=None), *({"type": delta, "delta": f"d{i}"} for i in range(3))]
    events.append(terminal())
    out = await drain(guard(Scripted(events), asyncio.Event()))
    assert out == events
    assert [e["type"] for e in slow_path if type(e["type"]) is Tag] == [delta] * 3


async def test_an_object_events_type_whose_class_claims_to_be_str_never_joins_the_hot_path(
    slow_path: list[Any],
) -> None:
    """The hot path takes an object event's type only when its class is ``str`` itself, not a class that
    says it equals ``str``: such a type may hash and compare as a hot type does, and is looked at on the
    slow path every time, and forwarded as it is.

    Origin: the 2026-12-02 mutation run over core.py: ``etype.__class__ is str`` becoming ``==`` took it
    onto the hot path."""

    class OddType(metaclass=ClaimsEveryClass):
        """Hashes and compares as ``"response.output_text.delta"``; no str."""

        def __eq__(self, other: object) -> bool:
            return other == "response.output_text.delta"

        def __hash__(self) -> int:
            return hash("response.output_text.delta")

    odd = SimpleNamespace(type=OddType(), delta="x")
    first = {"type": "response.output_text.delta", "delta": "d"}  # its type joins the hot set
    events = [*stream_events(0, final=None), first, odd, odd, terminal()]
    out = await drain(guard(Scripted(events), asyncio.Event()))
    assert [e is odd for e in out].count(True) == 2
    assert [e is odd for e in slow_path].count(True) == 2


@pytest.mark.parametrize("final", ["completed", None])
@pytest.mark.parametrize("deltas", [255, 256, 257, 511, 512, 1_000])
async def test_every_event_is_numbered_once_and_in_order_however_long_the_stream(
    deltas: int, final: str | None
) -> None:
    # The hot loop keeps its own count and hands it to the referee only on the slow path and at
    # the end (core.py): the numbers the recorder gets, and the count the lifecycle ends with, hold
    # over long runs of hot events (past CPython's small ints, and a counter folded every 256
    # events was tried), with a slow-path event in the middle, and when the stream ends on a delta
    # (no terminal: the hot path's count is the last word).
    events = stream_events(deltas, final)
    odd = {"type": "response.output_item.added", "output_index": 1, "item": {"type": "message"}}
    at = [2 + deltas // 2, 2 + 255]
    script = list(events)
    for i in sorted(at, reverse=True):
        script.insert(min(i, len(script) - 1), dict(odd))  # before the last event, whatever it is
    sink = CountingSink()
    g = guard(Scripted(script), asyncio.Event(), sink=sink)
    async with asyncio.timeout(10):
        out = await drain(g)
    assert len(out) == len(script) + (final is None)  # the guard's own terminal for a stream without one
    # Every event the guard forwards, lifecycle events included, is numbered 0, 1, 2, ... in order.
    assert sink.events == list(range(len(out)))
    assert g.lifecycle.events_forwarded == len(out)  # the guard's own terminal, when it sent one, included


@pytest.mark.parametrize("taken", [255, 256, 300, 700])
async def test_a_consumer_that_stops_early_leaves_the_count_of_what_it_was_given(taken: int) -> None:
    # The count the lifecycle keeps when the consumer closes the guard mid-stream (a careless
    # caller's break out of async for, then aclose) is what was handed over, taken from the hot
    # loop's own count on the exception's way out.
    g = guard(Scripted(stream_events(1_000)), asyncio.Event())
    got = 0
    async with asyncio.timeout(10):
        async for _ in g:
            got += 1
            if got == taken:
                break
        await g.aclose()
    assert g.lifecycle.events_forwarded == taken
