"""Endings: what the guard records and forwards when a stream ends, by a terminal of its own, without
one, or by an error; lifecycle events on the way there.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from eventguard import Cause, State, guard
from eventguard.testing.streams import (
    Scripted,
    event,
    host_context,
    stream_events,
    terminal,
)

from .helpers import (
    BOUND,
    collect,
    drain,
)


@pytest.mark.parametrize(("length", "kept"), [(500, 500), (501, 500), (2000, 500)])
async def test_the_recorded_error_message_is_cut_at_500_characters(length: int, kept: int) -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""

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


async def test_a_stream_created_as_queued_moves_on_to_in_progress() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    created = {"type": "response.created", "response": {"id": "r", "status": "queued"}}
    seen: list[State] = []
    g = guard(Scripted([created, event("response.in_progress", "r"), terminal(rid="r")]), asyncio.Event())
    async with asyncio.timeout(5), g:
        async for _ in g:
            seen.append(g.lifecycle.state)
    assert seen[:2] == [State.QUEUED, State.IN_PROGRESS]
    assert g.lifecycle.anomalies == []


async def test_a_failed_terminal_records_its_error() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
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


async def test_a_synthesised_terminal_carries_no_empty_fields_and_says_why() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
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
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
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
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""

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


async def test_a_missing_terminal_is_synthesised_without_empty_fields() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    g = guard(Scripted(stream_events(1, final=None)), asyncio.Event())
    out = await drain(g)
    assert out[-1]["type"] == "response.failed"
    assert None not in out[-1]["response"].values()


async def test_a_recovered_run_that_raises_at_once_is_failed_with_its_error() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
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


@pytest.mark.parametrize("twice", [False, True], ids=["one terminal", "a duplicate terminal"])
async def test_a_recovered_run_has_one_terminal(twice: bool) -> None:
    """Origin: right but untested, pinned at stop 9 (test_pinned_behaviours.py)."""
    ctx = host_context()
    ctx.is_recovery = True
    events = stream_events(2)  # the recovered attempt replays created and in_progress
    if twice:
        events.append(terminal())
    g = guard(Scripted(events), asyncio.Event(), context=ctx)
    out = await collect(g)
    lc = g.lifecycle
    assert [e["type"] for e in out].count("response.completed") == 1
    ends = [t for t in lc.transitions if t.to_state in (State.COMPLETED, State.FAILED, State.CANCELLED)]
    assert [t.to_state for t in ends] == [State.COMPLETED]
    assert [t.to_state for t in lc.transitions] == [State.IN_PROGRESS, State.COMPLETED]
    assert lc.attempt == 2
    assert [a.kind for a in lc.anomalies] == (["duplicate_terminal"] if twice else [])


async def test_queued_is_read_from_json_decoded_events_too() -> None:
    # json.loads builds fresh (not interned) strings: the guard compares by value, never by identity.
    """Origin: right but untested, pinned at stop 9 (test_pinned_behaviours.py)."""
    raw = json.dumps(
        [
            {"type": "response.created", "response": {"id": "resp_q", "status": "queued"}},
            {"type": "response.queued", "response": {"id": "resp_q", "status": "queued"}},
            {"type": "response.in_progress", "response": {"id": "resp_q", "status": "in_progress"}},
            {"type": "response.output_text.delta", "delta": "x"},
            {"type": "response.completed", "response": {"id": "resp_q", "status": "completed"}},
        ]
    )
    events = json.loads(raw)
    seen: list[State] = []
    g = guard(Scripted(events), asyncio.Event())
    async with asyncio.timeout(BOUND), g:
        async for _ in g:
            seen.append(g.lifecycle.state)
    assert seen[:3] == [State.QUEUED, State.QUEUED, State.IN_PROGRESS]
    assert [t.to_state for t in g.lifecycle.transitions] == [State.QUEUED, State.IN_PROGRESS, State.COMPLETED]
    assert g.lifecycle.anomalies == []
    assert g.lifecycle.info.response_id == "resp_q"


class RecorderGaveUp(BaseException):
    """Not an ``Exception``: what a recorder's bug or a runtime limit may raise mid-event."""


class RaisingRecorder:
    """A sink whose recorder raises ``RecorderGaveUp`` on its ``at``-th event (an output delta)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def recorder(self, lifecycle: Any) -> RaisingRecorder:
        return self

    def event(self, index: int, event_type: str | None, event: object) -> None:
        if index == self.at:
            raise RecorderGaveUp(f"recorder gave up at event {index}")

    def changed(self) -> None:
        pass

    async def close(self) -> None:
        pass


@pytest.mark.parametrize("at", [2, 3], ids=["first delta (slow path)", "second delta (hot path)"])
async def test_the_guards_own_base_exception_ends_the_stream_as_its_error_not_a_recovery(at: int) -> None:
    """A ``BaseException`` that is not the inner stream's (here its recorder's, while the guard works on an
    event) is let through untouched and recorded as the guard's own error (``failed``, ``error``): only
    the inner stream's ``BaseException`` (the host's ``ResponseExitForRecovery``) means a run that may be
    recovered (``interrupted``).

    Origin: mutants that survived the run over guard/core.py (docs/mutation.md): ``phase = 1`` becoming
    0 and ``phase == 1`` becoming ``== 2`` or ``> 1`` sent such an exception down the inner stream's path."""
    inner = Scripted(stream_events(3))
    g = guard(inner, asyncio.Event(), sink=RaisingRecorder(at))
    with pytest.raises(RecorderGaveUp):
        async with asyncio.timeout(5):
            async for _ in g:
                pass
    assert (g.lifecycle.state, g.lifecycle.cause) == (State.FAILED, Cause.ERROR)
    assert g.lifecycle.error is not None and g.lifecycle.error.message == f"recorder gave up at event {at}"
    assert inner.closes == 1


async def test_a_cancelled_terminal_is_recorded_the_moment_it_is_forwarded() -> None:
    """A cancel is final as soon as it is seen (nothing later can change it), so the lifecycle ends
    ``cancelled`` when the terminal is handed over, not when the inner stream ends; other terminals wait
    for the stream's end, where a client cancel may still overrule them.

    Origin: mutants that survived the run over guard/referee.py (docs/mutation.md): ``decision.state is
    State.CANCELLED or lc.ended`` becoming ``<`` or ``and`` kept the cancel pending until the end."""
    events = [*stream_events(1, final=None), terminal("cancelled")]
    g = guard(Scripted(events), asyncio.Event())
    states: dict[str, State] = {}
    async with asyncio.timeout(5), g:
        async for e in g:
            states[e["type"]] = g.lifecycle.state
    assert states["response.failed"] is State.CANCELLED
    assert states["response.output_text.delta"] is State.IN_PROGRESS
    assert [a.kind for a in g.lifecycle.anomalies] == ["cancel_without_client_cancel"]
    assert g.lifecycle.state is State.CANCELLED
