"""A guard that has ended keeps what it reports (its lifecycle) and lets go of what it was given.

``GuardedResponses`` keeps the last guards for ``guard_for()``. Until 2026-12-06 each kept the host's
context (the whole request), the inner stream, its recorder, the terminal's response snapshot and the
task of its first step; ``tests/upstream/test_a_kept_guard_keeps_no_request.py`` shows it with the real
host. Here each of those is looked for among everything the finished guard can reach.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from eventguard import State, guard
from eventguard.testing.streams import Scripted, host_context, stream_events, terminal

from .helpers import CountingSink, drain

#: A value only the terminal's response snapshot carries.
MARKER = "only-in-the-terminal-snapshot"


def _reachable(root: object) -> list[object]:
    """Every object ``root`` reaches, through everything but modules, classes and functions."""
    seen: dict[int, object] = {}
    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen[id(obj)] = obj
        if isinstance(obj, type) or type(obj).__name__ in (
            "module",
            "function",
            "builtin_function_or_method",
        ):
            continue
        todo.extend(gc.get_referents(obj))
    return list(seen.values())


@pytest.mark.parametrize("with_sink", [False, True], ids=["no-sink", "sink"])
@pytest.mark.parametrize("ending", ["completed", "closed-early"])
async def test_a_finished_guard_reaches_nothing_it_was_given(with_sink: bool, ending: str) -> None:
    final = terminal()
    final["response"]["instructions"] = MARKER
    inner = Scripted([*stream_events(3, final=None), final])
    context = host_context()
    signal = asyncio.Event()
    sink = CountingSink() if with_sink else None
    g = guard(inner, signal, context=context, sink=sink)

    async def consume() -> None:
        if ending == "completed":
            await drain(g)
            return
        async for _ in g:
            break
        await g.aclose()

    async with asyncio.timeout(5):
        task = asyncio.create_task(consume())
        await task
    assert g.lifecycle.ended and g.inner_closed == 1
    if ending == "completed":
        assert g.lifecycle.state is State.COMPLETED
    gc.collect()
    reached = _reachable(g)
    given: dict[str, object] = {
        "inner stream": inner,
        "context": context,
        "signal": signal,
        "first task": task,
    }
    if sink is not None:
        given["recorder"] = sink
    assert [name for name, obj in given.items() if any(r is obj for r in reached)] == []
    assert not any(r == MARKER for r in reached if isinstance(r, str)), "the terminal's snapshot is kept"


def test_a_released_host_answers_with_the_flags_it_had() -> None:
    """What the guard asks its host after the end (nothing should, but an ending decided late would)
    is answered as it stood then, not by a context it no longer holds."""
    from eventguard.guard.host import Host

    context: Any = host_context()
    signal = asyncio.Event()
    signal.set()
    context.client_cancelled = True
    host = Host(signal, context)
    before = host.flags()
    host.release()
    context.client_cancelled = False
    signal.clear()
    assert host.flags() == before and host.context is None
