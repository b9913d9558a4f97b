"""After the guard records its own ending (``abandoned``: the host stopped iterating past
``cancel_grace`` after a cancel), a consumer that resumes gets the terminal it is owed. That event
is stored, and the row's ``event_count`` counts it: before, the row was terminal already and the
upsert took no change at all, so the count stayed one short of the stored events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from eventguard import guard
from eventguard.sink import SqlSink
from eventguard.store import ResponseStore

from .conftest import Target
from .helpers import script


async def test_the_terminal_owed_after_an_abandoned_ending_is_counted_in_the_row(target: Target) -> None:
    rid = "resp_owed"
    signal = asyncio.Event()

    async def slow() -> AsyncIterator[Any]:
        for ev in script(rid, n_deltas=20):
            await asyncio.sleep(0.01)
            yield ev

    sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
    await sink.start()
    seen: list[str] = []
    try:
        async with asyncio.timeout(30):
            g = guard(slow(), signal, sink=sink, cancel_grace=0.05, on_cancel="emit")
            async with g:
                async for ev in g:
                    seen.append(ev["type"])
                    if len(seen) == 3:
                        signal.set()  # the client cancels, and the host stalls past cancel_grace
                        await asyncio.sleep(0.5)
    finally:
        await sink.aclose()
    assert seen[-1] == "response.failed" and len(seen) == 4, seen
    async with ResponseStore(target.url, schema=target.schema) as store, asyncio.timeout(30):
        record = await store.get(rid)
        history = await store.history(rid)
    assert record is not None and history is not None
    assert (record.status, record.cause) == ("cancelled", "client_cancel")
    stored = sum(len(a.events) for a in history.attempts)
    assert (record.event_count, stored) == (4, 4)
