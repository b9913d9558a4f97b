"""What is spooled is replayed without a restart: after a background replay an outage stopped, and
after an overflow spill (no outage at all). On SQLite and PostgreSQL. And the spool never holds
up the event loop: take() does not wait for a lock, a replay lets the streams run between records,
and an overflow leaves the quarantine file's fsync to the writer."""

from __future__ import annotations

import asyncio
import fcntl
import itertools
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from eventguard.sink import SqlSink, quarantine
from eventguard.sink import replay as replaymod
from eventguard.sink.apply import Stopped
from eventguard.sink.batch import Batch
from eventguard.sink.spool import Spool
from eventguard.sql.tables import events, responses

from .conftest import Overflowing, Target
from .helpers import run_guarded, script
from .test_spool_format import make_batch


def make_sink(target: Target, **kw: Any) -> SqlSink:
    return SqlSink(target.url, schema=target.schema, spool_path=target.spool, **kw)


async def stored(sink: SqlSink, rid: str) -> tuple[str | None, int]:
    async with sink.engine.connect() as conn:
        status = (
            await conn.execute(select(responses.c.status).where(responses.c.response_id == rid))
        ).scalar()
        n = (
            await conn.execute(select(func.count()).select_from(events).where(events.c.response_id == rid))
        ).scalar_one()
    return status, int(n)


async def until(check: Any, seconds: float = 15.0) -> None:
    async with asyncio.timeout(seconds):
        while not await check():  # noqa: ASYNC110  # polling the database, not an event
            await asyncio.sleep(0.02)


async def test_a_replay_an_outage_stopped_goes_on_when_writes_succeed_again(target: Target) -> None:
    async with asyncio.timeout(60):
        sink = make_sink(target, flush_interval=0.01)
        await sink.start()
        persist = sink.writer.persist

        async def spool_all(batches: list[Batch]) -> None:
            sink.writer.to_spool(batches, None)  # as an overflow, or an outage, would leave them

        sink.writer.persist = spool_all  # type: ignore[method-assign]
        await run_guarded(sink, script("resp_spooled", n_deltas=3))
        sink.writer.persist = persist  # type: ignore[method-assign]
        assert sink.spool.pending()

        apply = sink.writer.committer.apply
        calls = 0

        async def locked_once(batches: list[Batch], tally: Any) -> None:
            nonlocal calls
            calls += 1
            if calls == 1:  # the background replay meets an outage-class error
                raise Stopped(sqlite3.OperationalError("database is locked"), list(batches))
            await apply(batches, tally)

        sink.writer.committer.apply = locked_once  # type: ignore[method-assign]
        sink.writer.replayer.soon()
        st = sink.writer.loops.live
        assert st is not None and st.replay is not None
        await asyncio.wait([st.replay])
        assert sink.spool.pending()

        async def replayed() -> bool:
            await run_guarded(sink, script("resp_live", n_deltas=1))  # live writes go on
            return await stored(sink, "resp_spooled") == ("completed", 7)

        await until(replayed)
        await until(lambda: _false(sink.spool.pending()))
        await sink.aclose()


async def _false(value: bool) -> bool:
    return not value


async def test_an_overflow_spill_is_replayed_without_a_restart(target: Target, overflow: Overflowing) -> None:
    async with asyncio.timeout(60):
        sink = make_sink(target, max_buffered=50, flush_every=10, flush_interval=0.01)
        await sink.start()
        full = overflow(sink, "resp_full", 500)
        assert sink.stats.overflows > 0 and sink.spool.pending()
        await full.complete()

        async def loaded() -> bool:
            return await stored(sink, "resp_full") == ("completed", 500)

        await until(loaded)  # nobody called replay_spool()
        await until(lambda: _false(sink.spool.pending()))
        await sink.aclose()


async def test_what_overflowed_is_in_the_database_once_the_sink_is_closed(target: Target) -> None:
    """A short-lived job: many streams at once past ``max_buffered``, then ``aclose()`` on a
    healthy database. Before, the background replay of the spill was cancelled by the close, and
    the events stayed out of the database (in the spool) until the next start."""
    async with asyncio.timeout(60):
        sink = make_sink(target, max_buffered=5, flush_every=5)
        await sink.start()
        seen = await asyncio.gather(*(run_guarded(sink, script(f"resp_spill_{i}", 40)) for i in range(10)))
        assert sink.stats.overflows > 0
        await sink.aclose()
        for i, got in enumerate(seen):
            assert await stored(sink, f"resp_spill_{i}") == ("completed", len(got))
    assert not sink.spool.pending()


# -- nothing waits on the event loop ------------------------------------------------------------------


def test_take_never_waits_for_a_file_an_append_holds(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.jsonl")
    spool.append([make_batch("resp_held")])
    held = os.open(spool.path, os.O_RDONLY)
    try:
        fcntl.flock(held, fcntl.LOCK_SH)  # an append still writing to the file (another worker)
        started = time.monotonic()
        claimed = list(spool.take())
        waited = time.monotonic() - started
        assert claimed == [] and spool.pending()
    finally:
        os.close(held)
    assert waited < 0.05, f"take() waited {waited:.3f}s on the event loop"
    [file] = list(spool.take())  # the next replay takes it
    assert [b.response_id for b in file.batches] == ["resp_held"]
    spool.done(file)
    assert not spool.pending()


async def test_a_replay_lets_the_streams_run_every_few_entries(
    sqlite_target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    ticks = 0
    seen: list[int] = []
    records = replaymod.entries

    def counted(file: Any, tally: Any) -> Iterator[Any]:
        for record in records(file, tally):
            seen.append(ticks)  # how many turns the other tasks had when this record was read
            yield record

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    monkeypatch.setattr(replaymod, "entries", counted)
    sink = make_sink(sqlite_target)
    async with asyncio.timeout(60):
        await sink.migrate()
        sink.spool.append([make_batch(f"resp_{i}", n_events=1) for i in range(120)])
        other = asyncio.create_task(ticker())
        result = await sink.replay_spool()
        other.cancel()
        await sink.aclose()
    assert result.batches == 120
    longest = max(sum(1 for _ in run) for _, run in itertools.groupby(seen))
    assert longest <= 4, f"{longest} records read in one turn of the event loop"


async def test_an_overflow_leaves_the_quarantine_file_to_the_writer(
    sqlite_target: Target, monkeypatch: pytest.MonkeyPatch, overflow: Overflowing
) -> None:
    on_loop: list[bool] = []
    append_file = quarantine.append_file
    loop_thread = threading.get_ident()

    def watched(path: Path, records: Any) -> int:
        on_loop.append(threading.get_ident() == loop_thread)
        return append_file(path, records)

    def redact(etype: str | None, event: Any) -> Any:
        if event.get("delta") == "d7":
            raise KeyError("arguments_delta_v2")
        return event

    monkeypatch.setattr(quarantine, "append_file", watched)
    sink = make_sink(sqlite_target, max_buffered=50, flush_every=10, redact=redact)
    async with asyncio.timeout(60):
        await sink.start()
        full = overflow(sink, "resp_full_redact", 200)
        assert sink.stats.overflows > 0
        assert on_loop == [], "the hot path appended to the quarantine file itself"
        await full.complete()
        await sink.aclose()
    assert on_loop == [False]  # appended once, in a thread
    [record] = quarantine.read_file(sink.quarantine_path)
    assert record.content()["seq"] == 7
