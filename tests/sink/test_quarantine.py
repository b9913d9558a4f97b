"""Content the database refuses is never an outage: the refused batch (or the refused events
within it) goes to the quarantine with the reason, everything else is written at once, nothing is
spooled, delayed or lost. On real SQLite and PostgreSQL; the refused content is injected into the
batches the writer gets (the recorder upstream makes ordinary strings storable)."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
from sqlalchemy import func, select, text

from eventguard.sink import SqlSink, quarantine
from eventguard.sink.batch import Batch
from eventguard.sink.recorder import SqlRecorder
from eventguard.sql.classify import ErrorKind, classify
from eventguard.sql.tables import anomalies, events, responses
from eventguard.sql.tables import quarantine as quarantine_table
from tests._postgres import PG_DSN

from .conftest import Target
from .helpers import delta, run_guarded, script


def make_sink(target: Target, **kw: Any) -> SqlSink:
    return SqlSink(target.url, schema=target.schema, spool_path=target.spool, **kw)


def poison_rows(monkeypatch: pytest.MonkeyPatch, rid: str, mutate: Callable[[Batch], None]) -> None:
    """Every batch of ``rid`` whose row is terminal gets ``mutate`` applied as it is collected."""
    collect = SqlRecorder.collect

    def poisoned(self: SqlRecorder) -> Batch | None:
        batch = collect(self)
        if batch is not None and batch.response_id == rid and batch.terminal:
            mutate(batch)
        return batch

    monkeypatch.setattr(SqlRecorder, "collect", poisoned)


def poison_events(monkeypatch: pytest.MonkeyPatch, rid: str, seqs: set[int], bad_type: str) -> None:
    """The events ``seqs`` of ``rid`` get the event type ``bad_type`` once serialised."""
    encode_some = SqlRecorder.encode_some

    def poisoned(self: SqlRecorder, batch: Batch, limit: int | None = None) -> int:
        n = encode_some(self, batch, limit)
        if batch.response_id == rid:
            batch.events = [(a, s, bad_type if s in seqs else t, p) for a, s, t, p in batch.events]
        return n

    monkeypatch.setattr(SqlRecorder, "encode_some", poisoned)


async def stored_seqs(sink: SqlSink, rid: str) -> list[int]:
    async with sink.engine.connect() as conn:
        e = events.c
        rows = await conn.execute(select(e.seq).where(e.response_id == rid).order_by(e.seq))
        return [r.seq for r in rows]


async def quarantined_seqs(sink: SqlSink, rid: str, origin: str | None = None) -> list[int]:
    seqs: list[int] = []
    for record in await quarantine.read(sink.engine, response_id=rid, origin=origin):
        seqs.extend(e["seq"] for e in record.content()["events"])
    return sorted(seqs)


async def kinds(sink: SqlSink, rid: str) -> list[str]:
    async with sink.engine.connect() as conn:
        rows = await conn.execute(select(anomalies.c.kind).where(anomalies.c.response_id == rid))
        return [r.kind for r in rows]


def _row_poison(kind: str, variant: int) -> tuple[str, Any]:
    """A column value the database (or the driver, binding it) refuses."""
    return [
        ("status", "bogus"),  # a CHECK constraint: IntegrityError / 23514
        ("error_message", "bad \udcff byte"),  # a lone surrogate: no encoder takes it
        ("attempt", 2**70),  # out of range for the column (and for orjson on SQLite)
        # PostgreSQL's TEXT refuses a NUL (22021); SQLite takes one, but not a string for a time
        # (a TypeError of the bind processor: an unknown error, judged by probing the database).
        ("error_message", "nul \x00 here") if kind == "postgres" else ("started_at", "not a time"),
    ][variant]


@pytest.mark.parametrize("variant", range(4), ids=["check", "surrogate", "out-of-range", "nul-or-type"])
async def test_a_refused_row_is_quarantined_and_healthy_responses_are_written_at_once(
    target: Target, monkeypatch: pytest.MonkeyPatch, variant: int
) -> None:
    column, value = _row_poison(target.kind, variant)
    poison_rows(monkeypatch, "resp_bad", lambda b: b.row.__setitem__(column, value))
    healthy = [f"resp_ok_{i}" for i in range(6)]
    async with asyncio.timeout(60):
        # flush_interval=0: the in_progress change is written on the next turn, in a batch of its
        # own (the row the sink_refused anomaly needs), not with the end of this short response.
        sink = make_sink(target, flush_interval=0)
        await sink.start()
        await asyncio.gather(*(run_guarded(sink, script(rid, n_deltas=20)) for rid in [*healthy, "resp_bad"]))
        # Straight after the refusal: the next response is written directly, not delayed.
        await run_guarded(sink, script("resp_after", n_deltas=3))
        async with sink.engine.connect() as conn:
            after = (
                await conn.execute(select(responses.c.status).where(responses.c.response_id == "resp_after"))
            ).scalar()
        stored = {rid: await stored_seqs(sink, rid) for rid in [*healthy, "resp_bad"]}
        kept = await quarantined_seqs(sink, "resp_bad", "write")
        found = await kinds(sink, "resp_bad")
        await sink.aclose()
    assert after == "completed"
    assert sink.stats.batches_spooled == 0
    assert not target.spool.exists()
    n = len(script("x", n_deltas=20))
    assert all(stored[rid] == list(range(n)) for rid in healthy)
    # Count in == out: each of the refused response's events is stored or quarantined, once.
    assert sorted(stored["resp_bad"] + kept) == list(range(n))
    assert kept, "the refused batch is in the quarantine"
    assert "sink_refused" in found  # its row was there (an earlier batch wrote it)
    assert sink.stats.quarantined >= 1


async def test_refused_events_are_quarantined_alone_and_the_rest_of_their_batch_is_written(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    poison_events(monkeypatch, "resp_mixed", {5, 11}, "bad type \udcff")
    evs = script("resp_mixed", n_deltas=30)
    async with asyncio.timeout(60):
        sink = make_sink(target, flush_every=10_000, flush_interval=3600)  # one batch
        await sink.start()
        await run_guarded(sink, evs)
        stored = await stored_seqs(sink, "resp_mixed")
        kept = await quarantined_seqs(sink, "resp_mixed")
        (record,) = await quarantine.read(sink.engine, response_id="resp_mixed")
        async with sink.engine.connect() as conn:
            status = (
                await conn.execute(select(responses.c.status).where(responses.c.response_id == "resp_mixed"))
            ).scalar()
        found = await kinds(sink, "resp_mixed")
        await sink.aclose()
    assert status == "completed"
    assert kept == [5, 11]
    assert stored == [s for s in range(len(evs)) if s not in (5, 11)]
    assert record.origin == "write"
    assert "refused 2 event(s)" in record.reason
    assert [e["type"] for e in record.content()["events"]] == ["bad type \udcff"] * 2  # exactly as given
    assert found.count("sink_refused") == 1
    assert sink.stats.batches_spooled == 0


async def test_quarantine_records_hold_any_string_exactly(target: Target) -> None:
    hostile = "nul \x00 surrogate \udcff emoji \U0001f600 ansi \x1b[31m quote ' \\ " + "x" * (1 << 20)
    async with asyncio.timeout(60):
        sink = make_sink(target)
        await sink.migrate()
        record = quarantine.entry(
            "write",
            f"reason {hostile[:40]}",
            {"value": hostile, hostile[:20]: [1, 2.5, None]},
            response_id=f"id {hostile[:30]}",
            attempt=1,
            stream_id="s" * 100,
        )
        async with sink.engine.begin() as conn:
            await quarantine.insert(conn, [record])
        (back,) = await quarantine.read(sink.engine)
        await sink.aclose()
    assert back.record.isascii()
    assert back.content() == {"value": hostile, hostile[:20]: [1, 2.5, None]}
    assert back.reason == quarantine.text(f"reason {hostile[:40]}")
    assert back.reason.startswith("reason nul \\x00 surrogate \\udcff emoji \U0001f600 ansi \x1b[31m")
    assert back.response_id is not None and "\\udcff" in back.response_id
    assert back.stream_id == "s" * 64


async def test_the_quarantine_falls_back_to_a_file_beside_the_spool(
    target: Target, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="eventguard.sink")
    poison_rows(monkeypatch, "resp_bad", lambda b: b.row.__setitem__("status", "bogus"))
    async with asyncio.timeout(60):
        sink = make_sink(target)
        await sink.start()
        async with sink.engine.begin() as conn:  # the quarantine table is gone
            await conn.execute(text("DROP TABLE eventguard_quarantine"))
        await run_guarded(sink, script("resp_bad", n_deltas=4))
        await run_guarded(sink, script("resp_ok", n_deltas=4))
        ok = await stored_seqs(sink, "resp_ok")
        await sink.aclose()
    path = Path(f"{target.spool}.quarantine.jsonl")
    assert sink.quarantine_path == path
    records = quarantine.read_file(path)
    assert [r.origin for r in records] == ["write"]
    assert records[0].response_id == "resp_bad"
    assert records[0].event_count() >= 1
    assert sink.stats.quarantine_file == 1
    assert ok == list(range(8))
    assert str(path) in caplog.text


def test_reading_the_quarantine_file_skips_a_damaged_line_and_keeps_the_rest(tmp_path: Path) -> None:
    """The docstring's promise, for the damage that broke it: a line nested 100,000 deep raised
    RecursionError and the whole read failed; a line of the wrong shape (origin an int, record a
    dict) was returned, and failed later in ``content()``."""
    good = {"origin": "spool", "reason": "r", "at": "2026-01-01T00:00:00+00:00", "record": "{}"}
    damaged = {
        "nested": b"[" * 100_000 + b"]" * 100_000,
        "wrong types": json.dumps({**good, "origin": 1, "record": {"a": 1}}).encode(),
        "attempt a bool": json.dumps({**good, "attempt": True}).encode(),
        "not UTF-8": b"\xff\xfe" + json.dumps(good).encode(),
        "torn": json.dumps(good).encode()[:30],
    }
    for name, line in damaged.items():
        path = tmp_path / "q.jsonl"
        path.write_bytes(b"\n".join([json.dumps(good).encode(), line, json.dumps(good).encode()]) + b"\n")
        records = quarantine.read_file(path)
        assert [r.content() for r in records] == [{}, {}], name


async def test_replay_quarantines_a_refused_batch_and_loads_the_rest(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Batches spooled during an outage, one of which the database refuses: it used to fail the
    # whole replay, every time, for ever.
    async with asyncio.timeout(60):
        sink = make_sink(target)
        await sink.migrate()
        batches = []
        for rid in ("resp_a", "resp_bad", "resp_b"):
            from eventguard.lifecycle import Lifecycle, ResponseInfo, State

            lc = Lifecycle(info=ResponseInfo(response_id=rid))
            rec = SqlRecorder(sink.writer, lc)
            lc.transition(State.IN_PROGRESS)
            for i in range(3):
                rec.event(i, "response.output_text.delta", delta(i))
            lc.transition(State.COMPLETED)
            batch = rec.collect()
            assert batch is not None
            rec.encode_some(batch)
            if rid == "resp_bad":
                batch.row["status"] = "bogus"
            batches.append(batch)
        sink.spool.append(batches)
        result = await sink.replay_spool()
        assert not sink.spool.pending()
        again = await sink.replay_spool()
        a, b = await stored_seqs(sink, "resp_a"), await stored_seqs(sink, "resp_b")
        kept = await quarantine.read(sink.engine)
        await sink.aclose()
    assert (result.batches, result.events, result.quarantined) == (3, 6, 1)
    assert again.batches == 0
    assert a == b == [0, 1, 2]
    assert [(k.origin, k.response_id, k.event_count()) for k in kept] == [("write", "resp_bad", 3)]


# -- the classification, on errors the real databases raise ----------------------------------------


async def _pg_error(sql: str, *args: Any) -> BaseException:
    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute("CREATE TEMP TABLE t (a text PRIMARY KEY, n int CHECK (n >= 0))")
        await conn.execute("INSERT INTO t VALUES ('x', 1)")
        try:
            await conn.execute(sql, *args)
        except BaseException as exc:
            return exc
        raise AssertionError(f"{sql} did not fail")
    finally:
        await conn.close()


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("sql", "args", "kind"),
    [
        ("INSERT INTO t VALUES ($1, 1)", ("nul \x00",), ErrorKind.DATA),  # 22021
        ("INSERT INTO t VALUES ('x', 2)", (), ErrorKind.DATA),  # 23505 unique
        ("INSERT INTO t VALUES ('y', -1)", (), ErrorKind.DATA),  # 23514 check
        ('SELECT \'{"a": "\\u0000"}\'::jsonb', (), ErrorKind.DATA),  # 22P05
        ("SELECT 1/0", (), ErrorKind.DATA),  # 22012
        ("INSERT INTO no_such_table VALUES (1)", (), ErrorKind.SCHEMA),  # 42P01
        ("SELECT no_such_column FROM t", (), ErrorKind.SCHEMA),  # 42703
        ("SELECT pg_sleep(5)", (), ErrorKind.OUTAGE),  # 57014, statement_timeout below
    ],
)
async def test_postgres_errors_are_classified_by_sqlstate(
    pg_schema: str, sql: str, args: tuple[Any, ...], kind: ErrorKind
) -> None:
    async with asyncio.timeout(30):
        if "pg_sleep" in sql:
            conn = await asyncpg.connect(PG_DSN, server_settings={"statement_timeout": "50"})
            try:
                with pytest.raises(asyncpg.PostgresError) as caught:
                    await conn.execute(sql)
                exc: BaseException = caught.value
            finally:
                await conn.close()
        else:
            exc = await _pg_error(sql, *args)
    assert classify(exc) is kind, repr(exc)


@pytest.mark.postgres
async def test_postgres_errors_through_the_sink_keep_their_meaning(pg_target: Target) -> None:
    # The same errors as the writer sees them: wrapped by SQLAlchemy (exc.orig, __cause__).
    from sqlalchemy.exc import DBAPIError

    sink = make_sink(pg_target)
    async with asyncio.timeout(30):
        await sink.migrate()
        found = {}
        for name, sql, params in [
            ("nul", "SELECT $1::text", ("a\x00",)),
            ("surrogate", "SELECT $1::text", ("a\udcff",)),
            ("undefined", "SELECT * FROM eventguard_nothing", ()),
        ]:
            with pytest.raises(DBAPIError) as caught:
                async with sink.engine.connect() as conn:
                    await conn.exec_driver_sql(sql, params)
            found[name] = classify(caught.value)
        down = SqlSink("postgresql+asyncpg://postgres@127.0.0.1:1/test", spool_path=pg_target.spool)
        with pytest.raises(OSError, match="1") as refused:
            async with down.engine.connect():
                pass
        found["refused"] = classify(refused.value)
        await down.aclose()
        await sink.aclose()
    assert found == {
        "nul": ErrorKind.DATA,
        "surrogate": ErrorKind.DATA,
        "undefined": ErrorKind.SCHEMA,
        "refused": ErrorKind.OUTAGE,
    }


def test_sqlite_errors_are_classified_by_class(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE t (a TEXT PRIMARY KEY, n INTEGER CHECK (n >= 0))")
    conn.execute("INSERT INTO t VALUES ('x', 1)")
    found: dict[str, ErrorKind] = {}
    cases: dict[str, Callable[[], Any]] = {
        "unique": lambda: conn.execute("INSERT INTO t VALUES ('x', 2)"),
        "check": lambda: conn.execute("INSERT INTO t VALUES ('y', -1)"),
        "surrogate": lambda: conn.execute("INSERT INTO t VALUES (?, 1)", ("a\udcff",)),
        "too big": lambda: conn.execute("INSERT INTO t VALUES ('z', ?)", (2**70,)),
        "no table": lambda: conn.execute("SELECT * FROM no_such_table"),
        "malformed json": lambda: conn.execute("SELECT json_extract('{', '$')"),
    }
    for name, call in cases.items():
        try:
            call()
        except Exception as exc:
            found[name] = classify(exc)
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    conn.execute("BEGIN EXCLUSIVE")
    try:
        other.execute("INSERT INTO t VALUES ('w', 1)")
    except sqlite3.OperationalError as exc:
        found["locked"] = classify(exc)
    conn.execute("COMMIT")
    other.close()
    conn.close()
    try:
        conn.execute("SELECT 1")
    except sqlite3.ProgrammingError as exc:
        found["closed"] = classify(exc)
    try:
        sqlite3.connect(tmp_path / "missing-dir" / "x.db")
    except sqlite3.OperationalError as exc:
        found["cannot open"] = classify(exc)
    try:
        json.dumps({"a": 1})  # the writer's own encoding of a lone surrogate
        import orjson

        orjson.dumps("a\udcff")
    except TypeError as exc:
        found["orjson"] = classify(exc)
    assert found == {
        "unique": ErrorKind.DATA,
        "check": ErrorKind.DATA,
        "surrogate": ErrorKind.DATA,
        "too big": ErrorKind.DATA,
        "no table": ErrorKind.SCHEMA,
        "malformed json": ErrorKind.DATA,
        "locked": ErrorKind.OUTAGE,
        "closed": ErrorKind.OUTAGE,
        "cannot open": ErrorKind.OUTAGE,
        "orjson": ErrorKind.DATA,
    }


async def test_read_pages_and_filters(sqlite_target: Target) -> None:
    sink = make_sink(sqlite_target)
    async with asyncio.timeout(30):
        await sink.migrate()
        records = [quarantine.entry("spool", f"r{i}", {"i": i}, response_id=f"id{i % 2}") for i in range(5)]
        async with sink.engine.begin() as conn:
            await quarantine.insert(conn, records)
        first = await quarantine.read(sink.engine, limit=2)
        rest = await quarantine.read(sink.engine, after=first[-1].pk)
        odd = await quarantine.read(sink.engine, response_id="id1")
        async with sink.engine.connect() as conn:
            total = (await conn.execute(select(func.count()).select_from(quarantine_table))).scalar_one()
        await sink.aclose()
    assert [r.reason for r in first + rest] == [f"r{i}" for i in range(5)]
    assert [r.content()["i"] for r in odd] == [1, 3]
    assert total == 5
