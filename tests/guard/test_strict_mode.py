"""Strict mode: ``strict=True`` raises ``InvalidEvent`` on the bad input the README lists, and only there."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from eventguard import InvalidEvent, State, guard
from eventguard.testing.streams import (
    Scripted,
    host_context,
    stream_events,
)

from .helpers import (
    drain,
)


@pytest.mark.parametrize(
    "bad",
    [
        {"delta": "x"},
        {"type": "response.created", "response": "not an object"},
    ],
    ids=["no type", "invalid lifecycle event"],
)
async def test_strict_mode_raises_on_each_kind_of_bad_input(bad: dict[str, Any]) -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    events = stream_events(1)
    events.insert(2, bad)
    g = guard(Scripted(events), asyncio.Event(), strict=True)
    with pytest.raises(InvalidEvent):
        await drain(g)
    assert g.lifecycle.state is State.FAILED


@pytest.mark.parametrize(
    "bad",
    [
        {"type": "response.completed", "response": {"id": "resp_1", "status": "failed"}},
        {"type": "response.queued", "response": {"id": "resp_1", "status": "queued"}},
    ],
    ids=["status contradicts the type", "out of order"],
)
async def test_strict_mode_raises_on_the_rest_of_the_bad_input_the_readme_lists(bad: dict[str, Any]) -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
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
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
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
