"""``GuardedResponsesHostServer(agent, database=URL)``: one URL for the sink and the host's response
store, handed to the host under the keyword its release knows, opened and closed with the app."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest
from agent_framework_foundry_hosting import ResponsesHostServer
from agent_framework_foundry_hosting._state_store import AgentSessionStoreProvider
from azure.ai.agentserver.responses import InMemoryResponseProvider

from eventguard import SqlAgentSessionStoreProvider, SqlResponseProvider, SqlSink
from eventguard.foundry import GuardedResponsesHostServer
from eventguard.testing import chat_agent

pytestmark = [pytest.mark.upstream]

KEYWORD = (
    "response_store"
    if "response_store" in inspect.signature(ResponsesHostServer.__init__).parameters
    else "store"
)


def build(**options: Any) -> GuardedResponsesHostServer:
    agent, _ = chat_agent()
    return GuardedResponsesHostServer(agent, configure_observability=None, **options)


def test_one_url_builds_the_sink_and_the_store_on_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'one.db'}"
    server = build(database=url)
    storage = server.eventguard_storage
    assert storage is not None
    assert isinstance(storage.sink, SqlSink) and isinstance(storage.provider, SqlResponseProvider)
    assert storage.sink.url == storage.provider.url
    assert server._eventguard_sink is storage.sink


def test_spool_path_is_the_spool_of_the_sink_database_builds(tmp_path: Path) -> None:
    server = build(database=f"sqlite:///{tmp_path / 'one.db'}", spool_path=tmp_path / "mine.jsonl")
    storage = server.eventguard_storage
    assert storage is not None and isinstance(storage.sink, SqlSink)
    assert storage.sink.spool.path == tmp_path / "mine.jsonl"


def test_spool_path_without_a_sink_of_database_s_making_is_refused(tmp_path: Path) -> None:
    spool = tmp_path / "mine.jsonl"
    with pytest.raises(ValueError, match="spool_path= is the spool of the sink database= builds"):
        build(spool_path=spool)
    with pytest.raises(ValueError, match="give that sink its spool_path="):
        build(database=f"sqlite:///{tmp_path / 'one.db'}", sink=None, spool_path=spool)


def test_sink_none_keeps_only_the_store(tmp_path: Path) -> None:
    server = build(database=f"sqlite:///{tmp_path / 'store.db'}", sink=None)
    assert server.eventguard_storage is not None
    assert server.eventguard_storage.sink is None and server._eventguard_sink is None
    assert isinstance(server.eventguard_storage.provider, SqlResponseProvider)


def test_a_store_of_your_own_is_kept(tmp_path: Path) -> None:
    mine = InMemoryResponseProvider()
    server = build(database=f"sqlite:///{tmp_path / 'sink.db'}", **{KEYWORD: mine})
    assert server.eventguard_storage is not None and server.eventguard_storage.provider is None
    assert isinstance(server.eventguard_storage.sink, SqlSink)


async def test_the_app_lifespan_opens_and_closes_both(tmp_path: Path) -> None:
    server = build(database=f"sqlite:///{tmp_path / 'life.db'}", migrate=True)
    storage = server.eventguard_storage
    assert storage is not None and storage.sink is not None and storage.provider is not None
    async with asyncio.timeout(30):
        async with server.router.lifespan_context(server):
            assert storage.sink.ready and storage.provider._ready
            await storage.provider.create_response({"id": "resp_life", "status": "queued"}, None, None)
        assert storage.sink.closed
        # The store's own pool is gone, the rows are not: a new engine reads them.
        again = SqlResponseProvider(storage.provider.url)
        assert (await again.get_response("resp_life"))["status"] == "queued"
        await again.aclose()


async def test_an_app_whose_lifespan_runs_twice_records_in_both(tmp_path: Path) -> None:
    """A second lifespan (a test client per test, an embedding app) opens the same sink again. Before,
    the sink stayed closed: every response of the second lifetime was a 500 from ``Guard()`` ("is
    closed") and nothing was recorded, while the response store served both lifetimes."""
    import httpx

    server = build(database=f"sqlite:///{tmp_path / 'twice.db'}", migrate=True)
    storage = server.eventguard_storage
    assert storage is not None and storage.sink is not None
    answered: list[tuple[int, str]] = []
    async with asyncio.timeout(60):
        for turn in ("one", "two"):
            async with (
                server.router.lifespan_context(server),
                httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=server), base_url="http://host"
                ) as client,
            ):
                reply = await client.post("/responses", json={"model": "m", "input": turn})
                answered.append((reply.status_code, reply.json().get("status", "")))
            assert storage.sink.closed and not storage.sink.writing()
        async with SqlSink(storage.sink.url) as reader, reader.engine.connect() as conn:
            from sqlalchemy import text

            rows = (await conn.execute(text("SELECT status FROM eventguard_responses"))).scalars().all()
    assert answered == [(200, "completed"), (200, "completed")]
    assert sorted(rows) == ["completed", "completed"]


def test_the_agent_sessions_live_in_the_same_database(tmp_path: Path) -> None:
    server = build(database=f"sqlite:///{tmp_path / 'sessions.db'}")
    storage = server.eventguard_storage
    assert storage is not None
    sessions = server._session_storage_provider
    assert isinstance(sessions, SqlAgentSessionStoreProvider)
    assert sessions is storage.session_store and sessions.provider is storage.provider


def test_the_agent_sessions_use_the_database_beside_a_store_of_your_own(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'own.db'}"
    server = build(database=url, **{KEYWORD: InMemoryResponseProvider()})
    sessions = server._session_storage_provider
    assert isinstance(sessions, SqlAgentSessionStoreProvider)
    assert sessions.provider.url == SqlResponseProvider(url).url


def test_a_session_store_of_your_own_is_kept(tmp_path: Path) -> None:
    mine = AgentSessionStoreProvider()
    server = build(database=f"sqlite:///{tmp_path / 'mine.db'}", agent_session_store_provider=mine)
    assert server._session_storage_provider is mine
    assert server.eventguard_storage is not None and server.eventguard_storage.session_store is None


async def test_the_sessions_own_store_is_closed_with_the_app(tmp_path: Path) -> None:
    server = build(
        database=f"sqlite:///{tmp_path / 'close.db'}", migrate=True, **{KEYWORD: InMemoryResponseProvider()}
    )
    storage = server.eventguard_storage
    assert storage is not None and storage.session_store is not None
    own = storage.session_store.provider
    async with asyncio.timeout(30):
        async with server.router.lifespan_context(server):
            store = storage.session_store.get_store(config=None, platform_context=None)
            assert await store.get("conv_1") is None
            assert own._engine is not None
        assert own._engine is None  # its pool disposed with the app
