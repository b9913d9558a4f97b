"""The guard's properties, each pinned by a test that fails when it breaks."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

import pytest

from eventguard import Cause, GuardAlreadyUsed, NotAsyncIterable, State, guard
from eventguard.testing.streams import Scripted, block_ignoring_signal, host_context, stream_events, terminal

BOUND = 5.0


async def drain(g: Any) -> list[Any]:
    async with asyncio.timeout(BOUND):
        return [e async for e in g]


async def test_normal_run_passes_the_same_objects_through() -> None:
    events = stream_events()
    inner = Scripted(events)
    g = guard(inner, asyncio.Event(), context=host_context())
    async with g:
        out = await drain(g)
    assert len(out) == len(events)
    assert all(a is b for a, b in zip(out, events, strict=True))
    assert g.lifecycle.state is State.COMPLETED and g.lifecycle.cause is Cause.NORMAL
    assert g.lifecycle.usage is not None and g.lifecycle.usage.total_tokens == 8
    assert inner.closes == 1


async def test_plain_async_for_without_async_with_closes_the_inner_at_the_end() -> None:
    inner = Scripted(stream_events(3))
    await drain(guard(inner, asyncio.Event()))
    assert inner.closes == 1


async def test_guard_closed_before_its_first_step_closes_the_inner_once() -> None:
    inner = Scripted(stream_events(3))
    g = guard(inner, asyncio.Event(), context=host_context())
    await g.aclose()
    await g.aclose()
    assert inner.closes == 1
    assert g.lifecycle.state is State.FAILED and g.lifecycle.cause is Cause.CLOSED_EARLY
    with pytest.raises(StopAsyncIteration):
        await g.__anext__()


async def test_consumer_close_closes_the_inner_in_that_call() -> None:
    inner = Scripted(stream_events(5))
    g = guard(inner, asyncio.Event())
    async with asyncio.timeout(BOUND):
        await g.__anext__()
        await g.aclose()
    # Not left to the garbage collector: closed by the time aclose() returned.
    assert inner.closes == 1


async def test_consumer_break_inside_async_with_closes_the_inner() -> None:
    inner = Scripted(stream_events(5))
    async with asyncio.timeout(BOUND), guard(inner, asyncio.Event()) as g:
        async for _ in g:
            break
    assert inner.closes == 1


async def test_a_guard_is_single_use() -> None:
    g = guard(Scripted(stream_events(1)), asyncio.Event())
    async with g:
        pass
    with pytest.raises(GuardAlreadyUsed):
        async with g:
            pass


def test_not_async_iterable_is_a_typed_error() -> None:
    with pytest.raises(NotAsyncIterable):
        guard([1, 2, 3], asyncio.Event())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        guard(Scripted([]), object())  # type: ignore[arg-type]


async def test_outside_cancellation_propagates_and_timeout_still_fires() -> None:
    # Property 3: the guard never swallows a cancel; asyncio.timeout still turns it into TimeoutError.
    inner = Scripted(stream_events(3, final=None), before={5: block_ignoring_signal})
    g = guard(inner, asyncio.Event(), context=host_context())
    task = asyncio.current_task()
    assert task is not None
    before = task.cancelling()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            async for _ in g:
                pass
    assert task.cancelling() == before
    assert inner.closes == 1
    assert g.lifecycle.state is State.CANCELLED


async def test_stuck_inner_is_abandoned_after_grace_and_cancelling_is_unchanged() -> None:
    signal = asyncio.Event()
    ctx = host_context()

    def client_cancel() -> Any:
        ctx.client_cancelled = True
        signal.set()
        return block_ignoring_signal()

    inner = Scripted(stream_events(3), before={3: client_cancel})
    g = guard(inner, signal, context=ctx, cancel_grace=0.05)
    task = asyncio.current_task()
    assert task is not None
    before = task.cancelling()
    out = await drain(g)
    assert [e["type"] for e in out] == [
        "response.created",
        "response.in_progress",
        "response.output_text.delta",
    ]
    assert task.cancelling() == before
    assert g.lifecycle.state is State.CANCELLED
    assert any(a.kind == "stuck" for a in g.lifecycle.anomalies)


async def test_outside_cancel_during_stuck_handling_is_not_taken_back() -> None:
    # Both our watchdog and an enclosing timeout cancel the same await: the outside one must win.
    signal = asyncio.Event()
    signal.set()
    inner = Scripted(stream_events(3), before={3: block_ignoring_signal})
    g = guard(inner, signal, cancel_grace=0.1)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            async for _ in g:
                pass
    assert inner.closes == 1


async def test_signal_already_set_before_the_first_event_follows_the_same_rules() -> None:
    signal = asyncio.Event()
    signal.set()
    ctx = host_context()
    ctx.client_cancelled = True
    g = guard(Scripted(stream_events(3)), signal, context=ctx)
    out = await drain(g)
    assert "response.completed" not in [e["type"] for e in out]
    assert g.lifecycle.state is State.CANCELLED


async def test_without_context_a_set_signal_is_a_client_cancel() -> None:
    signal = asyncio.Event()
    signal.set()
    g = guard(Scripted(stream_events(3)), signal)
    out = await drain(g)
    assert [e["type"] for e in out][-1] != "response.completed"
    assert g.lifecycle.state is State.CANCELLED


async def test_event_ready_with_the_signal_is_forwarded() -> None:
    # Property 5, the rule: an event the inner stream already produced is forwarded even when the
    # signal is set at the same moment; only the terminal is decided by the flags.
    signal = asyncio.Event()
    ctx = host_context()

    def cancel_now() -> None:
        ctx.client_cancelled = True
        signal.set()

    events = stream_events(3)
    g = guard(Scripted(events, before={2: cancel_now}), signal, context=ctx)
    out = await drain(g)
    assert out == events[:-1]
    assert g.lifecycle.state is State.CANCELLED


async def test_no_cancel_reaches_the_consumer_between_events() -> None:
    # Property 6 (PEP 789): the guard holds no cancel scope across a hand-over. A consumer that is
    # slow between events, past cancel_grace with the signal set, is never cancelled by the guard.
    signal = asyncio.Event()
    g = guard(Scripted(stream_events(3)), signal, cancel_grace=0.01)
    out = []
    async with asyncio.timeout(BOUND):
        async for e in g:
            out.append(e)
            if len(out) == 2:
                signal.set()
                await asyncio.sleep(0.1)  # would raise CancelledError if the guard cancelled us here
    # Not cancelled: the pause past cancel_grace after the signal (without a context, a client cancel)
    # is recorded as abandoned, and that ending is final: nothing more is forwarded, the stream ends.
    assert len(out) == 2
    assert g.lifecycle.state is State.CANCELLED
    assert [a.kind for a in g.lifecycle.anomalies] == ["abandoned", "event_after_terminal"]


async def test_host_that_stops_iterating_after_a_client_cancel_is_recorded_within_grace() -> None:
    signal = asyncio.Event()
    ctx = host_context()
    g = guard(Scripted(stream_events(3)), signal, context=ctx, cancel_grace=0.05)
    async with asyncio.timeout(BOUND):
        await g.__anext__()
        ctx.client_cancelled = True
        signal.set()
        # The host walks away: it neither resumes nor closes the guard.
        await asyncio.sleep(0.3)
    assert g.lifecycle.state is State.CANCELLED
    assert any(a.kind == "abandoned" for a in g.lifecycle.anomalies)
    await g.aclose()


async def test_shutdown_completion_is_replaced_by_a_failed_terminal() -> None:
    ctx = host_context()
    inner = Scripted(stream_events(2), before={4: ctx.shutdown.set})
    g = guard(inner, asyncio.Event(), context=ctx)
    out = await drain(g)
    last = out[-1]
    assert last["type"] == "response.failed"
    assert last["response"]["status"] == "failed"
    assert last["response"]["error"]["code"] == "server_shutdown"
    assert g.lifecycle.state is State.FAILED and g.lifecycle.cause is Cause.SHUTDOWN


async def test_shutdown_completion_can_be_kept_and_is_flagged_unverified() -> None:
    ctx = host_context()
    inner = Scripted(stream_events(2), before={4: ctx.shutdown.set})
    g = guard(inner, asyncio.Event(), context=ctx, keep_shutdown_completion=True)
    out = await drain(g)
    assert out[-1]["type"] == "response.completed"
    assert g.lifecycle.state is State.COMPLETED and g.lifecycle.unverified


async def test_emit_mode_sends_one_cancelled_terminal() -> None:
    signal = asyncio.Event()
    ctx = host_context()

    def cancel_now() -> None:
        ctx.client_cancelled = True
        signal.set()

    g = guard(Scripted(stream_events(2), before={4: cancel_now}), signal, context=ctx, on_cancel="emit")
    out = await drain(g)
    terminals = [e for e in out if e["type"] in {"response.completed", "response.failed"}]
    assert len(terminals) == 1
    assert terminals[0]["type"] == "response.failed" and terminals[0]["response"]["status"] == "cancelled"


async def test_missing_terminal_gets_a_failed_terminal() -> None:
    g = guard(Scripted(stream_events(2, final=None)), asyncio.Event(), context=host_context())
    out = await drain(g)
    assert out[-1]["type"] == "response.failed"
    assert out[-1]["response"]["error"]["code"] == "missing_terminal"
    assert g.lifecycle.state is State.FAILED and g.lifecycle.cause is Cause.MISSING_TERMINAL


async def test_steering_keeps_the_terminal_and_marks_it() -> None:
    signal = asyncio.Event()
    g = guard(Scripted(stream_events(2), before={3: signal.set}), signal, context=host_context())
    out = await drain(g)
    assert out[-1]["type"] == "response.completed"
    assert g.lifecycle.state is State.COMPLETED and g.lifecycle.steering_cut_short


async def test_inner_exception_is_reraised_and_recorded_with_its_type() -> None:
    def boom() -> None:
        raise ValueError("executor raised")

    inner = Scripted(stream_events(2), before={3: boom})
    g = guard(inner, asyncio.Event(), context=host_context())
    with pytest.raises(ValueError, match="executor raised"):
        await drain(g)
    assert inner.closes == 1
    assert g.lifecycle.state is State.FAILED
    assert g.lifecycle.error is not None and g.lifecycle.error.exception_type == "builtins.ValueError"


class ExitForRecovery(BaseException):
    """Shaped like the host's ResponseExitForRecovery: a BaseException, not an Exception."""


async def test_base_exception_passes_through_untouched() -> None:
    exc = ExitForRecovery()

    def leave() -> None:
        raise exc

    inner = Scripted(stream_events(2), before={3: leave})
    g = guard(inner, asyncio.Event(), context=host_context())
    with pytest.raises(ExitForRecovery) as caught:
        await drain(g)
    assert caught.value is exc
    assert g.lifecycle.state is State.INTERRUPTED
    assert inner.closes == 1


async def test_second_terminal_and_event_after_terminal_are_dropped_as_anomalies() -> None:
    events = [*stream_events(1), terminal("completed"), {"type": "response.output_text.delta", "delta": "x"}]
    g = guard(Scripted(events), asyncio.Event())
    out = await drain(g)
    assert out == events[:-2]
    kinds = [a.kind for a in g.lifecycle.anomalies]
    assert kinds == ["duplicate_terminal", "event_after_terminal"]
    assert all(a.payload is not None for a in g.lifecycle.anomalies)


async def test_recovered_reentry_is_a_new_attempt() -> None:
    ctx = host_context()
    ctx.is_recovery = True
    g = guard(Scripted(stream_events(1)), asyncio.Event(), context=ctx)
    await drain(g)
    assert g.lifecycle.attempt == 2
    assert g.lifecycle.transitions[0].from_state is State.INTERRUPTED
    assert g.lifecycle.state is State.COMPLETED


async def test_recovered_snapshot_with_a_string_created_at_is_valid() -> None:
    # The host seeds a recovered re-entry from its persisted snapshot, where created_at is a string.
    created = {
        "type": "response.created",
        "response": {
            "id": "resp_1",
            "status": "in_progress",
            "created_at": "2026-11-29 16:43:39.145324+00:00",
        },
    }
    g = guard(Scripted([created, *stream_events(1)[1:]]), asyncio.Event())
    await drain(g)
    assert g.lifecycle.anomalies == []
    assert g.lifecycle.state is State.COMPLETED


@pytest.mark.parametrize(("durable", "expected"), [(True, State.INTERRUPTED), (False, State.FAILED)])
async def test_shutdown_without_terminal_is_interrupted_only_on_a_resilient_host(
    durable: bool, expected: State
) -> None:
    # Only a resilient host recovers a run (it gives it a durable task context); elsewhere it is lost.
    ctx = host_context(background=True, store=True)
    ctx._task_context = object() if durable else None
    inner = Scripted(stream_events(2, final=None), before={4: ctx.shutdown.set})
    g = guard(inner, asyncio.Event(), context=ctx)
    out = await drain(g)
    assert out[-1]["type"] == "response.output_text.delta"  # nothing added under shutdown
    assert g.lifecycle.state is expected


@pytest.mark.parametrize(("durable", "expected"), [(True, State.INTERRUPTED), (False, State.FAILED)])
async def test_a_run_cancelled_once_the_process_is_exiting_was_stopped_by_shutdown(
    durable: bool, expected: State
) -> None:
    # A background run the host never told about shutdown (its context's flag stays clear): the exit
    # cancels it. That is shutdown, not a client's cancel.
    ctx = host_context(background=True, store=True)
    ctx._task_context = object() if durable else None
    process_shutdown = threading.Event()
    inner = Scripted(stream_events(4), before={4: block_ignoring_signal})
    g = guard(inner, asyncio.Event(), context=ctx, process_shutdown=process_shutdown)
    task = asyncio.create_task(drain(g))
    await asyncio.sleep(0.05)
    process_shutdown.set()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert g.lifecycle.state is expected
    assert g.lifecycle.cause is Cause.SHUTDOWN
    assert inner.closes == 1


async def test_a_run_that_completes_while_the_process_is_exiting_is_completed() -> None:
    # Not told, so not cut short: its completion is whole.
    stopping = threading.Event()
    stopping.set()
    g = guard(Scripted(stream_events(2)), asyncio.Event(), context=host_context(), process_shutdown=stopping)
    out = await drain(g)
    assert out[-1]["type"] == "response.completed"
    assert g.lifecycle.state is State.COMPLETED


async def test_stuck_inner_that_swallows_our_cancel_still_ends_and_cancelling_is_restored() -> None:
    produced_after: list[Any] = []

    async def swallower() -> Any:
        for e in stream_events(1, final=None):
            yield e
        with contextlib.suppress(asyncio.CancelledError):  # a badly behaved inner stream
            await block_ignoring_signal()
        late = {"type": "response.output_text.delta", "delta": "late"}
        produced_after.append(late)
        yield late
        await block_ignoring_signal()  # would hang the consumer if the guard kept waiting

    signal = asyncio.Event()
    signal.set()
    g = guard(swallower(), signal, cancel_grace=0.05)
    task = asyncio.current_task()
    assert task is not None
    before = task.cancelling()
    out = await drain(g)
    assert task.cancelling() == before
    assert produced_after and produced_after[0] not in out
    assert g.lifecycle.state is State.CANCELLED
    stuck = [a for a in g.lifecycle.anomalies if a.kind == "stuck"]
    assert stuck and stuck[0].payload is produced_after[0]


@pytest.mark.parametrize("bad_type", [0, 1.5, True, ("a",), b"response.created"])
async def test_a_non_string_type_never_reaches_the_host(bad_type: object) -> None:
    events = stream_events(1)
    events.insert(2, {"type": bad_type, "delta": "x"})
    g = guard(Scripted(events), asyncio.Event())
    out = await drain(g)
    assert all(isinstance(e["type"], str) for e in out)
    assert [a.kind for a in g.lifecycle.anomalies] == ["missing_type"]


async def test_client_cancel_after_the_terminal_but_before_the_end_is_a_cancel() -> None:
    # The host reports cancelled when the client cancels before the handler ends, even after the
    # terminal went out; the guard settles the ending when the inner stream ends.
    signal = asyncio.Event()
    ctx = host_context()

    def cancel_now() -> None:
        ctx.client_cancelled = True
        signal.set()

    events = stream_events(1)
    g = guard(Scripted(events, before={len(events): cancel_now}), signal, context=ctx)
    out = await drain(g)
    assert out[-1]["type"] == "response.completed"  # already forwarded: the host rewrites it
    assert g.lifecycle.state is State.CANCELLED


async def test_signal_set_after_the_end_does_not_turn_a_success_into_a_cancel() -> None:
    # Newer hosts set the signal after every normal foreground completion: never read it later.
    signal = asyncio.Event()
    g = guard(Scripted(stream_events(1)), signal, context=host_context())
    out = await drain(g)
    signal.set()
    await g.aclose()
    assert out[-1]["type"] == "response.completed"
    assert g.lifecycle.state is State.COMPLETED
