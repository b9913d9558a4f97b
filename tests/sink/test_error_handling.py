"""How the writer reads errors and says them: a plain ValueError is not taken for refused content,
an unexpected error's traceback is logged without the URL's secrets or the bound values, and a
spool file replayed again after an outage does not put its quarantine records in twice."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import orjson
import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import StatementError

from eventguard.lifecycle import Lifecycle, ResponseInfo, State
from eventguard.sink import SqlSink, quarantine
from eventguard.sink import commit as commitmod
from eventguard.sink import replay as replaymod
from eventguard.sink.apply import Stopped
from eventguard.sink.batch import Batch
from eventguard.sink.recorder import SqlRecorder
from eventguard.sql.classify import ErrorKind, classify
from eventguard.sql.tables import events, responses

from .conftest import Target
from .helpers import run_guarded, script
from .test_spool_format import make_batch


def make_sink(target: Target, **kw: Any) -> SqlSink:
    return SqlSink(target.url, schema=target.schema, spool_path=target.spool, **kw)


async def until(check: Any, seconds: float = 20.0) -> None:
    async with asyncio.timeout(seconds):
        while not await check():  # noqa: ASYNC110  # polling the database, not an event
            await asyncio.sleep(0.02)


# -- a plain ValueError --------------------------------------------------------------------------------


def test_a_plain_value_error_is_not_taken_for_refused_content() -> None:
    try:
        orjson.dumps("a\udcff")
    except TypeError as exc:
        lone_surrogate: BaseException = exc
    wrapped = StatementError("closed", "INSERT", {}, ValueError("Connection closed"))
    assert classify(ValueError("Connection closed")) is ErrorKind.OUTAGE  # aiosqlite's
    assert classify(ValueError("no active connection")) is ErrorKind.OUTAGE
    assert classify(wrapped) is ErrorKind.OUTAGE
    assert classify(ValueError("something else")) is ErrorKind.UNKNOWN  # the writer asks the database
    assert classify(UnicodeEncodeError("utf-8", "a\udcff", 1, 2, "surrogates not allowed")) is ErrorKind.DATA
    assert classify(asyncpg.DataError("invalid input for query argument $1")) is ErrorKind.DATA
    assert classify(lone_surrogate) is ErrorKind.DATA
    assert classify(OverflowError("int too big")) is ErrorKind.DATA


async def test_a_closed_connection_spools_the_batch_instead_of_quarantining_it(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    write = commitmod.write
    calls = 0

    async def closed_at_first(conn: Any, batches: Any, **kw: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls <= 3:
            raise ValueError("Connection closed")  # as aiosqlite says it
        return await write(conn, batches, **kw)

    monkeypatch.setattr(commitmod, "write", closed_at_first)
    async with asyncio.timeout(60):
        sink = make_sink(target, flush_interval=0.01)
        await sink.start()
        await run_guarded(sink, script("resp_closed", n_deltas=3))

        later = iter(range(1000))

        async def stored() -> bool:
            await run_guarded(sink, script(f"resp_later_{next(later)}", n_deltas=1))
            async with sink.engine.connect() as conn:
                n = (
                    await conn.execute(
                        select(func.count()).select_from(events).where(events.c.response_id == "resp_closed")
                    )
                ).scalar_one()
                status = (
                    await conn.execute(
                        select(responses.c.status).where(responses.c.response_id == "resp_closed")
                    )
                ).scalar()
            return (status, n) == ("completed", 7)

        await until(stored)
        kept = await quarantine.read(sink.engine)
        await sink.aclose()
    assert kept == [] and sink.stats.quarantined == 0
    assert sink.stats.batches_spooled >= 1


# -- what an unexpected error's log says --------------------------------------------------------------

PASSWORD = "pa55-W0RD-in-a-traceback"
PAYLOAD = "user-secret-in-a-bound-value"


def test_an_unexpected_error_is_logged_without_the_password_or_the_bound_values(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="eventguard.sink")
    url = f"postgresql+asyncpg://eventguard:{PASSWORD}@127.0.0.1:1/nowhere"
    sink = SqlSink(url, spool_path=tmp_path / "spool.jsonl")
    try:
        try:
            raise ConnectionError(f"lost {url} while writing")
        except ConnectionError as inner:
            raise StatementError(
                "the write failed", "INSERT INTO eventguard_events VALUES (?)", {"payload": PAYLOAD}, inner
            ) from inner
    except StatementError as exc:
        sink.writer.unexpected(exc, "a write")
    # As a plain handler would print each record, traceback included.
    shown = "\n".join(logging.Formatter().format(r) for r in caplog.records)
    assert "Traceback (most recent call last)" in shown
    assert "[parameters: not logged]" in shown
    assert PASSWORD not in shown
    assert PAYLOAD not in shown


# -- quarantine records of a spool file replayed twice ------------------------------------------------


async def test_a_spool_file_replayed_again_after_an_outage_quarantines_each_record_once(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replaymod, "REPLAY_CHUNK", 1)
    async with asyncio.timeout(60):
        sink = make_sink(target)
        await sink.start()
        await run_guarded(sink, script("resp_owned", n_deltas=1))  # its stream owns the id
        lc = Lifecycle(info=ResponseInfo(response_id="resp_owned"))
        other = SqlRecorder(sink.writer, lc)  # a second stream with the same id: a duplicate
        lc.transition(State.IN_PROGRESS)
        other.event(0, "response.output_text.delta", {"type": "response.output_text.delta", "delta": "x"})
        lc.transition(State.FAILED)
        dup = other.collect()
        assert dup is not None
        other.encode_some(dup)  # serialised before it is spooled (a batch is plain data)
        sink.spool.append([dup])
        with sink.spool.path.open("ab") as fh:
            fh.write(b"\nEG1 999 00000000 {torn\n")
        sink.spool.append([make_batch("resp_good_1", n_events=1)])
        sink.spool.append([make_batch("resp_good_2", n_events=1)])

        apply = sink.writer.committer.apply
        stopped = False

        async def locked_once(batches: list[Batch], tally: Any) -> None:
            nonlocal stopped
            if not stopped and batches[0].response_id == "resp_good_2":
                stopped = True  # an outage halfway through the file: it is replayed again
                raise Stopped(sqlite3.OperationalError("database is locked"), list(batches))
            await apply(batches, tally)

        sink.writer.committer.apply = locked_once  # type: ignore[method-assign]
        with pytest.raises(sqlite3.OperationalError):
            await sink.replay_spool()
        again = await sink.replay_spool()
        last = await sink.replay_spool()
        kept = await quarantine.read(sink.engine)
        await sink.aclose()
    assert sorted(k.origin for k in kept) == ["duplicate", "spool"]
    assert again.batches == 3 and again.bad_lines == 1 and again.quarantined == 0
    assert last.batches == 0
