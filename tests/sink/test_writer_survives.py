"""The writer never dies: whatever it cannot write goes somewhere durable with a reason, an
unexpected error is logged once with its traceback and counted, ``aclose()`` does not raise. And
the sink replays its spool by itself: when it starts, and when an outage ends."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from eventguard import guard
from eventguard.sink import SqlSink, quarantine
from eventguard.sink.batch import Batch
from eventguard.sink.recorder import SqlRecorder
from eventguard.sink.spool import Spool
from eventguard.sink.writer import Writer
from eventguard.sql.tables import events, responses

from .conftest import Target
from .helpers import created, delta, in_progress, run_guarded, script

DOWN_PG = "postgresql+asyncpg://postgres@127.0.0.1:1/test"


def make_sink(target: Target, **kw: Any) -> SqlSink:
    return SqlSink(target.url, schema=target.schema, spool_path=target.spool, **kw)


def down_url(target: Target, tmp_path: Path) -> str:
    """A database that is not there: an SQLite file under a regular file, a closed port."""
    if target.kind == "sqlite":
        blocker = tmp_path / "not-a-dir"
        blocker.write_text("x")
        return f"sqlite+aiosqlite:///{blocker / 'eg.db'}"
    return DOWN_PG


async def stored(sink: SqlSink, rid: str) -> tuple[str | None, list[int]]:
    async with sink.engine.connect() as conn:
        status = (
            await conn.execute(select(responses.c.status).where(responses.c.response_id == rid))
        ).scalar()
        seqs = (
            await conn.execute(select(events.c.seq).where(events.c.response_id == rid).order_by(events.c.seq))
        ).all()
    return status, [s.seq for s in seqs]


def tracebacks(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "eventguard.sink" and "Traceback (most recent" in r.getMessage()
    ]


class SpoolThatRaises(Spool):
    """A spool whose records cannot be written (as Batch.to_json raised for a lone surrogate)."""

    def append(self, batches: Iterable[Batch]) -> int:
        raise TypeError("str is not valid UTF-8: surrogates not allowed")


async def test_a_redactor_that_raises_keeps_its_events_in_the_quarantine(
    target: Target, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="eventguard.sink")

    def redact(_etype: str | None, event: Any) -> Any:
        if isinstance(event, dict) and event.get("delta") in ("d3", "d7", "d11"):
            raise ValueError("the redactor chokes on \udcff")
        return event

    evs = script("resp_redact", n_deltas=15)
    async with asyncio.timeout(60):
        sink = make_sink(target, redact=redact)
        await sink.start()
        seen = await run_guarded(sink, evs)
        await run_guarded(sink, script("resp_next", n_deltas=2))  # the writer is still there
        status, seqs = await stored(sink, "resp_redact")
        kept = await quarantine.read(sink.engine, response_id="resp_redact")
        nxt = await stored(sink, "resp_next")
        await sink.aclose()
    assert seen == evs
    bad = [5, 9, 13]  # d3, d7, d11 (after created and in_progress)
    assert status == "completed"
    assert seqs == [s for s in range(len(evs)) if s not in bad]
    assert sorted(k.content()["seq"] for k in kept) == bad
    # Its type, never its message, which may quote what it was meant to mask: in the quarantine
    # row and in the log alike, said once as an error (then only counted), with no traceback.
    assert all("the redactor raised ValueError" in k.reason and "chokes" not in k.reason for k in kept)
    assert nxt == ("completed", list(range(6)))
    assert sink.stats.unexpected_errors == 3
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and "redactor raised" in r.getMessage()]
    assert len(errors) == 1, "said once, not per event"
    assert tracebacks(caplog) == [] and "chokes" not in caplog.text


async def test_an_outage_with_a_spool_that_raises_keeps_everything_in_the_quarantine_file(
    target: Target, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="eventguard.sink")
    evs = script("resp_nowhere", n_deltas=20)
    async with asyncio.timeout(60):
        sink = SqlSink(down_url(target, tmp_path), spool_path=target.spool, connect_timeout=2, flush_every=5)
        sink.spool = SpoolThatRaises(target.spool)
        seen = await run_guarded(sink, evs)
        seen2 = await run_guarded(sink, script("resp_nowhere_2", n_deltas=1))
        assert sink.writing(), "the writer is alive"
        await sink.aclose()  # does not raise
    assert seen == evs and len(seen2) == 5
    records = quarantine.read_file(sink.quarantine_path)
    got = sorted((r.response_id, e["seq"]) for r in records for e in r.content()["events"])
    assert got == sorted(
        [("resp_nowhere", s) for s in range(len(evs))] + [("resp_nowhere_2", s) for s in range(5)]
    )
    assert all("could not be spooled (TypeError" in r.reason for r in records)
    assert sink.stats.quarantine_file == len(records) and sink.stats.lost == 0
    assert "batches could not be spooled (TypeError: str is not valid UTF-8" in caplog.text


async def test_nothing_lost_when_an_exception_message_holds_a_lone_surrogate(target: Target) -> None:
    # The guard records the error's message: a lone surrogate in it must neither kill the writer
    # nor lose the response, whichever layer makes it storable.
    async def failing() -> AsyncIterator[Any]:
        yield created("resp_surrogate")
        yield in_progress("resp_surrogate")
        for i in range(5):
            yield delta(i)
        raise RuntimeError("undecodable \udcff byte")

    async with asyncio.timeout(60):
        sink = make_sink(target)
        await sink.start()
        seen: list[Any] = []
        with pytest.raises(RuntimeError):
            async with guard(failing(), asyncio.Event(), sink=sink) as g:
                async for ev in g:
                    seen.append(ev)
        await run_guarded(sink, script("resp_after", n_deltas=1))
        status, seqs = await stored(sink, "resp_surrogate")
        kept = await quarantine.read(sink.engine, response_id="resp_surrogate")
        after = await stored(sink, "resp_after")
        await sink.aclose()
    quarantined = [e["seq"] for k in kept for e in k.content()["events"]]
    assert sorted(seqs + quarantined) == list(range(len(seen)))  # count in == out
    # Stored as failed, or (a row no column could hold) its failed row is in the quarantine.
    assert status == "failed" or any(k.content().get("row", {}).get("status") == "failed" for k in kept)
    assert after[0] == "completed"
    assert sink.stats.batches_spooled == 0


async def test_a_stream_whose_work_cannot_be_collected_does_not_hang_or_stop_the_others(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    collect = SqlRecorder.collect

    def broken(self: SqlRecorder) -> Batch | None:
        if self.lifecycle.info.response_id == "resp_broken":
            raise AttributeError("a bug in the recorder")
        return collect(self)

    monkeypatch.setattr(SqlRecorder, "collect", broken)
    async with asyncio.timeout(60):
        sink = make_sink(target)
        await sink.start()
        await asyncio.gather(
            *(run_guarded(sink, script(rid, n_deltas=5)) for rid in ("resp_broken", "resp_fine"))
        )
        fine = await stored(sink, "resp_fine")
        await sink.aclose()
    assert fine == ("completed", list(range(9)))
    records = quarantine.read_file(sink.quarantine_path)
    assert records and all(r.response_id == "resp_broken" for r in records)
    assert "a bug in the recorder" in records[0].reason
    assert sink.stats.unexpected_errors >= 1


async def test_an_unexpected_error_in_a_write_cycle_is_logged_once_and_the_writer_goes_on(
    target: Target, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The last line of defence: whatever escapes a cycle (a bug) must not end the writer task.
    caplog.set_level(logging.DEBUG, logger="eventguard.sink")
    cycle = Writer.cycle
    failures = 3

    async def flaky(self: Writer, recorders: Any) -> None:
        nonlocal failures
        if failures:
            failures -= 1
            for rec in recorders:
                self.note_change(rec)  # nothing was taken: the next cycle has it all
            raise RuntimeError("a bug in a write cycle")
        await cycle(self, recorders)

    monkeypatch.setattr(Writer, "cycle", flaky)
    evs = script("resp_cycle", n_deltas=5)
    async with asyncio.timeout(60):
        sink = make_sink(target, flush_interval=0.01)
        await sink.start()
        await run_guarded(sink, evs)
        alive = sink.writing()
        got = await stored(sink, "resp_cycle")
        await sink.aclose()  # does not raise
    assert alive
    assert got == ("completed", list(range(len(evs))))
    assert sink.stats.unexpected_errors == 3
    assert len(tracebacks(caplog)) == 1
    assert sink.stats.batches_spooled == 0


async def test_a_cancelled_writer_is_replaced_and_aclose_does_not_raise(target: Target) -> None:
    async def cancel_the_writer() -> None:  # someone cancels every task but their own, say
        (writer,) = [t for t in asyncio.all_tasks() if t.get_name().startswith("eventguard-writer")]
        writer.cancel()
        await asyncio.wait([writer])

    async with asyncio.timeout(60):
        sink = make_sink(target)
        await sink.start()
        await run_guarded(sink, script("resp_before", n_deltas=2))
        await cancel_the_writer()
        await run_guarded(sink, script("resp_after", n_deltas=2))  # a new writer takes over
        after = await stored(sink, "resp_after")
        await cancel_the_writer()
        await sink.aclose()  # the cancelled task's CancelledError is not aclose()'s
        await sink.aclose()  # twice: a no-op
    assert after == ("completed", list(range(6)))
    assert sink.stats.batches_spooled == 0


async def test_aclose_never_raises_when_the_database_the_spool_and_the_quarantine_file_are_gone(
    target: Target, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="eventguard.sink")
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    async with asyncio.timeout(60):
        sink = SqlSink(down_url(target, tmp_path), spool_path=blocker / "spool.jsonl", connect_timeout=2)
        await run_guarded(sink, script("resp_lost", n_deltas=3))
        await sink.aclose()
    assert sink.stats.lost >= 1
    assert "they are lost" in caplog.text


# -- the spool replays itself ------------------------------------------------------------------------


async def _spool_while_down(target: Target, tmp_path: Path, rids: list[str]) -> int:
    down = SqlSink(down_url(target, tmp_path), spool_path=target.spool, connect_timeout=2)
    n = 0
    for rid in rids:
        n += len(await run_guarded(down, script(rid, n_deltas=10)))
    await down.aclose()
    assert target.spool.exists()
    return n


async def _until(predicate: Any, seconds: float = 20.0) -> None:
    async with asyncio.timeout(seconds):
        while not await predicate():  # noqa: ASYNC110  # polling the database, not an event
            await asyncio.sleep(0.02)


def _spool_empty(sink: SqlSink) -> Any:
    async def empty() -> bool:
        return not sink.spool.pending()

    return empty


async def test_the_sink_replays_its_spool_by_itself_when_it_starts(target: Target, tmp_path: Path) -> None:
    rids = [f"resp_spooled_{i}" for i in range(3)]
    async with asyncio.timeout(60):
        await _spool_while_down(target, tmp_path, rids)
        sink = make_sink(target)
        await sink.start()
        await run_guarded(sink, script("resp_new", n_deltas=2))  # not held up by the replay
        new = await stored(sink, "resp_new")

        async def loaded() -> bool:
            return [(await stored(sink, rid))[1] for rid in rids] == [list(range(14))] * len(rids)

        await _until(loaded)
        await _until(_spool_empty(sink))
        again = await sink.replay_spool()
        await sink.aclose()
    assert new == ("completed", list(range(6)))
    assert again.batches == 0


async def test_after_an_outage_the_spool_is_replayed_without_being_asked(sqlite_target: Target) -> None:
    db_path = sqlite_target.url.split("///", 1)[1]
    async with asyncio.timeout(60):
        sink = SqlSink(
            sqlite_target.url, spool_path=sqlite_target.spool, busy_timeout=0.2, flush_interval=0.01
        )
        await sink.start()
        locker = await asyncio.to_thread(
            sqlite3.connect, db_path, isolation_level=None, check_same_thread=False
        )
        await asyncio.to_thread(locker.execute, "BEGIN EXCLUSIVE")
        await run_guarded(sink, script("resp_during", n_deltas=10))
        assert sink.stats.batches_spooled >= 1
        await asyncio.to_thread(locker.execute, "COMMIT")
        locker.close()

        async def loaded() -> bool:
            # New streams keep coming; the first write after the back-off ends the outage.
            await run_guarded(sink, script("resp_back", n_deltas=1))
            try:
                return (await stored(sink, "resp_during")) == ("completed", list(range(14)))
            except OperationalError as exc:
                # This read waits 0.2 s at most (the sink's busy_timeout) for the replay's write
                # lock: not loaded yet, look again.
                if "database is locked" not in str(exc):
                    raise
                return False

        await _until(loaded)
        await _until(_spool_empty(sink))
        await sink.aclose()


async def test_unreadable_spool_entries_are_quarantined_and_counted(target: Target, tmp_path: Path) -> None:
    async with asyncio.timeout(60):
        n = await _spool_while_down(target, tmp_path, ["resp_torn"])
        with target.spool.open("ab") as fh:
            fh.write(b"\nEG1 999 00000000 {torn\n")
        sink = make_sink(target)
        await sink.migrate()
        result = await sink.replay_spool()
        kept = await quarantine.read(sink.engine, origin="spool")
        status, seqs = await stored(sink, "resp_torn")
        await sink.aclose()
    assert (result.bad_lines, result.quarantined, result.events) == (1, 1, n)
    assert len(kept) == 1 and "EG1 999" in kept[0].content()["raw"]
    assert (status, seqs) == ("completed", list(range(n)))
    assert not target.spool.exists()


async def test_two_concurrent_replays_load_each_batch_once_with_true_counts(
    target: Target, tmp_path: Path
) -> None:
    async with asyncio.timeout(60):
        n = await _spool_while_down(target, tmp_path, [f"resp_both_{i}" for i in range(4)])
        a, b = make_sink(target), make_sink(target)
        await a.migrate()
        ra, rb = await asyncio.gather(a.replay_spool(), b.replay_spool())
        total = await stored(a, "resp_both_0")
        async with a.engine.connect() as conn:
            count = (await conn.execute(select(func.count()).select_from(events))).scalar_one()
        await a.aclose()
        await b.aclose()
    assert ra.events + rb.events == n == count
    assert ra.batches + rb.batches >= 4
    assert total[0] == "completed"
