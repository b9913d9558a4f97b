"""The application's own engine: the sink and the store use it and never close what they did not make.

Issue 14 part 2 ("``SqlSink(engine)`` fails: 'AsyncEngine' object has no attribute
'get_backend_name'"). Real SQLite files and a real PostgreSQL schema per test.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine as create_sync_engine
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from eventguard import ResponseStore, SqlSink
from tests._postgres import PG_URL

from .conftest import Target
from .helpers import run_guarded, script


def _app_engine(target: Target, **kw: Any) -> AsyncEngine:
    if target.kind == "sqlite":
        return create_async_engine(target.url, **kw)
    return create_async_engine(PG_URL, pool_size=2, max_overflow=0, **kw)


async def _one(engine: AsyncEngine, sql: str) -> Any:
    async with engine.connect() as conn:
        return (await conn.execute(text(sql))).scalar_one()


async def test_the_sink_and_the_store_record_and_read_through_the_applications_engine(target: Target) -> None:
    app = _app_engine(target)
    try:
        async with asyncio.timeout(60):
            sink = SqlSink(engine=app, schema=target.schema, spool_path=target.spool, auto_migrate=True)
            await sink.start()
            await run_guarded(sink, script("r_app", n_deltas=5))
            await sink.aclose()
            store = ResponseStore(engine=app, schema=target.schema)
            try:
                record = await store.get("r_app")
                history = await store.history("r_app")
            finally:
                await store.aclose()
            # The application's engine is still open and usable: nothing of it was disposed.
            assert await _one(app, "SELECT 1") == 1
    finally:
        await app.dispose()
    assert record is not None and record.status == "completed"
    assert history is not None
    assert len(history.attempts[0].events) == 9  # created, in_progress, 5 deltas, item done, completed
    assert sink.stats.batches_spooled == 0


@pytest.mark.postgres
async def test_on_postgresql_the_sink_takes_its_connections_from_the_applications_pool(
    pg_target: Target,
) -> None:
    app = _app_engine(pg_target)
    pool = app.sync_engine.pool
    try:
        async with asyncio.timeout(60):
            sink = SqlSink(engine=app, schema=pg_target.schema, spool_path=pg_target.spool, auto_migrate=True)
            await sink.start()
            await run_guarded(sink, script("r_pool", n_deltas=3))
            await sink.aclose()
            # The sink's connections went back to the application's pool, and stayed open there.
            assert pool.checkedin() >= 1  # type: ignore[attr-defined]
            assert pool.checkedout() == 0  # type: ignore[attr-defined]
            # The tables are in the schema the sink was given, though the connections were opened
            # by the application without a search_path.
            n = await _one(
                app,
                f"SELECT count(*) FROM \"{pg_target.schema}\".eventguard_events WHERE response_id = 'r_pool'",
            )
            assert n == 7
            assert await _one(app, "SHOW search_path") == '"$user", public'
    finally:
        await app.dispose()


@pytest.mark.postgres
async def test_the_applications_json_decoder_is_kept_on_its_connections(pg_target: Target) -> None:
    app = _app_engine(pg_target, json_deserializer=lambda s: {"decoded_by": "app", "value": json.loads(s)})
    try:
        async with asyncio.timeout(60):
            sink = SqlSink(engine=app, schema=pg_target.schema, spool_path=pg_target.spool, auto_migrate=True)
            await sink.start()
            await run_guarded(sink, script("r_json", n_deltas=1))
            await sink.aclose()
            async with app.connect() as conn:
                value = (await conn.execute(text("SELECT CAST('{\"a\": 1}' AS jsonb)"))).scalar_one()
    finally:
        await app.dispose()
    assert value == {"decoded_by": "app", "value": {"a": 1}}


async def test_an_engine_and_a_url_together_are_refused(tmp_path: Path) -> None:
    app = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}")
    try:
        with pytest.raises(ValueError, match="not both"):
            SqlSink(f"sqlite:///{tmp_path / 'b.db'}", engine=app)
        with pytest.raises(ValueError, match="not both"):
            ResponseStore(f"sqlite:///{tmp_path / 'b.db'}", engine=app)
    finally:
        await app.dispose()


async def test_an_in_memory_sqlite_engine_is_refused_with_what_to_do_instead() -> None:
    app = create_async_engine("sqlite+aiosqlite://")
    try:
        with pytest.raises(ValueError, match="file URL"):
            ResponseStore(engine=app)
        with pytest.raises(ValueError, match="file URL"):  # when built: at a write it spooled for ever
            SqlSink(engine=app)
    finally:
        await app.dispose()


@pytest.mark.postgres
@pytest.mark.parametrize("how", ["create_async_engine", "execution_options"])
async def test_an_autocommit_postgresql_engine_is_refused_saying_why(how: str) -> None:
    """Its connections run each statement alone: the schema and statement_timeout eventguard sets per
    transaction did nothing, and the tables and rows went to the connections' own search_path."""
    from eventguard import SqlResponseProvider

    if how == "create_async_engine":
        app = create_async_engine(PG_URL, isolation_level="AUTOCOMMIT")
    else:
        app = create_async_engine(PG_URL).execution_options(isolation_level="AUTOCOMMIT")
    try:
        for build in (
            lambda: SqlSink(engine=app, schema="eg_anywhere"),
            lambda: ResponseStore(engine=app, schema="eg_anywhere"),
            lambda: SqlResponseProvider(app, schema="eg_anywhere"),
            lambda: SqlResponseProvider(app),
        ):
            with pytest.raises(ValueError, match="AUTOCOMMIT engine cannot hold eventguard's transactions"):
                build()
    finally:
        await app.dispose()


@pytest.mark.parametrize("wrong", ["sync engine", "a string", None.__class__])
def test_something_that_is_not_an_async_engine_is_a_type_error(tmp_path: Path, wrong: Any) -> None:
    value: Any = {
        "sync engine": create_sync_engine(f"sqlite:///{tmp_path / 's.db'}"),
        "a string": "sqlite:///x.db",
    }.get(wrong, object())
    with pytest.raises(TypeError, match="AsyncEngine"):
        SqlSink(engine=value)
    with pytest.raises(TypeError, match="AsyncEngine"):
        ResponseStore(engine=value)


@pytest.mark.postgres
@pytest.mark.parametrize("schema", ["", "bad\x00schema", "s" * 64])
def test_a_schema_postgresql_cannot_name_is_a_value_error(schema: str) -> None:
    app = create_async_engine(PG_URL)
    with pytest.raises(ValueError, match=r"^schema must be a PostgreSQL name"):
        ResponseStore(engine=app, schema=schema)


async def test_an_autocommit_sqlite_engine_still_serves_the_provider(tmp_path: Path) -> None:
    """On SQLite the provider writes through a connection of its own to the file: the engine's
    isolation level is not refused there, as it is on PostgreSQL."""
    from eventguard import SqlResponseProvider

    app = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'app.db'}", isolation_level="AUTOCOMMIT")
    provider = SqlResponseProvider(app)
    try:
        async with asyncio.timeout(30):
            await provider.start()
            envelope = {"id": "resp_ac", "object": "response", "status": "completed", "output": []}
            await provider.create_response(envelope, None, None)
            assert (await provider.get_response("resp_ac"))["id"] == "resp_ac"
            await provider.aclose()
    finally:
        await app.dispose()


@pytest.mark.postgres
async def test_after_the_application_disposes_of_its_engine_the_sink_uses_its_new_pool(
    pg_target: Target,
) -> None:
    """``engine.dispose()`` gives the application's engine a new pool (a reconnect, a fork, a test's
    reset). The sink kept the old one: its connections were then outside the application's pool,
    past its size, and nothing closed them, not the sink's ``aclose()`` nor the application's last
    ``dispose()``."""
    import uuid

    name = f"app_{uuid.uuid4().hex[:12]}"
    app = create_async_engine(
        PG_URL, pool_size=2, max_overflow=0, connect_args={"server_settings": {"application_name": name}}
    )
    try:
        async with asyncio.timeout(60):
            sink = SqlSink(engine=app, schema=pg_target.schema, spool_path=pg_target.spool, auto_migrate=True)
            await sink.start()
            await run_guarded(sink, script("r_before", n_deltas=2))
            await app.dispose()  # the application lets go of its pool, mid-life
            await run_guarded(sink, script("r_after", n_deltas=2))
            assert app.sync_engine.pool.checkedin() >= 1  # type: ignore[attr-defined]
            await sink.aclose()
            assert sink.stats.batches_spooled == 0
    finally:
        await app.dispose()
    async with asyncio.timeout(30):
        while await _backends_named(name):  # noqa: ASYNC110 - the server's, seen a moment after the close
            await asyncio.sleep(0.05)


async def _backends_named(name: str) -> int:
    from tests._postgres import execute

    rows = await execute("SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = $1", name)
    return int(rows[0]["n"])


async def test_an_engine_lent_many_times_is_borrowed_once_per_setting() -> None:
    """Every engine made over a pool adds its dialect's listeners to that pool for good: one per
    borrow (a provider or a sink per test, per request) made every later connection of the
    application's slower (300 providers: 602 listeners, a new connection 2.6 -> 6.2 ms)."""
    from eventguard.provider import SqlResponseProvider
    from eventguard.sql.engine import borrow_engine

    app = create_async_engine(PG_URL)
    try:
        pool = app.sync_engine.pool
        before = len(pool.dispatch.connect)
        for _ in range(50):
            SqlResponseProvider(app)
            SqlResponseProvider(app, schema="eg_other")
            SqlSink(engine=app, spool_path=Path("unused.jsonl"))
        assert borrow_engine(app) is borrow_engine(app)
        assert borrow_engine(app, schema="a") is not borrow_engine(app, schema="b")
        # four settings (the provider's two, the sink's being the first of them, and a, b): four
        # engines, where each borrow made one (a hundred and four here)
        assert len(pool.dispatch.connect) - before <= 2 * 4
        assert len(app.sync_engine.dispatch.engine_disposed) <= 4
    finally:
        await app.dispose()


async def test_a_borrowed_engine_follows_the_applications_pool_however_it_was_lent() -> None:
    """Lent through an ``execution_options()`` copy (whose ``dispose()`` happens on the engine it
    copies), or as another borrower's engine (``SqlResponseProvider(sink.engine)``): after the
    application's ``dispose()`` the borrowed engine is on the application's new pool, never on a
    pool of its own that nothing closes."""
    from eventguard.sql.engine import borrow_engine

    app = create_async_engine(PG_URL)
    try:
        through_options = borrow_engine(app.execution_options(logging_token="app"), schema="x")
        through_a_borrower = borrow_engine(borrow_engine(app, schema="y"), schema="z")
        await through_a_borrower.dispose()  # a borrower's close: the pool is the application's
        await app.dispose()
        for borrowed in (through_options, through_a_borrower):
            assert borrowed.sync_engine.pool is app.sync_engine.pool
    finally:
        await app.dispose()


async def test_a_copy_of_a_borrowed_engine_lent_again_follows_the_applications_pool() -> None:
    """``store.reader`` is an ``execution_options()`` copy of the store's borrowed engine: lent to a
    provider, its engine stayed on the application's old pool after ``app.dispose()``, outside the
    pool's size, closed by nothing."""
    from eventguard.provider import SqlResponseProvider
    from eventguard.sql.engine import borrow_engine

    app = create_async_engine(PG_URL)
    store = ResponseStore(engine=app)
    try:
        provider = SqlResponseProvider(store.reader)
        copied = borrow_engine(store.engine.execution_options(logging_token="copy"), schema="x")
        await app.dispose()
        for engine in (store.engine, provider.engine, copied):
            assert engine.sync_engine.pool is app.sync_engine.pool
    finally:
        await store.aclose()
        await app.dispose()


@pytest.mark.postgres
def test_a_sink_that_changes_event_loops_leaves_the_shared_borrowed_engine_on_the_applications_pool(
    tmp_path: Path,
) -> None:
    """A sink used in one ``asyncio.run()`` (a spool replay) and started in the next lets go of the
    first loop's engine: a borrowed engine, shared with every borrower of its settings, was given a
    pool of its own there, and a provider on the same engine then took connections past the
    application's pool size, left open after everything closed."""
    from eventguard.provider import SqlResponseProvider
    from tests._postgres import fresh_schema_sync

    with fresh_schema_sync("eg_loops_lent") as schema:
        app = create_async_engine(PG_URL, pool_size=2, max_overflow=0)
        sink = SqlSink(engine=app, schema=schema, spool_path=tmp_path / "spool.jsonl", auto_migrate=True)

        async def first() -> None:
            async with asyncio.timeout(60):
                await sink.replay_spool()  # this loop's engine, and no writer task
                await app.dispose()  # the application's connections go with their loop

        async def second() -> None:
            async with asyncio.timeout(60):
                provider = SqlResponseProvider(app, schema=schema)
                await sink.start()  # lets go of the first loop's state
                try:
                    assert provider.engine.sync_engine.pool is app.sync_engine.pool
                    assert sink.engine.sync_engine.pool is app.sync_engine.pool
                finally:
                    await sink.aclose()
                    await provider.aclose()
                    await app.dispose()

        asyncio.run(first())
        asyncio.run(second())
