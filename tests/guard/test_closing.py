"""Closing: the guard closes the inner stream (and the iterable that owns it) exactly once, in the call
that ends it; it is single use; how the consumer's exit from ``async with`` ends the stream.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from eventguard import Cause, GuardAlreadyUsed, State, guard
from eventguard.testing.streams import (
    Scripted,
    host_context,
    stream_events,
)

from .helpers import (
    ClaimsEveryClass,
    CountingSink,
    OwningIterable,
    drain,
)


async def test_aclose_from_another_task_mid_step_is_refused_and_changes_nothing() -> None:
    """Origin: a review finding; failed before its fix (test_review_regressions.py)."""
    inner = Scripted(stream_events(1), before={2: lambda: asyncio.sleep(0.1)})
    g = guard(inner, asyncio.Event(), context=host_context())
    out: list[Any] = []

    async def consume() -> None:
        async for e in g:
            out.append(e)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)  # the consumer is inside the inner stream's await
    with pytest.raises(RuntimeError, match="another task"):
        await g.aclose()
    assert inner.closes == 0
    async with asyncio.timeout(5):
        await task
    assert out[-1]["type"] == "response.completed"
    assert g.lifecycle.state is State.COMPLETED
    assert inner.closes == 1


async def test_an_iterable_that_owns_a_resource_is_closed_after_its_iterator() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    src = OwningIterable(stream_events(2))
    out = await drain(guard(src, asyncio.Event()))
    assert len(out) == 5
    assert src.log == ["iterator", "iterable"]


async def test_the_iterable_is_closed_even_when_closing_its_iterator_raises() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    src = OwningIterable(stream_events(2), fail_first=True)
    with pytest.raises(RuntimeError, match="iterator close failed"):
        await drain(guard(src, asyncio.Event()))
    assert src.log == ["iterator", "iterable"]


async def test_an_iterable_with_an_async_close_is_closed() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    src = OwningIterable(stream_events(2), close_name="async close")
    await drain(guard(src, asyncio.Event()))
    assert src.log == ["iterator", "iterable"]


async def test_a_synchronous_close_is_not_the_guards_to_call() -> None:
    # A plain close() may block or mean something else; only an awaitable close is the stream's own.
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    src = OwningIterable(stream_events(2), close_name="sync close")
    await drain(guard(src, asyncio.Event()))
    assert src.log == ["iterator"]


async def test_an_iterator_without_aclose_is_guarded_and_counted_closed_once() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""

    class Bare:
        def __init__(self, events: list[Any]) -> None:
            self.events = iter(events)

        def __aiter__(self) -> Bare:
            return self

        async def __anext__(self) -> Any:
            for e in self.events:
                return e
            raise StopAsyncIteration

    g = guard(Bare(stream_events(2)), asyncio.Event())
    out = await drain(g)
    assert [e["type"] for e in out][-1] == "response.completed"
    assert g.inner_closed == 1
    assert g.lifecycle.state is State.COMPLETED


async def test_a_finished_guard_stays_finished_however_often_it_is_closed() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    sink = CountingSink()
    inner = Scripted(stream_events(2))
    g = guard(inner, asyncio.Event(), sink=sink)
    await drain(g)
    async with asyncio.timeout(5):
        await g.aclose()
        await g.aclose()
    assert sink.closes == 1
    assert inner.closes == 1
    assert g.lifecycle.state is State.COMPLETED


async def test_plain_iteration_uses_the_guard_up_for_good() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    g = guard(Scripted(stream_events(1)), asyncio.Event())
    async with asyncio.timeout(5):
        async for _ in g:
            break
        with pytest.raises(GuardAlreadyUsed):
            async with g:
                pass
        await g.aclose()


async def test_async_with_twice_is_refused() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    g = guard(Scripted(stream_events(1)), asyncio.Event())
    async with asyncio.timeout(5):
        async with g:
            pass
        with pytest.raises(GuardAlreadyUsed):
            async with g:
                pass


@pytest.mark.parametrize(
    ("exc", "state"), [(ValueError("body"), State.FAILED), (KeyboardInterrupt(), State.INTERRUPTED)]
)
async def test_an_error_in_the_async_with_body_ends_the_stream_by_its_kind(
    exc: BaseException, state: State
) -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    g = guard(Scripted(stream_events(3)), asyncio.Event())
    with pytest.raises(type(exc)):
        async with asyncio.timeout(5), g:
            async for _ in g:
                raise exc
    assert g.lifecycle.state is state


async def test_a_consumer_that_breaks_after_a_delta_closed_early_not_errored() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    g = guard(Scripted(stream_events(3)), asyncio.Event())
    deltas = 0
    async with asyncio.timeout(5), g:
        async for e in g:
            deltas += e["type"] == "response.output_text.delta"
            if deltas == 2:  # the second delta comes by the hot path
                break
    assert g.lifecycle.state is State.FAILED
    assert g.lifecycle.cause is Cause.CLOSED_EARLY
    assert g.lifecycle.error is None


async def test_nested_async_with_is_refused() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    g = guard(Scripted(stream_events(1)), asyncio.Event())
    async with asyncio.timeout(5), g:
        with pytest.raises(GuardAlreadyUsed):
            async with g:
                pass


async def test_closing_the_guard_finishes_the_iterator_it_handed_out() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    g = guard(Scripted(stream_events(3)), asyncio.Event())
    async with asyncio.timeout(5):
        it = aiter(g)
        await anext(it)
        await g.aclose()
    assert it.ag_frame is None  # finished in that call, not left suspended for the garbage collector


class _SaysItIsGeneratorExit(Exception, metaclass=ClaimsEveryClass):
    """An error whose class claims to equal every class, ``GeneratorExit`` included."""


@pytest.mark.parametrize("taken", [1, 4], ids=["at-a-lifecycle-event", "at-a-hot-delta"])
@pytest.mark.parametrize("error", [ValueError, _SaysItIsGeneratorExit])
async def test_an_exception_thrown_in_at_a_hand_over_ends_the_stream_by_that_exception(
    error: type[Exception], taken: int
) -> None:
    """An exception a consumer throws into the guard's iterator (``athrow``, as a combinator may) is not
    the inner stream's ending and not a close: it goes through untouched, and the stream ends by it when
    the ``async with`` body it leaves ends: an error, not a consumer that walked away.

    Origin: a mutant that survived the run over guard/core.py (docs/mutation.md): ``exc.__class__ is
    GeneratorExit and ...`` becoming ``or`` recorded ``closed_early`` at the throw; the 2026-12-02 run
    over core.py: ``exc.__class__ is GeneratorExit`` becoming ``==`` took an error whose class claims to
    equal ``GeneratorExit`` for a close. At a hot delta (the fourth event, its type already seen) the
    throw lands inside the hot path's lookup ``try``, whose ``except Exception`` must let it through
    (2026-12-06: with that clause's ``if phase: raise`` gone, the error was taken for an unreadable
    event and the delta went through the slow path and was handed over again)."""
    inner = Scripted(stream_events(3))
    g = guard(inner, asyncio.Event())
    async with asyncio.timeout(5):
        with pytest.raises(error, match="thrown in"):
            async with g:
                it = aiter(g)
                for _ in range(taken):
                    await anext(it)
                await it.athrow(error("thrown in"))
    assert (g.lifecycle.state, g.lifecycle.cause) == (State.FAILED, Cause.ERROR)
    assert inner.closes == 1
