"""Two writers meeting on the same rows (two replicas, a retry): the database may roll one back
(a deadlock, a serialization failure). That is no outage: the write is done again at once, so
the history is complete when the sinks close, not held in a spool until the next replay. And
every writer locks rows in one order (by response id), so two cycles over the same responses
wait for each other instead of deadlocking."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import text

from eventguard.sink import SqlSink
from eventguard.sink.apply import write
from eventguard.sink.commit import CONFLICT_TRIES, Committer
from eventguard.sql.engine import PreSerialised

from .conftest import Target
from .helpers import run_guarded
from .test_duplicate_stream import make_sink, marked, race
from .test_spool_format import make_batch


class _Deadlock(Exception):
    """What the driver raises when PostgreSQL picks this transaction as a deadlock's victim."""

    sqlstate = "40P01"


def _rolled_back(monkeypatch: pytest.MonkeyPatch, calls: set[int]) -> list[int]:
    """Make the writes numbered in ``calls`` (1 = the first of any sink) fail as a deadlock's
    victim before they reach the database; the numbers of every write tried."""
    tried: list[int] = []
    on_driver, on_thread = Committer._on_driver, Committer._on_thread

    def maybe_fail() -> None:
        tried.append(len(tried) + 1)
        if tried[-1] in calls:
            raise _Deadlock("deadlock detected")

    async def driver(self: Committer, *args: Any, **kwargs: Any) -> Any:
        maybe_fail()
        return await on_driver(self, *args, **kwargs)

    async def thread(*args: Any, **kwargs: Any) -> Any:
        maybe_fail()
        return await on_thread(*args, **kwargs)

    monkeypatch.setattr(Committer, "_on_driver", driver)
    monkeypatch.setattr(Committer, "_on_thread", staticmethod(thread))
    return tried


@pytest.mark.parametrize("victim", [1, 2, 3])
async def test_a_write_rolled_back_for_meeting_another_is_done_again_not_spooled(
    target: Target, monkeypatch: pytest.MonkeyPatch, victim: int
) -> None:
    _rolled_back(monkeypatch, {victim})
    a, b, _ = await race(target, [f"resp_race_{i}" for i in range(8)])
    assert a.stats.batches_spooled + b.stats.batches_spooled == 0
    assert a.stats.conflicts_retried + b.stats.conflicts_retried == 1


async def test_a_write_that_keeps_meeting_another_is_spooled_after_its_tries(
    sqlite_target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    tried = _rolled_back(monkeypatch, set(range(1, CONFLICT_TRIES + 1)))
    async with asyncio.timeout(30):
        sink = make_sink(sqlite_target)
        await sink.start()
        await run_guarded(sink, marked("resp_busy", "A", 3, "completed"))
        await sink.aclose()
    assert tried[:CONFLICT_TRIES] == list(range(1, CONFLICT_TRIES + 1))
    assert sink.stats.conflicts_retried == CONFLICT_TRIES - 1
    assert sink.stats.batches_spooled >= 1  # an outage now: kept, not lost


async def _until_blocked_by(probe: Any, pid: int) -> None:
    """Until a session waits for a lock the session ``pid`` holds (polled: the server says so
    only when asked; each poll its own transaction, as the server keeps one view of its activity
    for a whole transaction)."""
    query = text("SELECT count(*) FROM pg_stat_activity WHERE :h = ANY(pg_blocking_pids(pid))")
    while True:
        blocked = (await probe.execute(query, {"h": pid})).scalar()
        await probe.rollback()
        if blocked:
            return
        await asyncio.sleep(0.01)


def _in_progress(rid: str, seq: int) -> Any:
    batch = make_batch(rid, text="x", n_events=1)
    batch.row.update(status="in_progress", cause=None, finished_at=None, state_seq=seq, event_count=seq)
    batch.terminal = False
    batch.transitions = []
    batch.anomalies = []
    batch.events = [(1, seq - 1, "response.output_text.delta", PreSerialised('{"delta": "x"}'))]
    batch.stream_id = f"stream_{rid}"
    return batch


@pytest.mark.postgres
async def test_rows_are_locked_in_response_id_order_whatever_order_the_cycle_took(pg_target: Target) -> None:
    sink = SqlSink(pg_target.url, schema=pg_target.schema, spool_path=pg_target.spool)
    await sink.start()
    engine = sink.engine
    table = f'"{pg_target.schema}".eventguard_responses'
    try:
        async with asyncio.timeout(30):
            async with engine.begin() as conn:
                await write(conn, [_in_progress("resp_a", 1), _in_progress("resp_b", 1)])
            async with engine.connect() as holder, engine.connect() as probe:
                await holder.begin()  # another writer holds resp_b
                holder_pid = (await holder.execute(text("SELECT pg_backend_pid()"))).scalar()
                await holder.execute(text(f"SELECT 1 FROM {table} WHERE response_id = 'resp_b' FOR UPDATE"))

                async def cycle() -> None:  # this writer's cycle took resp_b first
                    async with engine.begin() as conn:
                        await write(conn, [_in_progress("resp_b", 2), _in_progress("resp_a", 2)])

                task = asyncio.create_task(cycle())
                await _until_blocked_by(probe, holder_pid)
                # Waiting for resp_b, the cycle already holds resp_a: it took the rows in id order.
                # (Taking them as given, it would hold nothing yet, and a writer holding resp_b
                # that wants resp_a next would deadlock with it.)
                await probe.execute(text("SET lock_timeout = '100ms'"))
                with pytest.raises(Exception, match="lock"):
                    await probe.execute(
                        text(f"SELECT 1 FROM {table} WHERE response_id = 'resp_a' FOR UPDATE NOWAIT")
                    )
                await probe.rollback()
                await holder.rollback()
                await task
    finally:
        await sink.aclose()
        await engine.dispose()
