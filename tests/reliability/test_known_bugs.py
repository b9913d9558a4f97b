"""Library bugs the reliability suite found, each pinned by a test that fails until it is fixed.

``xfail(strict=True)``: when a fix lands the test passes, the xfail turns into a failure, and the
marker must be removed. The fixes are described in each reason.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from eventguard import SqlSink, guard
from eventguard.store import ResponseStore

RID = "resp_known_bug"


def created() -> dict[str, Any]:
    return {"type": "response.created", "response": {"id": RID, "status": "in_progress"}}


def in_progress() -> dict[str, Any]:
    return {"type": "response.in_progress", "response": {"id": RID, "status": "in_progress"}}


def delta() -> dict[str, Any]:
    return {"type": "response.output_text.delta", "delta": "x", "output_index": 0}


def completed() -> dict[str, Any]:
    return {"type": "response.completed", "response": {"id": RID, "status": "completed"}}


async def slow_tail(events: list[Any], pause: float) -> AsyncIterator[Any]:
    for ev in events:
        await asyncio.sleep(0)
        yield ev
    await asyncio.sleep(pause)  # the handler lingers after its last event; the writer flushes meanwhile


async def run(tmp_path: Path, events: list[Any]) -> tuple[list[Any], Any]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'bugs.db'}"
    async with asyncio.timeout(30):
        async with SqlSink(url, spool_path=tmp_path / "spool", flush_interval=0.01) as sink:
            out: list[Any] = []
            async with guard(slow_tail(events, 0.3), asyncio.Event(), sink=sink) as g:
                async for ev in g:
                    out.append(ev)
        async with ResponseStore(url) as store:
            hist = await store.history(RID)
    return out, hist


async def test_event_count_includes_the_terminal(tmp_path: Path) -> None:
    out, hist = await run(tmp_path, [created(), in_progress(), delta(), completed()])
    assert len(out) == 4
    assert hist.response.status == "completed"
    assert hist.response.event_count == 4


async def test_synthesised_terminal_is_stored(tmp_path: Path) -> None:
    out, hist = await run(tmp_path, [created(), in_progress(), delta()])
    assert [e["type"] for e in out][-1] == "response.failed"
    stored = [e.type for a in hist.attempts for e in a.events]
    assert stored == [e["type"] for e in out]


@pytest.mark.upstream
async def test_disconnect_after_terminal_matches_the_host(tmp_path: Path) -> None:
    from ._common import database
    from .test_fault_matrix import CASES, run_case

    async with database("sqlite", tmp_path) as db:
        async with asyncio.timeout(60):
            await run_case(db, "client_disconnect", 30, tmp_path)
    case = CASES[-1]
    assert not [k for k in case["known"] if "GET says" in k], case
