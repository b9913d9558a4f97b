"""The watchdog: a stuck inner stream or a host that stopped iterating, after ``cancel_grace``; its
cancel, taken back or given back; it sleeps until a cause is signalled and does not outlive the guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest

from eventguard import AnomalyKind, Cause, State, guard
from eventguard.testing.streams import (
    Scripted,
    block_ignoring_signal,
    event,
    host_context,
    stream_events,
    terminal,
)

from .helpers import (
    BOUND,
    CREATED,
    CREATED_R1,
    GRACE,
    SHUTDOWN_FLAGS,
    BlockingClose,
    PlainSignal,
    collect,
    drain,
    stuck_inner,
    tasks_equal_to_any,
    watchdog_tasks,
    watchdog_timers,
)


async def test_a_swallowed_cancel_then_a_second_wait_is_recorded_and_the_cancel_count_restored() -> None:
    """Origin: a review finding; failed before its fix (test_review_regressions.py)."""
    release = asyncio.Event()

    async def inner() -> Any:
        yield CREATED_R1
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue  # a retry loop that swallows every cancel

    signal = asyncio.Event()
    g = guard(inner(), signal, cancel_grace=0.05)

    async def consume() -> None:
        async for _ in g:
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.02)
    signal.set()
    done, _ = await asyncio.wait([task], timeout=0.5)
    assert not done  # the consumer stays blocked: that cannot be helped without a task per pull
    assert g.lifecycle.state is State.CANCELLED  # but the ending is recorded
    assert [a.kind for a in g.lifecycle.anomalies] == ["stuck"]
    assert task.cancelling() == 0  # and the task's cancel count is given back
    release.set()
    async with asyncio.timeout(5):
        await task


async def test_the_watchdog_does_not_outlive_the_guard() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    before = len(watchdog_tasks())
    g = guard(Scripted(stream_events(2)), asyncio.Event(), cancel_grace=5.0)
    await drain(g)
    await asyncio.sleep(0)  # let the cancelled watchdog unwind
    assert len(watchdog_tasks()) == before


async def test_the_watchdog_does_not_outlive_the_guard_when_tasks_claim_to_equal_each_other() -> None:
    """The watchdog tells its own task from the caller's by identity: under a task factory whose tasks
    claim to equal any other, ending the guard still stops the watchdog.

    Origin: the 2026-12-02 mutation run over watchdog.py: ``task is not asyncio.current_task()`` becoming
    ``!=`` in ``stop()`` left the watchdog's task waiting for a cause for ever."""
    before = len(watchdog_tasks())
    async with tasks_equal_to_any():
        g = guard(Scripted(stream_events(2)), asyncio.Event(), cancel_grace=5.0)
        await drain(g)
        await asyncio.sleep(0)  # let the cancelled watchdog unwind
        assert len(watchdog_tasks()) == before


async def test_shutdown_alone_arms_the_watchdog_when_the_host_stops_iterating() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    ctx = host_context(background=False)
    g = guard(Scripted(stream_events(3)), asyncio.Event(), context=ctx, cancel_grace=0.05)
    async with asyncio.timeout(5):
        it = aiter(g)
        await anext(it)
        ctx.shutdown.set()  # the host's handle_shutdown() sets only this flag at first
        await asyncio.sleep(0.3)  # ...and the host stops iterating
        assert g.lifecycle.state is State.FAILED
        assert [a.kind for a in g.lifecycle.anomalies] == ["abandoned"]
        await g.aclose()


async def test_steering_alone_is_never_an_abandonment() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    sig = asyncio.Event()
    g = guard(Scripted(stream_events(3)), sig, context=host_context(), cancel_grace=0.05)
    async with asyncio.timeout(5):
        it = aiter(g)
        await anext(it)
        await anext(it)
        sig.set()  # steering: the signal with neither cause flag
        await asyncio.sleep(0.3)
        assert g.lifecycle.state is State.IN_PROGRESS
        rest = [e async for e in it]
    assert rest[-1]["type"] == "response.completed"
    assert g.lifecycle.state is State.COMPLETED


@pytest.mark.parametrize("strict", [False, True])
async def test_a_stream_resumed_after_its_abandonment_was_recorded_gets_nothing_more(strict: bool) -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    ctx = host_context(background=False)
    sig = asyncio.Event()
    g = guard(
        Scripted(stream_events(3, final=None)),
        sig,
        context=ctx,
        cancel_grace=0.05,
        on_cancel="emit",
        strict=strict,
    )
    async with asyncio.timeout(5):
        it = aiter(g)
        await anext(it)
        ctx.client_cancelled = True
        sig.set()
        await asyncio.sleep(0.3)
        assert g.lifecycle.state is State.CANCELLED  # recorded as abandoned
        rest = [e async for e in it]
    # An ending the guard recorded on its own is final: what the inner stream produces afterwards is
    # kept as an anomaly, never forwarded (strict or not: it is not bad input); only the terminal
    # that ending calls for (on_cancel="emit": a cancelled response.failed) is forwarded, then the end.
    assert [(e["type"], e["response"]["status"]) for e in rest] == [("response.failed", "cancelled")]
    assert [a.kind for a in g.lifecycle.anomalies] == ["abandoned", "event_after_terminal"]
    assert g.lifecycle.anomalies[1].event_type == "response.in_progress"
    assert g.lifecycle.state is State.CANCELLED
    assert g.inner_closed == 1


async def test_a_signal_that_is_not_an_event_is_polled_and_waited_for() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    sig = PlainSignal()
    slow = Scripted(stream_events(2), before={3: lambda: asyncio.sleep(0.3)})
    g = guard(slow, sig, cancel_grace=0.05)
    out = await drain(g)
    assert out[-1]["type"] == "response.completed"  # not signalled: never cut short
    stuck = Scripted(stream_events(2), before={3: block_ignoring_signal})
    g2 = guard(stuck, sig, cancel_grace=0.05)
    sig.flag = True
    await drain(g2)
    assert [a.kind for a in g2.lifecycle.anomalies] == ["stuck"]


async def test_the_watchdog_leaves_no_waiters_behind() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    await asyncio.sleep(0)
    before = len(asyncio.all_tasks())
    ctx = host_context()
    slow = Scripted(stream_events(2), before={2: lambda: asyncio.sleep(0.02)})  # the watchdog is waiting
    g = guard(slow, asyncio.Event(), context=ctx, cancel_grace=5.0)
    await drain(g)
    for _ in range(3):
        await asyncio.sleep(0)
    assert len(asyncio.all_tasks()) == before


async def test_a_stream_stuck_after_its_terminal_keeps_that_terminal() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    ctx = host_context()
    sig = asyncio.Event()
    events = stream_events(2)
    inner = Scripted(
        [*events, event("response.output_text.delta")], before={len(events): block_ignoring_signal}
    )

    def steer() -> None:
        sig.set()

    inner.before[len(events) - 1] = steer
    g = guard(inner, sig, context=ctx, cancel_grace=0.05)
    out = await drain(g)
    assert [e["type"] for e in out].count("response.completed") == 1
    assert [e["type"] for e in out if e["type"] in ("response.completed", "response.failed")] == [
        "response.completed"
    ]
    assert g.lifecycle.state is State.COMPLETED
    assert "stuck" in [a.kind for a in g.lifecycle.anomalies]


async def test_a_stuck_stream_whose_close_blocks_still_lets_the_guard_end() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    sig = asyncio.Event()
    sig.set()
    inner = BlockingClose(stream_events(2), before={3: block_ignoring_signal})
    g = guard(inner, sig, cancel_grace=0.05)
    await drain(g)
    assert g.lifecycle.ended
    await asyncio.sleep(0)
    assert inner.closes == 1  # closed once, in the background


async def test_a_stuck_stream_that_swallows_the_cancel_and_blocks_on_close_lets_the_guard_end() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    sig = asyncio.Event()
    sig.set()

    class Swallower(BlockingClose):
        async def __anext__(self) -> Any:
            with contextlib.suppress(asyncio.CancelledError):
                return await super().__anext__()
            return {"type": "response.output_text.delta", "delta": "late"}

    inner = Swallower(stream_events(2), before={3: block_ignoring_signal})
    g = guard(inner, sig, cancel_grace=0.05)
    await drain(g)
    assert g.lifecycle.ended
    stuck = [a for a in g.lifecycle.anomalies if a.kind == "stuck"]
    assert stuck and stuck[0].event_type == "response.output_text.delta"


async def test_closing_a_stuck_stream_that_raises_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""

    class RaisingClose(Scripted):
        async def aclose(self) -> None:
            self.closes += 1
            raise RuntimeError("close failed")

    sig = asyncio.Event()
    sig.set()
    inner = RaisingClose(stream_events(2), before={3: block_ignoring_signal})
    with caplog.at_level("WARNING", logger="eventguard"):
        await drain(guard(inner, sig, cancel_grace=0.05))
        for _ in range(3):
            await asyncio.sleep(0)
    (record,) = [r for r in caplog.records if "closing a stuck inner stream raised" in r.getMessage()]
    assert record.exc_info and record.exc_info[0] is RuntimeError


async def test_a_swallowed_cancel_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""

    async def swallower() -> Any:
        for e in stream_events(1, final=None):
            yield e
        with contextlib.suppress(asyncio.CancelledError):
            await block_ignoring_signal()
        await asyncio.sleep(0.3)  # waits again, past the second grace
        yield {"type": "response.output_text.delta", "delta": "late"}

    sig = asyncio.Event()
    sig.set()
    with caplog.at_level("WARNING", logger="eventguard"):
        await drain(guard(swallower(), sig, cancel_grace=0.05))
    assert any("and swallowed the cancel" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("kind", list(SHUTDOWN_FLAGS))
async def test_a_shutdown_flag_of_any_kind_wakes_the_watchdog_for_a_stuck_stream(kind: str) -> None:
    """Origin: right but untested, pinned at stop 9 (test_pinned_behaviours.py)."""
    ctx = host_context(background=False)
    ctx.shutdown = SHUTDOWN_FLAGS[kind]()

    async def inner() -> AsyncIterator[Any]:
        yield CREATED
        await asyncio.sleep(3600)  # ignores the shutdown; honours task cancellation
        yield terminal()

    g = guard(inner(), asyncio.Event(), context=ctx, cancel_grace=GRACE)
    loop = asyncio.get_running_loop()
    out = []
    async with asyncio.timeout(BOUND):
        async for e in g:
            out.append(e)
            loop.call_later(0.02, ctx.shutdown.set)  # the host's shutdown handler sets only this flag
    assert out == [CREATED]
    assert (g.lifecycle.state, g.lifecycle.cause) == (State.FAILED, Cause.SHUTDOWN)
    assert [a.kind for a in g.lifecycle.anomalies] == ["stuck"]


@pytest.mark.parametrize("with_shutdown", [True, False], ids=["signal and shutdown", "signal only"])
async def test_the_watchdog_does_not_wake_up_while_nothing_is_signalled(
    with_shutdown: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Origin: right but untested, pinned at stop 9 (test_pinned_behaviours.py)."""
    loop = asyncio.get_running_loop()
    scheduled = watchdog_timers(loop, monkeypatch)
    release = asyncio.Event()

    async def inner() -> AsyncIterator[Any]:
        yield CREATED
        await release.wait()
        yield terminal()

    ctx = host_context() if with_shutdown else None
    g = guard(inner(), asyncio.Event(), context=ctx, cancel_grace=GRACE)
    async with asyncio.timeout(BOUND), g:
        assert await g.__anext__() is CREATED
        await asyncio.sleep(0.3)  # six times the polling period: a poller would have woken six times
        assert scheduled == []
        release.set()
        rest = [e async for e in g]
    assert rest[-1]["type"] == "response.completed"
    assert scheduled == []


async def test_a_flag_that_cannot_be_awaited_is_polled_gently(monkeypatch: pytest.MonkeyPatch) -> None:
    # The counter above does see the watchdog's timers: a threading.Event shutdown is polled every 50 ms.
    """Origin: right but untested, pinned at stop 9 (test_pinned_behaviours.py)."""
    loop = asyncio.get_running_loop()
    scheduled = watchdog_timers(loop, monkeypatch)
    release = asyncio.Event()

    async def inner() -> AsyncIterator[Any]:
        yield CREATED
        await release.wait()
        yield terminal()

    ctx = host_context()
    ctx.shutdown = threading.Event()
    g = guard(inner(), asyncio.Event(), context=ctx, cancel_grace=GRACE)
    async with asyncio.timeout(BOUND), g:
        await g.__anext__()
        await asyncio.sleep(0.3)
        release.set()
        await collect(g)
    assert 3 <= len(scheduled) <= 9


@pytest.mark.parametrize(
    "behaviour",
    [
        "honours the cancel",
        "swallows it and yields",
        "swallows it and waits again",
        "swallows it, waits again, ends",
    ],
)
@pytest.mark.parametrize("cause", ["steering", "client cancel", "shutdown"])
async def test_a_stuck_run_has_exactly_one_stuck_anomaly(behaviour: str, cause: str) -> None:
    """Origin: right but untested, pinned at stop 9 (test_pinned_behaviours.py)."""
    signal, ctx = asyncio.Event(), host_context()
    g = guard(stuck_inner(behaviour), signal, context=ctx, cancel_grace=GRACE)
    async with asyncio.timeout(BOUND):
        task = asyncio.create_task(collect(g))
        await asyncio.sleep(0.01)
        if cause == "client cancel":
            ctx.client_cancelled = True
        if cause == "shutdown":
            ctx.shutdown.set()
        else:
            signal.set()
        await task
        await asyncio.sleep(8 * GRACE)  # whatever the watchdog and the late call still do
    assert [a.kind for a in g.lifecycle.anomalies].count("stuck") == 1
    assert g.lifecycle.ended


@pytest.mark.parametrize(
    ("during_pause", "while_paused", "state", "cause"),
    [
        # The terminal's decision waits for the end of the stream (a client cancel may still come)...
        ("nothing", State.IN_PROGRESS, State.COMPLETED, Cause.NORMAL),
        ("steering", State.IN_PROGRESS, State.COMPLETED, Cause.NORMAL),  # the terminal's moment decides
        # ...unless a cause comes while the host pauses: then it is settled cancel_grace later.
        ("shutdown", State.COMPLETED, State.COMPLETED, Cause.NORMAL),  # the terminal came before it
        ("client cancel", State.CANCELLED, State.CANCELLED, Cause.CLIENT_CANCEL),  # as the host reports
    ],
)
async def test_the_ending_after_a_forwarded_terminal_stands_when_the_host_then_pauses(
    during_pause: str, while_paused: State, state: State, cause: Cause
) -> None:
    """Origin: right but untested, pinned at stop 9 (test_pinned_behaviours.py)."""
    signal, ctx = asyncio.Event(), host_context()
    events = stream_events(1)
    g = guard(Scripted(events), signal, context=ctx, cancel_grace=GRACE)
    async with asyncio.timeout(BOUND):
        it = aiter(g)
        for _ in events:
            last = await anext(it)
        assert last["type"] == "response.completed"  # forwarded; the host has not asked for the end
        if during_pause == "client cancel":
            ctx.client_cancelled = True
        if during_pause == "shutdown":
            ctx.shutdown.set()
        if during_pause != "nothing":
            signal.set()
        await asyncio.sleep(4 * GRACE)  # the host pauses past cancel_grace
        assert g.lifecycle.state is while_paused
        rest = [e async for e in it]
    assert rest == []
    assert (g.lifecycle.state, g.lifecycle.cause) == (state, cause)
    assert "abandoned" not in [a.kind for a in g.lifecycle.anomalies]
    assert g.inner_closed == 1


async def test_a_stream_that_swallows_the_stuck_cancel_and_yields_is_not_pulled_again() -> None:
    """The event it yields instead of honouring the cancel ends the guard's stream there: it is kept as
    the one ``stuck`` anomaly, the terminal the stuck ending calls for is forwarded, and nothing more is
    asked of the inner stream (closed in the background).

    Origin: a mutant that survived the run over guard/referee.py (docs/mutation.md): ``self.stage is
    Stage.OPEN`` becoming ``!=`` in ``_synthesise`` kept pulling it after the synthesised terminal."""
    signal, ctx = asyncio.Event(), host_context()
    g = guard(stuck_inner("swallows it and yields"), signal, context=ctx, cancel_grace=GRACE)
    async with asyncio.timeout(BOUND):
        task = asyncio.create_task(collect(g))
        await asyncio.sleep(0.01)
        signal.set()
        out = await task
    assert [e["type"] for e in out] == ["response.created", "response.failed"]
    kept = [(a.kind, a.event_type) for a in g.lifecycle.anomalies]
    assert kept == [("stuck", "response.output_text.delta")]
    assert (g.lifecycle.state, g.lifecycle.cause) == (State.FAILED, Cause.STUCK)


async def test_a_host_back_after_its_abandonment_finds_the_inner_stream_closed_in_that_call() -> None:
    """A host that stopped iterating and came back is not a stuck inner stream: when the guard ends its
    stream there, it closes the inner stream in the same call (only a stuck one is left to close in the
    background), so the inner stream's resources are released before the guard's stream ends.

    Origin: mutants that survived the run over guard/referee.py (docs/mutation.md): ``own(...,
    stuck=False)`` becoming ``True`` for an abandonment, and ``is Stage.OWN_ENDING_STUCK`` becoming
    ``is not``, left that close to a background task."""
    ctx = host_context(background=False)
    sig = asyncio.Event()
    inner = Scripted(stream_events(3, final=None))
    g = guard(inner, sig, context=ctx, cancel_grace=0.05)
    async with asyncio.timeout(5):
        it = aiter(g)
        await anext(it)
        ctx.client_cancelled = True
        sig.set()
        await asyncio.sleep(0.3)
        assert [a.kind for a in g.lifecycle.anomalies] == ["abandoned"]
        rest = [e async for e in it]
        closes = inner.closes  # read before anything else runs: no background task had a turn
    assert rest == []
    assert closes == 1
    assert g.lifecycle.state is State.CANCELLED


async def test_a_stream_recorded_stuck_that_yields_later_and_blocks_on_close_lets_the_guard_end() -> None:
    """An inner stream that swallowed the watchdog's cancel and waited again was recorded stuck; when it
    yields at last, the guard ends its stream with the terminal that ending calls for and leaves the
    close, which may be as slow as the stream was, to the background.

    Origin: a mutant that survived the run over guard/referee.py (docs/mutation.md): ``own(...,
    stuck=True)`` becoming ``False`` in ``record_stuck`` closed it in the call, and the guard hung."""
    release = asyncio.Event()

    async def inner() -> AsyncIterator[Any]:
        yield CREATED
        try:
            while not release.is_set():
                try:
                    await release.wait()
                except asyncio.CancelledError:
                    continue  # swallows every cancel
            yield {"type": "response.output_text.delta", "delta": "late"}
        finally:
            await asyncio.sleep(3600)  # a close that never returns

    signal = asyncio.Event()
    g = guard(inner(), signal, cancel_grace=GRACE)
    async with asyncio.timeout(BOUND):
        task = asyncio.create_task(collect(g))
        await asyncio.sleep(0.01)
        signal.set()
        # The lifecycle has nothing to wait on: poll it (bounded by the timeout above).
        while "stuck" not in [a.kind for a in g.lifecycle.anomalies]:  # noqa: ASYNC110
            await asyncio.sleep(GRACE)
        release.set()
        out = await task
    # No context: the signal is a client cancel, so the ending forwards no terminal of its own.
    assert [e["type"] for e in out] == ["response.created"]
    assert [a.kind for a in g.lifecycle.anomalies] == ["stuck", "event_after_terminal"]
    assert (g.lifecycle.state, g.lifecycle.cause) == (State.CANCELLED, Cause.CLIENT_CANCEL)


async def test_a_cancel_swallowed_after_the_terminal_is_logged_and_the_terminal_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without a sink: the stuck ending is recorded after the stream's terminal (withheld under the
    client cancel, which it ends with) and the swallowed cancel is logged.

    Origin: a mutant that survived the run over guard/referee.py (docs/mutation.md): ``elif self.rec is
    not None`` becoming ``is None`` in ``record_stuck`` called a missing recorder and killed the watchdog."""

    async def swallower() -> Any:
        for e in stream_events(1):
            yield e
        with contextlib.suppress(asyncio.CancelledError):
            await block_ignoring_signal()
        await asyncio.sleep(0.3)  # waits again, past the second grace

    sig = asyncio.Event()
    sig.set()
    g = guard(swallower(), sig, cancel_grace=0.05)
    with caplog.at_level("WARNING", logger="eventguard"):
        out = await drain(g)
    assert out == stream_events(1)[:-1]
    assert any("and swallowed the cancel" in r.getMessage() for r in caplog.records)
    assert [a.kind for a in g.lifecycle.anomalies].count("stuck") == 1
    assert (g.lifecycle.state, g.lifecycle.cause) == (State.CANCELLED, Cause.CLIENT_CANCEL)


async def _one_look_no_task_inside(g: Any, signal: asyncio.Event, ctx: Any) -> Any:
    """A step driven by hand: suspended in the inner stream's await, in no task's chain of awaits."""
    assert await g.__anext__() is CREATED
    step = g.__anext__()
    step.send(None)
    signal.set()
    return step


async def _one_look_cancel_on_its_way(g: Any, signal: asyncio.Event, ctx: Any) -> Any:
    """The consumer's task was cancelled, and the inner stream swallowed that cancel and waits again."""
    task = asyncio.create_task(collect(g))
    await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.sleep(0.01)
    assert task.cancelling() == 1
    signal.set()
    return task


async def _one_look_host_stopped(g: Any, signal: asyncio.Event, ctx: Any) -> Any:
    """The host took one event and stopped iterating."""
    assert await g.__anext__() is CREATED
    ctx.client_cancelled = True
    signal.set()
    return None


@pytest.mark.parametrize(
    ("scenario", "anomalies"),
    [
        (_one_look_no_task_inside, ["stuck"]),
        (_one_look_cancel_on_its_way, []),
        (_one_look_host_stopped, ["abandoned"]),
    ],
    ids=["no task inside the guard", "a cancel already on its way", "the host stopped iterating"],
)
async def test_the_watchdog_ends_after_its_one_look_when_it_sent_no_cancel(
    scenario: Any, anomalies: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a cancel it sent is worth a second look (did the stream swallow it?): in every other case the
    watchdog's task ends right after the first ``grace``, and keeps no timer of the loop's.

    Origin: the four ``return False`` of ``Watchdog.on_grace`` becoming ``True`` survived the run over
    guard/watchdog.py (docs/mutation.md): the watchdog slept a second ``grace`` for nothing."""
    scheduled = watchdog_timers(asyncio.get_running_loop(), monkeypatch)
    release = asyncio.Event()

    async def inner() -> AsyncIterator[Any]:
        yield CREATED
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue  # swallows every cancel (none comes from the watchdog here)
        yield terminal()

    signal, ctx = asyncio.Event(), host_context(background=False)
    before = set(watchdog_tasks())
    g = guard(inner(), signal, context=ctx, cancel_grace=GRACE)
    async with asyncio.timeout(BOUND):
        pending = await scenario(g, signal, ctx)
        try:
            [watchdog] = set(watchdog_tasks()) - before
            await asyncio.wait([watchdog])
            assert len(scheduled) == 1  # the first grace's sleep, and nothing after it
            assert [a.kind for a in g.lifecycle.anomalies] == anomalies
        finally:
            # Also when an assertion failed: the stream swallows cancels, so a task left inside it
            # would keep the test run from ending.
            release.set()
        if isinstance(pending, asyncio.Task):
            await pending
        elif pending is not None:
            with contextlib.suppress(StopIteration):
                pending.send(None)
        await g.aclose()


async def test_an_outside_cancel_is_never_taken_for_ours_when_tasks_claim_to_equal_anything() -> None:
    """No stuck-stream cancel was sent, and the consumer's task is cancelled from outside while the
    guard waits on the inner stream: the cancel is the consumer's, recorded as one and raised, even
    when the loop's tasks claim to equal any object (``None`` too).

    Origin: the 2026-12-02 mutation run over watchdog.py: ``task is not self.stuck_task`` becoming
    ``!=`` in ``take_back`` compared the task with ``None`` by ``==`` and took the outside cancel back
    as our own (the stream was recorded stuck and the cancel swallowed)."""
    pulled = asyncio.Event()

    async def inner() -> Any:
        yield CREATED_R1
        pulled.set()
        await asyncio.Event().wait()  # the consumer's task is cancelled here

    async with tasks_equal_to_any():
        g = guard(inner(), asyncio.Event(), cancel_grace=5.0)
        task = asyncio.create_task(drain(g))
        async with asyncio.timeout(5):
            await pulled.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    assert (g.lifecycle.state, g.lifecycle.cause) == (State.CANCELLED, Cause.CLIENT_CANCEL)
    assert g.lifecycle.anomalies == []


async def test_a_signal_whose_is_set_raises_for_a_while_is_watched_on_and_its_cancel_still_counts() -> None:
    """A signal the watchdog polls (not an asyncio.Event) whose is_set() raises for a while (a flag
    store that is down), then answers. Before: the watchdog task ended with the error and nobody
    retrieved it ("Task exception was never retrieved"); then the watchdog stopped with a warning,
    and the guard no longer watched that response at all. Now a read that raises is taken as not
    set, once recorded, and the cancel the signal gives later is still the stream's cause."""
    loop = asyncio.get_running_loop()
    unretrieved: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: unretrieved.append(context))

    class Flaky:
        def __init__(self) -> None:
            self.calls = 0
            self.set = False

        def is_set(self) -> bool:
            self.calls += 1
            if 2 < self.calls <= 6:
                raise RuntimeError("the flag store is down")
            return self.set

    flag = Flaky()
    stopped = asyncio.Event()

    async def stuck() -> AsyncIterator[dict[str, Any]]:
        yield {"type": "response.created", "response": {"id": "resp_flaky", "status": "in_progress"}}
        try:
            await asyncio.sleep(30)  # ignores the signal: only the watchdog can end it
        finally:
            stopped.set()
        yield {"type": "response.completed", "response": {"id": "resp_flaky", "status": "completed"}}

    async with asyncio.timeout(10):
        g = guard(stuck(), flag, cancel_grace=0.1)
        loop.call_later(0.5, setattr, flag, "set", True)  # after the failing reads (polled every 50 ms)
        async with g:
            async for _ in g:
                pass
        await stopped.wait()
    assert flag.calls > 6
    assert not [c for c in unretrieved if "never retrieved" in str(c.get("message", ""))], unretrieved
    assert (g.lifecycle.state, g.lifecycle.cause) == (State.CANCELLED, Cause.CLIENT_CANCEL)
    kinds = [a.kind for a in g.lifecycle.anomalies]
    assert kinds.count(AnomalyKind.FLAG_UNREADABLE) == 1, kinds
