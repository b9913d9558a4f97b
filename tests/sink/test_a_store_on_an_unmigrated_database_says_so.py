"""A ResponseStore on a database eventguard never migrated (or migrated to an older revision) says
so with :class:`SchemaMismatchError` naming the command to run, from every query method, as the
CLI and the response store's provider do: not the driver's "no such table" / "relation does not
exist". The revision is read only when a query fails, so a healthy database's queries cost what
they did.

Real SQLite files and real PostgreSQL schemas, each fresh per test.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event, text

from eventguard.errors import SchemaMismatchError
from eventguard.sql import migrate
from eventguard.sql.tables import VERSION_TABLE
from eventguard.store import ResponseStore

from .conftest import Target

T = 30
UPGRADE = "eventguard db upgrade"


async def _collect(items: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in items]


#: Every method of the store that queries the database, as (name, call).
QUERIES: list[tuple[str, Callable[[ResponseStore], Awaitable[Any]]]] = [
    ("get", lambda s: s.get("resp_1")),
    ("recent", lambda s: s.recent()),
    ("terminal_states", lambda s: s.terminal_states()),
    ("anomalies", lambda s: s.anomalies()),
    ("history", lambda s: s.history("resp_1")),
    ("stats", lambda s: s.stats()),
    ("count", lambda s: s.count()),
    ("histories", lambda s: _collect(s.histories())),
    ("history_rows", lambda s: _collect(s.history_rows(10))),
    ("envelopes", lambda s: s.envelopes("resp_1")),
    ("agent_sessions", lambda s: s.agent_sessions()),
    ("iter_agent_sessions", lambda s: _collect(s.iter_agent_sessions())),
    ("prune", lambda s: s.prune(older_than=timedelta(days=1))),
    ("prune_envelopes", lambda s: s.prune_envelopes(older_than=timedelta(days=1))),
    ("prune_agent_sessions", lambda s: s.prune_agent_sessions(older_than=timedelta(days=1))),
    ("recover", lambda s: s.recover(older_than=timedelta(days=1))),
]


@pytest.fixture
async def store(target: Target) -> AsyncIterator[ResponseStore]:
    """A store on someone's database: one table of theirs, nothing of eventguard's."""
    store = ResponseStore(target.url, schema=target.schema)
    async with asyncio.timeout(T):
        async with store.engine.begin() as conn:
            await conn.execute(text("CREATE TABLE app_things (x INTEGER)"))
    try:
        yield store
    finally:
        async with asyncio.timeout(T):
            await store.aclose()


@pytest.mark.parametrize(("name", "query"), QUERIES, ids=[name for name, _ in QUERIES])
async def test_every_query_on_a_database_without_eventguards_schema_names_the_command_to_run(
    store: ResponseStore, name: str, query: Callable[[ResponseStore], Awaitable[Any]]
) -> None:
    async with asyncio.timeout(T):
        with pytest.raises(SchemaMismatchError, match="no eventguard schema") as caught:
            await query(store)
    assert caught.value.command == UPGRADE, name
    assert UPGRADE in str(caught.value)
    assert caught.value.current == ()
    assert caught.value.expected == migrate.expected_heads()


async def test_a_query_of_a_table_an_older_revision_lacks_says_the_schema_is_behind(
    store: ResponseStore,
) -> None:
    """Agent sessions came in 0007: a database at 0006 has everything else."""
    async with asyncio.timeout(T):
        await migrate.upgrade(store.engine, "0006")
        assert await store.count() == 0  # what the older schema has still answers
        with pytest.raises(SchemaMismatchError, match="behind") as caught:
            await store.agent_sessions()
    assert caught.value.command == UPGRADE
    assert caught.value.current == ("0006",)


async def test_once_migrated_the_same_store_answers_and_reads_no_revision_per_query(
    store: ResponseStore,
) -> None:
    async with asyncio.timeout(T):
        with pytest.raises(SchemaMismatchError):
            await store.recent()
        await migrate.upgrade(store.engine)
        statements: list[str] = []

        def seen(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
            statements.append(statement)

        event.listen(store.engine.sync_engine, "before_cursor_execute", seen)
        try:
            assert await store.recent() == []
            assert await store.get("resp_1") is None
        finally:
            event.remove(store.engine.sync_engine, "before_cursor_execute", seen)
    assert len(statements) == 2, statements  # the two queries, and no look at the revision
    assert not [s for s in statements if VERSION_TABLE in s], statements
