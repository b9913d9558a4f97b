"""End to end with real parts: the guarded host under uvicorn, the official ``openai`` client as the
caller, an ``SqlSink`` on SQLite and on PostgreSQL. For each response the status in SQL equals what
the client reads back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest

from eventguard import ResponseStore, SqlSink
from eventguard.testing import ScriptedChatClient, chat_agent, workflow_agent
from tests._postgres import PG_URL, fresh_schema

from ._drivers import STEP, wait_for
from .test_loopback_openai import openai_client, serving

pytestmark = [pytest.mark.upstream]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[str, str | None]]:
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'e2e.db'}", None
        return
    async with fresh_schema("eg_e2e") as schema:
        yield PG_URL, schema


def guarded(agent: Any, sink: SqlSink) -> Any:
    from eventguard.foundry import GuardedResponsesHostServer

    return GuardedResponsesHostServer(agent, sink=sink, configure_observability=None, cancel_grace=2.0)


async def settled(client: Any, response_id: str) -> str:
    """The public status once the host has settled it (a foreground run is stored when it ends)."""
    async with asyncio.timeout(STEP):
        while True:
            try:
                status = (await client.responses.retrieve(response_id)).status
            except openai.NotFoundError:
                status = None
            if status not in (None, "queued", "in_progress"):
                return str(status)
            await asyncio.sleep(0.05)


async def stored(store: ResponseStore, response_id: str) -> str | None:
    """The status in SQL once the sink has written the ending."""
    running = ("new", "queued", "in_progress")
    async with asyncio.timeout(STEP):
        while True:
            record = await store.get(response_id)
            if record is not None and record.status not in running:
                return record.status
            await asyncio.sleep(0.05)


async def test_streaming_background_and_cancelled_runs_agree_with_the_api(
    database: tuple[str, str | None], tmp_path: Path
) -> None:
    url, schema = database
    statuses: dict[str, tuple[str, str | None]] = {}
    async with asyncio.timeout(60):
        sink = SqlSink(url, schema=schema, spool_path=tmp_path / "spool.jsonl")
        await sink.migrate()
        store = ResponseStore(url, schema=schema)

        # Streaming, completes.
        agent, _ = chat_agent(ScriptedChatClient(("Hello", " there")), name="e2e-chat")
        async with serving(guarded(agent, sink)) as base, openai_client(base) as client:
            stream = await client.responses.create(model="scripted", input="go", stream=True, store=True)
            events = [e async for e in stream]
            rid = events[0].response.id
            statuses["stream"] = (await settled(client, rid), await stored(store, rid))

        # Background, completes.
        agent, _ = workflow_agent("complete", name="e2e-bg")
        async with serving(guarded(agent, sink)) as base, openai_client(base) as client:
            created = await client.responses.create(model="scripted", input="go", background=True, store=True)
            statuses["background"] = (await settled(client, created.id), await stored(store, created.id))

        # Background, cancelled while its executor is suspended (the seed).
        agent, probe = workflow_agent("stuck", name="e2e-seed")
        async with serving(guarded(agent, sink)) as base, openai_client(base) as client:
            created = await client.responses.create(model="scripted", input="go", background=True, store=True)
            await wait_for(probe.started)
            await client.responses.cancel(created.id)
            statuses["cancelled"] = (await settled(client, created.id), await stored(store, created.id))
            history = await store.history(created.id)

        # Streaming, cancelled after text: the caller walks away mid-stream.
        agent, probe = chat_agent(ScriptedChatClient(hang_after=2), name="e2e-walkaway")
        async with serving(guarded(agent, sink)) as base, openai_client(base) as client:
            stream = await client.responses.create(model="scripted", input="go", stream=True, store=True)
            async for event in stream:
                if event.type == "response.created":
                    rid = event.response.id
                if event.type == "response.output_text.delta":
                    break
            await stream.close()
            await wait_for(probe.interrupted)
            statuses["disconnect"] = (await settled(client, rid), await stored(store, rid))

        await sink.aclose()
        await store.aclose()

    assert statuses == {
        "stream": ("completed", "completed"),
        "background": ("completed", "completed"),
        "cancelled": ("cancelled", "cancelled"),
        "disconnect": ("cancelled", "cancelled"),
    }
    assert history is not None
    assert [e.type for e in history.attempts[0].events][:2] == ["response.created", "response.in_progress"]
    assert sink.stats.refusals == []
