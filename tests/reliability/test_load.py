"""Load: concurrent responses on loopback through uvicorn, called with ``openai.AsyncOpenAI``.

A tenth of the streams are closed by the client mid-stream (the host sees a disconnect and cancels).
Checks, on SQLite and PostgreSQL: zero lost events (stored == forwarded for every response), zero
lock errors and nothing spooled, exactly one terminal transition each, and every stored status equal
to ``client.responses.retrieve(id).status``. CI: 200 responses; ``EVENTGUARD_SLOW=1``: 1,000.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from agent_framework_foundry_hosting import ResponsesHostServer
from sqlalchemy import func, select

from eventguard import SqlSink
from eventguard.foundry import GuardedResponses
from eventguard.sql.tables import events, responses, transitions
from eventguard.store import ResponseStore
from eventguard.testing import ScriptedChatClient, chat_agent, loopback_server

from ._common import SLOW, database, report
from ._host import poll

pytestmark = pytest.mark.upstream

N = 1000 if SLOW else 200
CHUNKS = 12
TERMINAL = ("completed", "incomplete", "failed", "cancelled")


class LoadServer(GuardedResponses, ResponsesHostServer):  # type: ignore[misc]
    eventguard_keep_guards = 5000


def serving(app: Any) -> AbstractAsyncContextManager[str]:
    # Idle keep-alive connections stay open for the whole test: with uvicorn's default (5 s) a pooled
    # connection the server is just closing can be reused by the client (a ReadError on a retrieve
    # after the minute the test may wait for every guard to end), a race of the harness, not the host.
    return loopback_server(app, within=60, log_level="warning", backlog=4096, timeout_keep_alive=600)


async def one(client: openai.AsyncOpenAI, i: int, ids: dict[int, str], cancel: bool) -> int:
    seen = 0
    stream = await client.responses.create(model="scripted", input=f"go {i}", stream=True)
    try:
        async for ev in stream:
            seen += 1
            if ev.type == "response.created":
                ids[i] = ev.response.id
            if cancel and seen == 4:
                break
    finally:
        await stream.close()
    return seen


@pytest.mark.parametrize("db_kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_concurrent_load(db_kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="eventguard")
    async with database(db_kind, tmp_path) as db:
        sink = SqlSink(db.url, schema=db.schema, spool_path=db.spool)
        await sink.start()
        agent, _ = chat_agent(ScriptedChatClient(tuple(f"w{i} " for i in range(CHUNKS)), delay=0.1))
        server = LoadServer(agent, sink=sink, cancel_grace=2.0, configure_observability=None)
        ids: dict[int, str] = {}
        cancelled = {i for i in range(N) if i % 10 == 0}
        started = time.perf_counter()
        limits = httpx.Limits(max_connections=N + 50, max_keepalive_connections=N + 50)
        try:
            async with serving(server) as base_url:
                http = httpx.AsyncClient(limits=limits, timeout=120)
                async with openai.AsyncOpenAI(
                    base_url=base_url, api_key="x", http_client=http, max_retries=0
                ) as client:
                    async with asyncio.timeout(600):
                        await asyncio.gather(*(one(client, i, ids, i in cancelled) for i in range(N)))
                    assert len(ids) == N
                    # Every guard ends (a cancelled one once the host noticed the disconnect).
                    guards = {i: server.guard_for(rid) for i, rid in ids.items()}
                    assert all(g is not None for g in guards.values())
                    ok = await poll(lambda: all(g.lifecycle.ended for g in guards.values()), 60, 0.1)
                    assert ok, "some guards never ended"
                    api: dict[str, str] = {}
                    sem = asyncio.Semaphore(50)

                    async def status(rid: str) -> None:
                        async with sem, asyncio.timeout(60):
                            for _ in range(100):
                                got = (await client.responses.retrieve(rid)).status
                                if got in TERMINAL:
                                    break
                                await asyncio.sleep(0.05)
                            api[rid] = str(got)

                    async with asyncio.timeout(300):
                        await asyncio.gather(*(status(rid) for rid in ids.values()))
            elapsed = time.perf_counter() - started
            async with asyncio.timeout(60):
                await sink.flush()
        finally:
            await sink.aclose()

        async with ResponseStore(db.url, schema=db.schema) as store:
            engine = store.reader
            async with engine.begin() as conn:
                stored = dict((await conn.execute(select(responses.c.response_id, responses.c.status))).all())
                counts = dict(
                    (
                        await conn.execute(
                            select(events.c.response_id, func.count()).group_by(events.c.response_id)
                        )
                    ).all()
                )
                terminals = dict(
                    (
                        await conn.execute(
                            select(transitions.c.response_id, func.count())
                            .where(transitions.c.to_state.in_(TERMINAL))
                            .group_by(transitions.c.response_id)
                        )
                    ).all()
                )
    lost = 0
    mismatched = []
    for i, rid in ids.items():
        forwarded = guards[i].lifecycle.events_forwarded
        lost += max(0, forwarded - counts.get(rid, 0))
        if stored.get(rid) != api[rid] or guards[i].lifecycle.state.value != api[rid]:
            mismatched.append((rid, stored.get(rid), guards[i].lifecycle.state.value, api[rid]))
    lock_errors = [r.getMessage() for r in caplog.records if "lock" in r.getMessage().lower()]
    n_cancelled = sum(1 for rid in ids.values() if stored.get(rid) == "cancelled")
    report(
        "load",
        db=db_kind,
        responses=N,
        cancelled=n_cancelled,
        events_stored=sum(counts.values()),
        lost_events=lost,
        lock_errors=len(lock_errors),
        spooled=sink.stats.batches_spooled,
        status_mismatches=len(mismatched),
        seconds=round(elapsed, 1),
    )
    assert lost == 0
    assert not lock_errors
    assert sink.stats.batches_spooled == 0 and sink.stats.last_error is None
    assert all(terminals.get(rid) == 1 for rid in ids.values())
    assert not mismatched, mismatched[:5]
    assert n_cancelled == len(cancelled)
