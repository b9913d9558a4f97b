"""Edges of the guard that the mutation run over ``eventguard/guard.py`` found untested.

Each test pins one behaviour a surviving mutant changed (docs/mutation.md lists them): how the inner
stream and the iterable that owns it are closed, that a finished guard stays finished, that the
watchdog does not outlive the guard, odd event objects on the hot path, the recorded error message.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from eventguard import Cause, Guard, GuardAlreadyUsed, InvalidEvent, Lifecycle, State, guard
from eventguard.guard import GuardOptions
from eventguard.guard.referee import Referee
from eventguard.testing.streams import (
    Scripted,
    block_ignoring_signal,
    event,
    host_context,
    stream_events,
    terminal,
)


class OwningIterable:
    """An iterable that hands out a fresh iterator and owns a resource of its own (like openai's
    ``AsyncStream``): closing must reach both, the iterator first."""

    def __init__(self, events: list[Any], *, close_name: str = "aclose", fail_first: bool = False) -> None:
        self.inner = Scripted(events)
        self.log: list[str] = []
        self.fail_first = fail_first
        if close_name == "aclose":
            self.aclose = self._close
        elif close_name == "async close":
            self.close = self._close
        elif close_name == "sync close":
            self.close = self._sync_close

    def __aiter__(self) -> AsyncIterator[Any]:
        outer = self

        class It:
            def __aiter__(self) -> It:
                return self

            async def __anext__(self) -> Any:
                return await outer.inner.__anext__()

            async def aclose(self) -> None:
                outer.log.append("iterator")
                await outer.inner.aclose()
                if outer.fail_first:
                    raise RuntimeError("iterator close failed")

        return It()

    async def _close(self) -> None:
        self.log.append("iterable")

    def _sync_close(self) -> None:
        self.log.append("iterable (sync)")


async def drain(g: Guard) -> list[Any]:
    async with asyncio.timeout(5):
        async with g:
            return [e async for e in g]


async def test_an_iterable_that_owns_a_resource_is_closed_after_its_iterator() -> None:
    src = OwningIterable(stream_events(2))
    out = await drain(guard(src, asyncio.Event()))
    assert len(out) == 5
    assert src.log == ["iterator", "iterable"]


async def test_the_iterable_is_closed_even_when_closing_its_iterator_raises() -> None:
    src = OwningIterable(stream_events(2), fail_first=True)
    with pytest.raises(RuntimeError, match="iterator close failed"):
        await drain(guard(src, asyncio.Event()))
    assert src.log == ["iterator", "iterable"]


async def test_an_iterable_with_an_async_close_is_closed() -> None:
    src = OwningIterable(stream_events(2), close_name="async close")
    await drain(guard(src, asyncio.Event()))
    assert src.log == ["iterator", "iterable"]


async def test_a_synchronous_close_is_not_the_guards_to_call() -> None:
    # A plain close() may block or mean something else; only an awaitable close is the stream's own.
    src = OwningIterable(stream_events(2), close_name="sync close")
    await drain(guard(src, asyncio.Event()))
    assert src.log == ["iterator"]


async def test_an_iterator_without_aclose_is_guarded_and_counted_closed_once() -> None:
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


@dataclass
class CountingSink:
    closes: int = 0
    events: list[int] = field(default_factory=list)

    def recorder(self, lifecycle: Lifecycle) -> CountingSink:
        return self

    def event(self, index: int, event_type: str | None, event: object) -> None:
        self.events.append(index)

    def changed(self) -> None:
        pass

    async def close(self) -> None:
        self.closes += 1


async def test_a_finished_guard_stays_finished_however_often_it_is_closed() -> None:
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


async def test_plain_iteration_uses_the_guard_up() -> None:
    g = guard(Scripted(stream_events(1)), asyncio.Event())
    async with asyncio.timeout(5):
        async for _ in g:
            break
        with pytest.raises(GuardAlreadyUsed):
            async with g:
                pass
        await g.aclose()


def _watchdogs() -> list[asyncio.Task[Any]]:
    return [
        t
        for t in asyncio.all_tasks()
        if getattr(t.get_coro(), "__qualname__", "") == "Watchdog._watch" and not t.done()
    ]


async def test_the_watchdog_does_not_outlive_the_guard() -> None:
    before = len(_watchdogs())
    g = guard(Scripted(stream_events(2)), asyncio.Event(), cancel_grace=5.0)
    await drain(g)
    await asyncio.sleep(0)  # let the cancelled watchdog unwind
    assert len(_watchdogs()) == before


async def test_an_object_event_with_an_unhashable_type_is_forwarded_untouched() -> None:
    odd = SimpleNamespace(type=["not", "a", "string"])
    events = stream_events(1)
    out = await drain(guard(Scripted([*events[:3], odd, *events[3:]]), asyncio.Event()))
    assert out[3] is odd
    assert out[-1]["type"] == "response.completed"


async def test_an_event_that_claims_to_equal_everything_is_still_forwarded() -> None:
    class EqualsAll:
        type = "response.custom.odd"  # a type not seen before: the first one takes the slow path

        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = object.__hash__

    odd = EqualsAll()
    events = stream_events(1)
    out = await drain(guard(Scripted([*events[:3], odd, odd, *events[3:]]), asyncio.Event()))
    assert [e is odd for e in out].count(True) == 2


@pytest.mark.parametrize(("length", "kept"), [(500, 500), (501, 500), (2000, 500)])
async def test_the_recorded_error_message_is_cut_at_500_characters(length: int, kept: int) -> None:
    async def raises() -> AsyncIterator[Any]:
        for e in stream_events(1)[:2]:
            yield e
        raise ValueError("m" * length)

    g = guard(raises(), asyncio.Event())
    with pytest.raises(ValueError, match=r"^m+$"):
        await drain(g)
    assert g.lifecycle.error is not None
    message = g.lifecycle.error.message
    assert message is not None
    assert len(message) == kept
    assert message.endswith("…") == (length > 500)


def test_the_documented_final_flush_bound_is_five_seconds() -> None:
    # README: "The final flush to the sink is shielded and time-bounded (`flush_timeout`, 5 s)".
    assert inspect.signature(guard).parameters["flush_timeout"].default == 5.0
    assert GuardOptions().flush_timeout == 5.0


# -- options ---------------------------------------------------------------------------------------


def test_guard_and_GuardOptions_agree_on_every_default() -> None:
    # guard() is the documented entry point; Guard(...) built with GuardOptions() must behave the same.
    outer = inspect.signature(guard).parameters
    fields = {f.name: f.default for f in dataclasses.fields(GuardOptions)}
    assert {k: outer[k].default for k in fields} == fields
    assert inspect.signature(Guard).parameters["options"].default == GuardOptions()
    assert outer["cancel_grace"].default == 10.0  # README: cancel_grace=10.0


def test_options_are_keyword_only() -> None:
    params = inspect.signature(guard).parameters
    assert [n for n, p in params.items() if p.kind is not p.KEYWORD_ONLY] == ["stream", "cancellation_signal"]
    params = inspect.signature(Guard).parameters
    assert [n for n, p in params.items() if p.kind is not p.KEYWORD_ONLY] == [
        "stream",
        "cancellation_signal",
        "options",
    ]


def test_the_options_object_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        GuardOptions().cancel_grace = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("grace", [-1.0, -0.5])
def test_a_negative_cancel_grace_is_refused(grace: float) -> None:
    with pytest.raises(ValueError, match="cancel_grace"):
        guard(Scripted([]), asyncio.Event(), cancel_grace=grace)


async def test_async_with_twice_is_refused() -> None:
    g = guard(Scripted(stream_events(1)), asyncio.Event())
    async with asyncio.timeout(5):
        async with g:
            pass
        with pytest.raises(GuardAlreadyUsed):
            async with g:
                pass


# -- what the context says -------------------------------------------------------------------------


async def test_a_context_that_says_little_is_read_as_no_cause_and_no_mode() -> None:
    class Bare:
        response_id = 7  # not a string: kept as its text

        @property
        def conversation_chain_id(self) -> str:
            raise LookupError("not resolvable here")

    sig = asyncio.Event()
    g = guard(Scripted(stream_events(1)), sig, context=Bare())
    info = g.lifecycle.info
    assert (info.response_id, info.chain_id, info.conversation_id) == ("7", None, None)
    assert (info.is_recovery, info.is_steered_turn, info.background) == (False, False, None)
    await drain(g)
    assert g.lifecycle.state is State.COMPLETED  # no client_cancelled attribute: not a cancel


async def test_the_response_id_comes_from_the_stream_when_the_host_gives_none() -> None:
    g = guard(Scripted(stream_events(1)), asyncio.Event())
    assert g.lifecycle.info.response_id is None
    await drain(g)
    assert g.lifecycle.info.response_id == "resp_1"


# -- the lifecycle events and terminals --------------------------------------------------------------


async def test_created_as_queued_then_in_progress() -> None:
    created = {"type": "response.created", "response": {"id": "r", "status": "queued"}}
    seen: list[State] = []
    g = guard(Scripted([created, event("response.in_progress", "r"), terminal(rid="r")]), asyncio.Event())
    async with asyncio.timeout(5), g:
        async for _ in g:
            seen.append(g.lifecycle.state)
    assert seen[:2] == [State.QUEUED, State.IN_PROGRESS]
    assert g.lifecycle.anomalies == []


async def test_queued_after_in_progress_is_out_of_order_and_changes_nothing() -> None:
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
    events = stream_events(1)
    events.insert(2, bad)
    g = guard(Scripted(events), asyncio.Event())
    await drain(g)
    (anomaly,) = g.lifecycle.anomalies
    assert anomaly.reason.startswith(reason)
    assert anomaly.payload == bad


@pytest.mark.parametrize(
    "bad",
    [
        {"delta": "x"},
        {"type": "response.created", "response": "not an object"},
    ],
    ids=["no type", "invalid lifecycle event"],
)
async def test_strict_mode_raises_on_each_kind_of_bad_input(bad: dict[str, Any]) -> None:
    events = stream_events(1)
    events.insert(2, bad)
    g = guard(Scripted(events), asyncio.Event(), strict=True)
    with pytest.raises(InvalidEvent):
        await drain(g)
    assert g.lifecycle.state is State.FAILED


async def test_an_invalid_lifecycle_event_is_forwarded_with_an_anomaly() -> None:
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
    events = stream_events(1, final=None)
    events.append({"type": "response.completed", "response": {"id": "resp_1", "status": "failed"}})
    g = guard(Scripted(events), asyncio.Event())
    await drain(g)
    assert g.lifecycle.state is State.COMPLETED
    (anomaly,) = g.lifecycle.anomalies
    assert anomaly.kind == "status_mismatch"
    assert anomaly.reason.endswith("; the event type wins")


async def test_a_failed_terminal_records_its_error() -> None:
    events = stream_events(1, final=None)
    events.append(
        {
            "type": "response.failed",
            "response": {
                "id": "resp_1",
                "status": "failed",
                "error": {"code": "boom", "message": "it broke"},
            },
        }
    )
    g = guard(Scripted(events), asyncio.Event())
    await drain(g)
    assert g.lifecycle.error is not None
    assert (g.lifecycle.error.code, g.lifecycle.error.message) == ("boom", "it broke")


@pytest.mark.parametrize("client_cancelled", [False, True])
async def test_a_cancel_the_host_did_not_ask_for_is_explained(client_cancelled: bool) -> None:
    ctx = host_context()
    ctx.client_cancelled = client_cancelled
    sig = asyncio.Event()
    if client_cancelled:
        sig.set()
    events = stream_events(1, final="cancelled")
    g = guard(Scripted(events), sig, context=ctx)
    await drain(g)
    kinds = [a.kind for a in g.lifecycle.anomalies]
    assert ("cancel_without_client_cancel" in kinds) is not client_cancelled
    assert g.lifecycle.state is State.CANCELLED


async def test_a_synthesised_terminal_carries_no_empty_fields_and_says_why() -> None:
    ctx = host_context()
    events = stream_events(1)
    g = guard(Scripted(events, before={len(events) - 1: ctx.shutdown.set}), asyncio.Event(), context=ctx)
    out = await drain(g)
    failed = out[-1]
    assert failed["type"] == "response.failed"
    assert None not in failed["response"].values()
    assert failed["response"]["error"]["code"] == "server_shutdown"
    assert failed["response"]["error"]["message"].startswith("completion produced after shutdown")


@pytest.mark.parametrize(("flag", "cause"), [("cancel", Cause.CLIENT_CANCEL), ("shutdown", Cause.SHUTDOWN)])
async def test_an_ending_without_a_terminal_for_a_known_cause_is_not_a_missing_terminal(
    flag: str, cause: Cause
) -> None:
    ctx = host_context(background=False)
    sig = asyncio.Event()

    def fire() -> None:
        if flag == "cancel":
            ctx.client_cancelled = True
        else:
            ctx.shutdown.set()
        sig.set()

    g = guard(Scripted(stream_events(2, final=None), before={3: fire}), sig, context=ctx)
    await drain(g)
    assert g.lifecycle.cause is cause
    assert "missing_terminal" not in [a.kind for a in g.lifecycle.anomalies]


async def test_an_error_after_the_terminal_keeps_the_recorded_ending() -> None:
    async def raises_late() -> AsyncIterator[Any]:
        for e in stream_events(1):
            yield e
        raise ValueError("after the end")

    g = guard(raises_late(), asyncio.Event())
    with pytest.raises(ValueError, match="after the end"):
        await drain(g)
    assert g.lifecycle.state is State.COMPLETED
    assert g.lifecycle.error is None
    assert g.lifecycle.anomalies == []


@pytest.mark.parametrize(
    ("exc", "state"), [(ValueError("body"), State.FAILED), (KeyboardInterrupt(), State.INTERRUPTED)]
)
async def test_an_error_in_the_async_with_body_ends_the_stream_by_its_kind(
    exc: BaseException, state: State
) -> None:
    g = guard(Scripted(stream_events(3)), asyncio.Event())
    with pytest.raises(type(exc)):
        async with asyncio.timeout(5), g:
            async for _ in g:
                raise exc
    assert g.lifecycle.state is state


async def test_a_consumer_that_breaks_after_a_delta_closed_early_not_errored() -> None:
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


# -- the watchdog ------------------------------------------------------------------------------------


async def test_shutdown_alone_arms_the_watchdog_when_the_host_stops_iterating() -> None:
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


class PlainSignal:
    """A cancellation signal that is not an asyncio.Event: the watchdog polls it."""

    def __init__(self) -> None:
        self.flag = False

    def is_set(self) -> bool:
        return self.flag


async def test_a_signal_that_is_not_an_event_is_polled_and_waited_for() -> None:
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


class BlockingClose(Scripted):
    """An inner stream whose close never returns: the guard must not wait for it inline."""

    async def aclose(self) -> None:
        self.closes += 1
        await asyncio.sleep(3600)


async def test_a_stuck_stream_whose_close_blocks_still_lets_the_guard_end() -> None:
    sig = asyncio.Event()
    sig.set()
    inner = BlockingClose(stream_events(2), before={3: block_ignoring_signal})
    g = guard(inner, sig, cancel_grace=0.05)
    await drain(g)
    assert g.lifecycle.ended
    await asyncio.sleep(0)
    assert inner.closes == 1  # closed once, in the background


async def test_a_stuck_stream_that_swallows_the_cancel_and_blocks_on_close_lets_the_guard_end() -> None:
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


async def test_an_outside_cancel_landing_with_the_stuck_cancel_propagates() -> None:
    async def inner() -> Any:
        for e in stream_events(1, final=None):
            yield e
        try:
            await block_ignoring_signal()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()  # someone else cancels too, while ours is being delivered
            raise

    sig = asyncio.Event()
    sig.set()
    g = guard(inner(), sig, cancel_grace=0.05)
    task = asyncio.create_task(drain(g))
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(5):
            await task
    assert g.lifecycle.state is State.CANCELLED
    assert "stuck" not in [a.kind for a in g.lifecycle.anomalies]  # ended by that cancel, not by ours


async def test_a_dropped_event_does_not_change_how_a_later_cancel_is_read() -> None:
    sig = asyncio.Event()
    sig.set()
    events = stream_events(2)
    events.insert(3, 42)  # dropped, with an anomaly, just before the stream gets stuck
    inner = Scripted(events, before={4: block_ignoring_signal})
    g = guard(inner, sig, cancel_grace=0.05)
    await drain(g)  # the watchdog's cancel is taken back: no CancelledError here
    assert [a.kind for a in g.lifecycle.anomalies] == ["not_a_mapping", "stuck"]


async def test_nested_async_with_is_refused() -> None:
    g = guard(Scripted(stream_events(1)), asyncio.Event())
    async with asyncio.timeout(5), g:
        with pytest.raises(GuardAlreadyUsed):
            async with g:
                pass


async def test_the_hosts_response_id_is_kept_over_the_streams() -> None:
    ctx = host_context()
    ctx.response_id = "resp_from_host"
    g = guard(Scripted(stream_events(1)), asyncio.Event(), context=ctx)
    await drain(g)
    assert g.lifecycle.info.response_id == "resp_from_host"


async def test_a_missing_terminal_is_synthesised_without_empty_fields() -> None:
    g = guard(Scripted(stream_events(1, final=None)), asyncio.Event())
    out = await drain(g)
    assert out[-1]["type"] == "response.failed"
    assert None not in out[-1]["response"].values()


async def test_a_recovered_run_that_raises_at_once_is_failed_with_its_error() -> None:
    ctx = host_context()
    ctx.is_recovery = True

    async def raises() -> AsyncIterator[Any]:
        raise ValueError("cannot resume")
        yield  # pragma: no cover

    g = guard(raises(), asyncio.Event(), context=ctx)
    assert g.lifecycle.state is State.INTERRUPTED  # a recovered re-entry starts interrupted
    with pytest.raises(ValueError, match="cannot resume"):
        await drain(g)
    assert g.lifecycle.state is State.FAILED
    assert g.lifecycle.error is not None
    assert g.lifecycle.error.message == "cannot resume"


@pytest.mark.parametrize(
    "bad",
    [
        {"type": "response.completed", "response": {"id": "resp_1", "status": "failed"}},
        {"type": "response.queued", "response": {"id": "resp_1", "status": "queued"}},
    ],
    ids=["status contradicts the type", "out of order"],
)
async def test_strict_mode_raises_on_the_rest_of_the_bad_input_the_readme_lists(bad: dict[str, Any]) -> None:
    events = stream_events(1)
    if bad["type"] == "response.completed":
        events[-1] = bad
    else:
        events.insert(2, bad)
    g = guard(Scripted(events), asyncio.Event(), strict=True)
    with pytest.raises(InvalidEvent):
        await drain(g)


async def test_strict_mode_does_not_raise_for_a_withheld_terminal() -> None:
    # A withheld terminal is the guard's decision, not bad input.
    ctx = host_context()
    sig = asyncio.Event()
    events = stream_events(1)

    def cancel() -> None:
        ctx.client_cancelled = True
        sig.set()

    g = guard(Scripted(events, before={len(events) - 1: cancel}), sig, context=ctx, strict=True)
    out = await drain(g)
    assert out[-1]["type"] != "response.completed"
    assert g.lifecycle.state is State.CANCELLED


async def test_a_process_shutdown_flag_that_is_not_set_changes_nothing() -> None:
    # GuardedResponses hands every guard its flag; until the process exits, a cancel is a cancel.
    g = guard(
        Scripted(stream_events(3), before={3: block_ignoring_signal}),
        asyncio.Event(),
        context=host_context(),
        process_shutdown=threading.Event(),
    )
    task = asyncio.create_task(drain(g))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert g.lifecycle.state is State.CANCELLED


async def test_a_lifecycle_event_after_the_recorded_ending_is_not_forwarded_nor_applied() -> None:
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


async def test_closing_the_guard_finishes_the_iterator_it_handed_out() -> None:
    g = guard(Scripted(stream_events(3)), asyncio.Event())
    async with asyncio.timeout(5):
        it = aiter(g)
        await anext(it)
        await g.aclose()
    assert it.ag_frame is None  # finished in that call, not left suspended for the garbage collector


async def test_the_slow_path_runs_once_per_output_type_then_the_hot_path_takes_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The hot path is the guard's cost model (README, benchmarks): an output or delta type goes through
    # the slow path once, and every later event of that type is forwarded without it.
    seen: list[str] = []
    slow = Referee.event

    def counting(self: Referee, e: Any) -> Any:
        seen.append(e["type"])
        return slow(self, e)

    monkeypatch.setattr(Referee, "event", counting)
    events = stream_events(50)
    out = await drain(guard(Scripted(events), asyncio.Event()))
    assert out == events
    assert seen == [
        "response.created",
        "response.in_progress",
        "response.output_text.delta",
        "response.completed",
    ]
