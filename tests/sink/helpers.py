"""Scripted streams and a runner for sink tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from eventguard import guard
from eventguard.lifecycle import Lifecycle, ResponseInfo, State
from eventguard.sink import SqlSink
from eventguard.sink.recorder import SqlRecorder


def created(rid: str) -> dict[str, Any]:
    return {"type": "response.created", "response": {"id": rid, "status": "in_progress"}}


def in_progress(rid: str) -> dict[str, Any]:
    return {"type": "response.in_progress", "response": {"id": rid, "status": "in_progress"}}


def delta(i: int) -> dict[str, Any]:
    return {"type": "response.output_text.delta", "delta": f"d{i}", "output_index": 0}


def item_done() -> dict[str, Any]:
    return {"type": "response.output_item.done", "item": {"type": "message", "content": "hello"}}


def terminal(rid: str, status: str = "completed") -> dict[str, Any]:
    etype = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(
        status, "response.failed"
    )
    resp: dict[str, Any] = {
        "id": rid,
        "status": status,
        "usage": {"input_tokens": 3, "output_tokens": 5, "total_tokens": 8},
    }
    if status == "failed":
        resp["error"] = {"code": "server_error", "message": "boom"}
    return {"type": etype, "response": resp}


def script(rid: str, n_deltas: int = 5, final: str | None = "completed") -> list[Any]:
    evs: list[Any] = [created(rid), in_progress(rid), *(delta(i) for i in range(n_deltas)), item_done()]
    if final is not None:
        evs.append(terminal(rid, final))
    return evs


async def aiter_of(events: list[Any], pause: float = 0.0) -> AsyncIterator[Any]:
    for ev in events:
        if pause:
            await asyncio.sleep(pause)
        else:
            await asyncio.sleep(0)
        yield ev


async def stored_in_progress(sink: SqlSink, rid: str) -> tuple[Lifecycle, SqlRecorder]:
    """A stream of ``rid`` whose row is stored ``in_progress``: its lifecycle and recorder."""
    lc = Lifecycle(info=ResponseInfo(response_id=rid))
    rec = sink.recorder(lc)
    lc.transition(State.IN_PROGRESS)
    rec.changed()
    await sink.flush()
    return lc, rec


async def run_guarded(sink: SqlSink, events: list[Any], **kwargs: Any) -> list[Any]:
    """Drive one guarded stream to its end; return what the client saw."""
    seen: list[Any] = []
    async with asyncio.timeout(30):
        g = guard(aiter_of(events), asyncio.Event(), sink=sink, **kwargs)
        async with g:
            async for ev in g:
                seen.append(ev)
    return seen
