"""What the host's context says: the response id, the mode, the shutdown flags (the context's, of any
kind, and the process's), read by attribute and never more than they say.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from eventguard import Cause, State, guard
from eventguard.testing.streams import (
    Scripted,
    block_ignoring_signal,
    host_context,
    stream_events,
)

from .helpers import (
    SHUTDOWN_FLAGS,
    collect,
    drain,
)


async def test_a_context_that_says_little_is_read_as_no_cause_and_no_mode() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""

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
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    g = guard(Scripted(stream_events(1)), asyncio.Event())
    assert g.lifecycle.info.response_id is None
    await drain(g)
    assert g.lifecycle.info.response_id == "resp_1"


async def test_the_hosts_response_id_is_kept_over_the_streams() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    ctx = host_context()
    ctx.response_id = "resp_from_host"
    g = guard(Scripted(stream_events(1)), asyncio.Event(), context=ctx)
    await drain(g)
    assert g.lifecycle.info.response_id == "resp_from_host"


async def test_a_process_shutdown_flag_that_is_not_set_changes_nothing() -> None:
    # GuardedResponses hands every guard its flag; until the process exits, a cancel is a cancel.
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
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


@pytest.mark.parametrize("kind", list(SHUTDOWN_FLAGS))
async def test_a_completion_under_a_shutdown_flag_of_any_kind_is_replaced(kind: str) -> None:
    """Origin: right but untested, pinned at stop 9 (test_pinned_behaviours.py)."""
    ctx = host_context()
    ctx.shutdown = SHUTDOWN_FLAGS[kind]()
    events = stream_events(2)
    g = guard(Scripted(events, before={len(events) - 1: ctx.shutdown.set}), asyncio.Event(), context=ctx)
    out = await collect(g)
    assert out[-1]["type"] == "response.failed"
    assert out[-1]["response"]["error"]["code"] == "server_shutdown"
    assert (g.lifecycle.state, g.lifecycle.cause) == (State.FAILED, Cause.SHUTDOWN)
