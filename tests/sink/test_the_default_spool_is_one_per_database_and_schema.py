"""Without ``spool_path=`` (and without an SQLite file to put it beside) the spool is one file per
database and schema in the working directory. It was one ``./eventguard-spool.jsonl`` for all: a
spool entry does not say where it was going, so a sink on schema ``b`` replayed into ``b`` the
batches a sink on schema ``a`` had spooled (the review probe saw "replayed 1 batches" there)."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from eventguard.sink import SqlSink
from tests._postgres import PG_URL, fresh_schema

from .helpers import run_guarded, script, stored_events


def test_each_database_and_schema_has_its_own_default_spool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    a, again, b = SqlSink(PG_URL, schema="a"), SqlSink(PG_URL, schema="a"), SqlSink(PG_URL, schema="b")
    other_db = SqlSink(PG_URL.rsplit("/", 1)[0] + "/other", schema="a")
    with_password = SqlSink(PG_URL.replace("postgres@", "postgres:secret@") + "?sslmode=disable", schema="a")
    # Another role (an admin running the replay), the default port spelt out, another driver name:
    as_admin = SqlSink(PG_URL.replace("postgres@", "admin@"), schema="a")
    port_spelt = SqlSink(PG_URL.replace(":5432", ""), schema="a")
    psycopg = SqlSink(PG_URL.replace("+asyncpg", ""), schema="a")
    assert a.spool.path == again.spool.path == with_password.spool.path == as_admin.spool.path
    assert a.spool.path == port_spelt.spool.path == psycopg.spool.path
    assert len({a.spool.path, b.spool.path, other_db.spool.path}) == 3
    assert a.spool.path.parent == tmp_path and a.spool.path.name.startswith("eventguard-spool-")
    assert "secret" not in str(with_password.spool.path)


@pytest.mark.postgres
async def test_a_sink_replays_only_what_was_spooled_for_its_own_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    async with asyncio.timeout(60), fresh_schema("eg_spool_a") as sa, fresh_schema("eg_spool_b") as sb:
        first = SqlSink(PG_URL, schema=sa)
        await first.start()

        async def spool_all(batches: list[object]) -> None:
            first.writer.to_spool(batches, None)  # type: ignore[arg-type]  # as an outage would

        persist = first.writer.persist
        first.writer.persist = spool_all  # type: ignore[method-assign, assignment]
        await run_guarded(first, script("resp_for_a", n_deltas=2))
        first.writer.persist = persist  # type: ignore[method-assign]
        first.writer.outage.retry_at = time.monotonic() + 3600  # backing off: the close keeps the spool
        await first.aclose()
        assert first.spool.pending()
        async with SqlSink(PG_URL, schema=sb) as other:
            result = await other.replay_spool()
            assert result.batches == 0
            assert await stored_events(other, "resp_for_a") == 0
        async with SqlSink(PG_URL, schema=sa) as own:
            await own.replay_spool()
            assert await stored_events(own, "resp_for_a") == 6


def test_a_spool_left_at_the_old_shared_default_is_named_in_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "eventguard-spool.jsonl").write_bytes(b"EG1 2 00000000 {}\n")
    with caplog.at_level(logging.WARNING, logger="eventguard.sink"):
        SqlSink(PG_URL, schema="a")
    assert "eventguard spool replay --spool" in caplog.text


def test_an_engine_whose_url_names_no_database_needs_a_spool_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine with an ``async_creator`` (a token-authenticated application) may have the URL
    ``postgresql+asyncpg://``: the default spool, named after the URL's host and database, was then
    one file for every such application in the directory, and one replayed the other's batches into
    its own database. Such an engine now needs ``spool_path=``, said where the sink is built."""
    from sqlalchemy.ext.asyncio import create_async_engine

    from eventguard.foundry import Storage

    monkeypatch.chdir(tmp_path)

    async def connect() -> None:  # never called: nothing connects here
        raise AssertionError

    blind = create_async_engine("postgresql+asyncpg://", async_creator=connect)
    with pytest.raises(ValueError, match="spool_path="):
        SqlSink(engine=blind)
    with pytest.raises(ValueError, match="spool_path="):
        Storage.build(blind, schema=None, migrate=None, sink=True, provider=False)
    given = SqlSink(engine=blind, spool_path=tmp_path / "mine.jsonl")
    assert given.spool.path == tmp_path / "mine.jsonl"
    built = Storage.build(
        blind, schema=None, migrate=None, sink=True, provider=False, spool_path=tmp_path / "s.jsonl"
    )
    assert built.sink is not None and built.sink.spool.path == tmp_path / "s.jsonl"
    # A URL that names its database keeps the default, engine or not, in its body or its query;
    # so does a URL given as one (its database from PGHOST and PGDATABASE, as before).
    named = create_async_engine("postgresql+asyncpg://app@/prod", async_creator=connect)
    by_query = create_async_engine("postgresql+asyncpg:///?host=/run/postgresql", async_creator=connect)
    for kept in (SqlSink(engine=named), SqlSink(engine=by_query), SqlSink("postgresql+asyncpg://")):
        assert kept.spool.path.name.startswith("eventguard-spool-")
