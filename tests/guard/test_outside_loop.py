"""A guard built or iterated outside the event loop it needs says so, in one line, as a typed error.

A sink's recorder belongs to the running event loop, so a guard with a sink cannot be built outside
one (at module level, say) nor iterated in another loop than its own; the watchdog needs a running
loop too. Each of these raises :class:`eventguard.errors.GuardOutsideLoop` (an ``EventGuardError``
and a ``RuntimeError``) telling the user to build the guard inside the coroutine that iterates it,
instead of asyncio's bare "no running event loop" from deep inside.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from eventguard import EventGuardError, Lifecycle, State, guard
from eventguard.errors import GuardOutsideLoop
from eventguard.testing.streams import Scripted, stream_events

ADVICE = "build the guard inside the coroutine that iterates it"


@dataclass
class LoopBoundSink:
    """Like SqlSink: its recorder needs the running loop (its writer task lives there)."""

    loops: list[asyncio.AbstractEventLoop] = field(default_factory=list)
    closes: int = 0

    def recorder(self, lifecycle: Lifecycle) -> LoopBoundSink:
        self.loops.append(asyncio.get_running_loop())
        return self

    def event(self, index: int, event_type: str | None, event: object) -> None:
        pass

    def changed(self) -> None:
        pass

    async def close(self) -> None:
        self.closes += 1


def assert_explained(exc: BaseException) -> None:
    assert isinstance(exc, EventGuardError) and isinstance(exc, RuntimeError)
    text = str(exc)
    assert ADVICE in text
    assert "\n" not in text


def test_a_guard_with_a_sink_built_outside_a_running_loop_is_a_typed_error() -> None:
    sink = LoopBoundSink()
    with pytest.raises(GuardOutsideLoop) as info:
        guard(Scripted(stream_events(1)), asyncio.Event(), sink=sink)
    assert_explained(info.value)
    assert "outside a running event loop" in str(info.value)
    assert sink.loops == []  # refused before the sink was asked for a recorder


def test_a_guard_with_a_sink_built_in_one_loop_and_iterated_in_another_is_a_typed_error() -> None:
    sink = LoopBoundSink()
    inner = Scripted(stream_events(1))

    async def build() -> Any:
        return guard(inner, asyncio.Event(), sink=sink)

    async def iterate(g: Any) -> list[Any]:
        async with asyncio.timeout(5):
            return [e async for e in g]

    async def close(g: Any) -> None:
        async with asyncio.timeout(5):
            await g.aclose()

    g = asyncio.run(build())
    with pytest.raises(GuardOutsideLoop) as info:
        asyncio.run(iterate(g))
    assert_explained(info.value)
    assert "another event loop" in str(info.value)
    asyncio.run(close(g))  # a later close is a no-op: it neither hangs nor raises
    assert sink.closes == 0
    assert inner.produced == []  # the inner stream was never pulled
    assert g.lifecycle.state is State.NEW


def test_a_guard_stepped_with_no_running_loop_is_a_typed_error() -> None:
    g = guard(Scripted(stream_events(1)), asyncio.Event(), cancel_grace=1.0)
    step = g.__anext__()
    with pytest.raises(GuardOutsideLoop) as info:
        step.send(None)
    assert_explained(info.value)
    assert "iterated outside a running event loop" in str(info.value)


def test_a_guard_without_a_sink_may_be_built_before_the_loop_it_runs_in() -> None:
    # Nothing in it belongs to a loop until it is iterated: that keeps working.
    g = guard(Scripted(stream_events(1)), asyncio.Event())

    async def iterate() -> list[Any]:
        async with asyncio.timeout(5):
            return [e async for e in g]

    out = asyncio.run(iterate())
    assert out[-1]["type"] == "response.completed"
    assert g.lifecycle.state is State.COMPLETED


async def test_a_guard_with_a_sink_built_in_the_coroutine_that_iterates_it_works() -> None:
    sink = LoopBoundSink()
    g = guard(Scripted(stream_events(1)), asyncio.Event(), sink=sink)
    async with asyncio.timeout(5), g:
        out = [e async for e in g]
    assert out[-1]["type"] == "response.completed"
    assert sink.loops == [asyncio.get_running_loop()] and sink.closes == 1


def test_a_guard_with_a_sink_and_no_watchdog_iterated_in_another_loop_is_a_typed_error() -> None:
    """``cancel_grace=None`` turns off the watchdog, not the loop check: the recorder still belongs to the
    loop the guard was built in.

    Origin: a mutant that survived the run over guard/core.py (docs/mutation.md): ``self._rec is not
    None`` becoming ``is None`` in the check before the first step let such a guard run."""
    sink = LoopBoundSink()
    inner = Scripted(stream_events(1))

    async def build() -> Any:
        return guard(inner, asyncio.Event(), sink=sink, cancel_grace=None)

    async def iterate(g: Any) -> list[Any]:
        async with asyncio.timeout(5):
            return [e async for e in g]

    g = asyncio.run(build())
    with pytest.raises(GuardOutsideLoop) as info:
        asyncio.run(iterate(g))
    assert_explained(info.value)
    assert "another event loop" in str(info.value)
    assert inner.produced == []


def test_a_guard_with_an_sql_sink_stepped_in_another_loop_is_the_typed_error_and_writes_nothing(
    tmp_path: Any,
) -> None:
    """With a real SqlSink: the first step marked the row changed before the loop check, which woke
    the first loop's writer (gone: 'Event loop is closed') instead of saying GuardOutsideLoop."""
    from eventguard.sink import SqlSink

    sink = SqlSink(f"sqlite+aiosqlite:///{tmp_path / 'eg.db'}", spool_path=tmp_path / "spool.jsonl")

    async def build() -> Any:
        await sink.start()
        return guard(Scripted(stream_events(1)), asyncio.Event(), sink=sink)

    async def iterate(g: Any) -> list[Any]:
        async with asyncio.timeout(5):
            return [e async for e in g]

    g = asyncio.run(build())
    with pytest.raises(GuardOutsideLoop):
        asyncio.run(iterate(g))
    assert g.lifecycle.state is State.NEW
