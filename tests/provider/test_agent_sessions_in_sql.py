"""The host's agent sessions in SQL (eventguard.agent_sessions), on SQLite and PostgreSQL: a real
``AgentSession`` reads back equal, an absent one is ``None``, two stores racing on one session give
exactly one the host's conflict ``RuntimeError``, delete deletes, and hostile session ids and contents
are stored exactly or refused with a typed error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agent_framework import AgentSession, Message
from azure.ai.agentserver.core import FoundryAgentRequestContext

from eventguard.agent_sessions import CONFLICT, SqlAgentSessionStore, SqlAgentSessionStoreProvider
from eventguard.errors import UnstorableError
from tests._hostile import STRINGS
from tests.provider.conftest import Database

TIMEOUT = 30


def _ctx(user: str | None = "u1") -> FoundryAgentRequestContext:
    return FoundryAgentRequestContext(user_id=user)


@pytest.fixture
async def sessions(sql_database: Database) -> AsyncIterator[SqlAgentSessionStoreProvider]:
    provider = SqlAgentSessionStoreProvider(sql_database.url, schema=sql_database.schema)
    try:
        yield provider
    finally:
        await provider.provider.aclose()


def _store(provider: SqlAgentSessionStoreProvider, user: str | None = "u1") -> SqlAgentSessionStore:
    return provider.get_store(config=None, platform_context=_ctx(user))


def _session(text: str = "hello") -> AgentSession:
    session = AgentSession(session_id="s-1", service_session_id="svc-1")
    session.state["memory"] = {"messages": [Message("user", [text]).to_dict()], "n": 3}
    return session


async def test_a_session_reads_back_equal_and_an_absent_one_is_none(
    sessions: SqlAgentSessionStoreProvider,
) -> None:
    async with asyncio.timeout(TIMEOUT):
        store = _store(sessions)
        assert await store.get("conv_1") is None
        await store.set("conv_1", _session())
        again = await _store(sessions).get("conv_1")
        assert again is not None and again.to_dict() == _session().to_dict()
        # Another user's partition does not see it.
        assert await _store(sessions, "u2").get("conv_1") is None
        assert await _store(sessions, None).get("conv_1") is None


async def test_two_stores_racing_on_one_session_give_one_conflict(
    sessions: SqlAgentSessionStoreProvider,
) -> None:
    async with asyncio.timeout(TIMEOUT):
        await _store(sessions).set("conv_1", _session("first"))
        a, b = _store(sessions), _store(sessions)
        assert await a.get("conv_1") is not None and await b.get("conv_1") is not None
        results = await asyncio.gather(
            a.set("conv_1", _session("from a")), b.set("conv_1", _session("from b")), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        assert len(errors) == 1 and isinstance(errors[0], RuntimeError) and str(errors[0]) == CONFLICT
        # The winner may write again over its own version.
        winner = a if results[0] is None else b
        await winner.set("conv_1", _session("again"))
        stored = await _store(sessions).get("conv_1")
        assert stored is not None and stored.to_dict() == _session("again").to_dict()


async def test_two_stores_creating_one_session_give_one_conflict(
    sessions: SqlAgentSessionStoreProvider,
) -> None:
    async with asyncio.timeout(TIMEOUT):
        a, b = _store(sessions), _store(sessions)
        assert await a.get("conv_new") is None and await b.get("conv_new") is None
        await a.set("conv_new", _session("a"))
        with pytest.raises(RuntimeError, match="Another request advanced this agent session"):
            await b.set("conv_new", _session("b"))
        stored = await _store(sessions).get("conv_new")
        assert stored is not None and stored.to_dict() == _session("a").to_dict()


async def test_delete_deletes(sessions: SqlAgentSessionStoreProvider) -> None:
    async with asyncio.timeout(TIMEOUT):
        store = _store(sessions)
        await store.set("conv_1", _session())
        await store.delete("conv_1")
        assert await _store(sessions).get("conv_1") is None
        await store.delete("conv_1")  # deleting nothing is fine
        await store.set("conv_1", _session("after"))  # and the id can be used again
        stored = await _store(sessions).get("conv_1")
        assert stored is not None and stored.to_dict() == _session("after").to_dict()


@pytest.mark.parametrize("case", ["nul", "lone_surrogate", "ansi_escape", "one_megabyte"])
async def test_hostile_session_ids_and_contents_are_stored_exactly(
    sessions: SqlAgentSessionStoreProvider, case: str
) -> None:
    hostile = STRINGS[case]
    async with asyncio.timeout(TIMEOUT):
        session = AgentSession(session_id=hostile, service_session_id=hostile)
        session.state[hostile] = {"text": hostile, "messages": [Message("user", [hostile]).to_dict()]}
        try:
            await _store(sessions, hostile).set(hostile, session)
        except UnstorableError:  # a typed refusal is allowed; nothing half-stored
            assert await _store(sessions, hostile).get(hostile) is None
            return
        stored = await _store(sessions, hostile).get(hostile)
        assert stored is not None and stored.to_dict() == session.to_dict()
        assert await _store(sessions, hostile + "x").get(hostile) is None


async def test_an_empty_session_id_is_refused(sessions: SqlAgentSessionStoreProvider) -> None:
    async with asyncio.timeout(TIMEOUT):
        with pytest.raises(ValueError, match="non-empty"):
            await _store(sessions).get("")


@pytest.mark.parametrize("session", [{"session_id": "conv_1"}, None, "conv_1"], ids=["dict", "none", "str"])
async def test_something_that_is_not_a_session_is_refused_and_nothing_stored(
    sessions: SqlAgentSessionStoreProvider, session: Any
) -> None:
    """Before, an AttributeError from inside (``'dict' object has no attribute 'to_dict'``)."""
    async with asyncio.timeout(TIMEOUT):
        store = _store(sessions)
        with pytest.raises(UnstorableError, match=r"^session must be an AgentSession, not "):
            await store.set("conv_1", session)
        assert await store.get("conv_1") is None
