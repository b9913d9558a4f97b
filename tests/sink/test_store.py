"""ResponseStore: paging, stats, prune, recover, and arguments it must refuse."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import update

from eventguard.errors import InvalidQueryError
from eventguard.lifecycle import State
from eventguard.sink import SqlSink
from eventguard.sql.tables import events, responses
from eventguard.store import ResponseStore

from .conftest import Target
from .helpers import run_guarded, script, stored_in_progress


@pytest.fixture
async def filled(target: Target) -> AsyncIterator[tuple[SqlSink, ResponseStore]]:
    sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
    store = ResponseStore(target.url, schema=target.schema)
    async with asyncio.timeout(60):
        for i in range(12):
            final = ["completed", "failed", "incomplete"][i % 3]
            await run_guarded(sink, script(f"r{i:02d}", n_deltas=3, final=final))
        await sink.flush()
    try:
        yield sink, store
    finally:
        async with asyncio.timeout(30):
            await sink.aclose()
            await store.aclose()


async def test_terminal_states_pages_without_gaps_or_repeats(filled: tuple[SqlSink, ResponseStore]) -> None:
    _, store = filled
    seen: list[str] = []
    after = None
    async with asyncio.timeout(30):
        while True:
            page = await store.terminal_states(limit=5, after=after)
            seen += [r.response_id for r in page.items]
            if page.next_after is None:
                break
            after = page.next_after
        failed = await store.terminal_states(status="failed", limit=100)
        two = await store.terminal_states(status=["failed", "incomplete"])
    assert seen == [f"r{i:02d}" for i in range(12)]
    assert [r.response_id for r in failed.items] == ["r01", "r04", "r07", "r10"]
    assert all(r.error_code == "server_error" for r in failed.items)
    assert len(two.items) == 8


async def test_terminal_states_keep_to_their_time_window(filled: tuple[SqlSink, ResponseStore]) -> None:
    _, store = filled
    now = datetime.now(UTC)
    async with asyncio.timeout(30):
        assert len((await store.terminal_states(since=now - timedelta(minutes=5))).items) == 12
        assert (await store.terminal_states(since=now + timedelta(minutes=5))).items == []
        assert (await store.terminal_states(until=now - timedelta(minutes=5))).items == []
        # Another zone, same instant: the same answer.
        plus2 = timezone(timedelta(hours=2))
        assert (
            len((await store.terminal_states(since=(now - timedelta(minutes=5)).astimezone(plus2))).items)
            == 12
        )


async def test_stats_count_by_status_in_their_window(filled: tuple[SqlSink, ResponseStore]) -> None:
    _, store = filled
    async with asyncio.timeout(30):
        stats = await store.stats(since=datetime.now(UTC) - timedelta(hours=1))
        empty = await store.stats(since=datetime.now(UTC) + timedelta(hours=1))
    assert stats.total == 12
    assert stats.by_status == {"completed": 4, "failed": 4, "incomplete": 4}
    assert sum(stats.by_cause.values()) == 12
    assert stats.duration_ms_p50 is not None
    assert stats.duration_ms_p50 <= stats.duration_ms_p90 <= stats.duration_ms_p99  # type: ignore[operator]
    assert empty.total == 0
    assert empty.duration_ms_p99 is None


async def test_prune_removes_only_what_is_older_than_asked(filled: tuple[SqlSink, ResponseStore]) -> None:
    _, store = filled
    async with asyncio.timeout(30):
        nothing = await store.prune(older_than=timedelta(hours=1))
        assert nothing.events == 0
        kept = await store.prune(older_than=datetime.now(UTC) + timedelta(seconds=1))
        assert kept.events == 12 * 7
        assert kept.responses == 0
        rec = await store.get("r00")
        hist = await store.history("r00")
        assert rec is not None
        assert hist is not None
        assert hist.attempts[0].events == []
        gone = await store.prune(older_than=datetime.now(UTC) + timedelta(seconds=1), keep_summary=False)
        assert gone.responses == 12
        assert await store.get("r00") is None


async def test_recover_marks_stuck_rows_once(target: Target) -> None:
    sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
    store = ResponseStore(target.url, schema=target.schema)
    async with asyncio.timeout(30):
        await sink.start()
        lc, rec = await stored_in_progress(sink, "stuck")
        async with sink.engine.begin() as conn:
            await conn.execute(update(responses).values(updated_at=datetime.now(UTC) - timedelta(hours=2)))
        assert await store.recover(older_than=timedelta(hours=1)) == ["stuck"]
        assert await store.recover(older_than=timedelta(hours=1)) == []  # idempotent
        got = await store.get("stuck")
        assert got is not None
        assert got.status == "interrupted"
        assert got.cause == "abandoned"
        # The writer was alive after all: it can still record the real terminal, and its own
        # transitions do not collide with the one recover() wrote.
        lc.transition(State.COMPLETED)
        rec.changed()
        await rec.close()
        await sink.aclose()
        hist = await store.history("stuck")
        await store.aclose()
    assert hist is not None
    assert hist.response.status == "completed"
    assert [t.to_state for t in hist.attempts[0].transitions] == ["interrupted", "in_progress", "completed"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"status": "nope'; --"}, "unknown status"),
        ({"status": ["completed", "in_progress"]}, "unknown status"),
        ({"limit": 0}, "limit"),
        ({"limit": 10**9}, "limit"),
        ({"limit": "5"}, "limit"),
        ({"after": -1}, "cursor"),
        ({"after": "1 OR 1=1"}, "cursor"),
        ({"since": "2020-01-01"}, "datetime"),
    ],
)
async def test_bad_query_arguments_are_typed_errors(
    filled: tuple[SqlSink, ResponseStore], kwargs: dict[str, Any], message: str
) -> None:
    _, store = filled
    async with asyncio.timeout(10):
        with pytest.raises(InvalidQueryError, match=message):
            await store.terminal_states(**kwargs)


async def test_sql_metacharacters_in_query_arguments_match_nothing(
    filled: tuple[SqlSink, ResponseStore],
) -> None:
    _, store = filled
    nasty = "x' OR '1'='1"
    async with asyncio.timeout(10):
        assert await store.get(nasty) is None
        assert await store.history(nasty) is None
        assert (await store.anomalies(response_id=nasty, kind=[nasty, "%"])).items == []
        assert len((await store.terminal_states()).items) == 12  # nothing was dropped


async def test_recent_lists_every_status_newest_first_and_pages_by_before(
    filled: tuple[SqlSink, ResponseStore],
) -> None:
    """``responses list`` from Python (issue 14): in-progress responses too, newest first."""
    sink, store = filled
    async with asyncio.timeout(30):
        _, rec = await stored_in_progress(sink, "running")
        newest = await store.recent(limit=3)
        pages: list[str] = []
        before = None
        while page := await store.recent(limit=5, before=before):
            pages += [r.response_id for r in page]
            before = page[-1].pk
        running = await store.recent(status="in_progress")
        two = await store.recent(status=["failed", "in_progress"])
        lately = await store.recent(since=datetime.now(UTC) - timedelta(hours=1))
        future = await store.recent(since=datetime.now(UTC) + timedelta(hours=1))
        await rec.close()
    assert [r.response_id for r in newest] == ["running", "r11", "r10"]
    assert newest[0].status == "in_progress" and newest[0].finished_at is None
    assert pages == ["running", *(f"r{i:02d}" for i in reversed(range(12)))]
    assert [r.response_id for r in running] == ["running"]
    assert [r.response_id for r in two] == ["running", "r10", "r07", "r04", "r01"]
    assert len(lately) == 13 and future == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"status": "done"}, "unknown status"),
        ({"limit": 0}, "limit"),
        ({"limit": 10_001}, "limit"),
        ({"before": -1}, "row key"),
        ({"before": True}, "row key"),
        ({"before": "1 OR 1=1"}, "row key"),
        ({"since": "2020-01-01"}, "datetime"),
    ],
)
async def test_recent_refuses_arguments_it_cannot_read(
    filled: tuple[SqlSink, ResponseStore], kwargs: dict[str, Any], message: str
) -> None:
    _, store = filled
    async with asyncio.timeout(10):
        with pytest.raises(InvalidQueryError, match=message):
            await store.recent(**kwargs)


async def test_a_negative_age_prunes_and_recovers_nothing(filled: tuple[SqlSink, ResponseStore]) -> None:
    """``older_than=timedelta(days=-1)`` reads as "ended before tomorrow": it pruned the history of
    responses that had just ended and marked running ones interrupted. Now refused, nothing touched."""
    _, store = filled
    async with asyncio.timeout(30):
        before = await store.history("r00")
        for age in (timedelta(days=-1), timedelta(microseconds=-1)):
            calls = (
                store.prune(older_than=age),
                store.prune(older_than=age, keep_summary=False),
                store.prune_envelopes(older_than=age),
                store.prune_agent_sessions(older_than=age),
                store.recover(older_than=age),
            )
            for call in calls:
                with pytest.raises(
                    InvalidQueryError, match=r"^older_than must be an age of zero or more, not -"
                ):
                    await call
        for flag in (None, 0, "false"):
            with pytest.raises(InvalidQueryError, match=r"^keep_summary must be True or False"):
                await store.prune(older_than=timedelta(0), keep_summary=flag)  # type: ignore[arg-type]
        assert await store.history("r00") == before
        assert await store.count() == 12


async def test_a_query_argument_of_the_wrong_shape_is_an_invalid_query_not_a_driver_error(
    filled: tuple[SqlSink, ResponseStore],
) -> None:
    """Each came out of the driver or the database before: a NUL or a lone surrogate in ``kind``
    (DBAPIError on PostgreSQL, UnicodeEncodeError on SQLite), ``kind=123`` (TypeError: not
    iterable), a cursor past a BIGINT (OverflowError, or the server's out-of-range error), a time at
    the calendar's edge with an offset (OverflowError naming nothing)."""
    _, store = filled
    edge = [
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5))),
        datetime.max.replace(tzinfo=timezone(timedelta(hours=-5))),
    ]
    async with asyncio.timeout(60):
        calls: list[Any] = [
            *(
                store.anomalies(kind=k)
                for k in ("\x00", "\udcff", ["ok", "a\x00"], 123, b"x", ["ok", 5], {"k": 1})
            ),
            *(store.recent(status=s) for s in (123, b"completed", ["completed", None], {"completed": 1})),
            *(store.terminal_states(status=s) for s in (123, b"completed", ["completed", 5])),
            *(store.recent(before=c) for c in (2**63, 2**64, -1)),
            *(store.terminal_states(after=c) for c in (2**63, 2**64, -1)),
            *(store.anomalies(after=c) for c in (2**63, 10**400)),
            *(store.recent(since=t) for t in edge),
            *(store.terminal_states(since=t) for t in edge),
            *(store.anomalies(until=t) for t in edge),
            *(store.prune(older_than=t) for t in edge),
            *(store.stats(since=t) for t in edge),
        ]
        for call in calls:
            with pytest.raises(InvalidQueryError) as caught:
                await call
            assert str(caught.value).isprintable() and len(str(caught.value)) < 300
        # What is well formed but matches nothing is an empty answer, not an error.
        for no_such in (["no_such_kind"], "\x1b[2J", "résumé-🙂", "a\nb"):
            assert (await store.anomalies(kind=no_such)).items == []
        assert await store.recent(before=2**63 - 1, limit=1) != []
        assert (await store.terminal_states(after=2**63 - 1)).items == []
        assert await store.count() == 12


async def test_the_whole_store_iterators_take_the_same_batch_and_say_batch(
    filled: tuple[SqlSink, ResponseStore],
) -> None:
    """iter_agent_sessions checked its batch as a limit (1 to 10,000, "limit must be ..."), where
    histories takes 1 to 500 and says batch."""
    _, store = filled
    async with asyncio.timeout(30):
        for batch in (0, 501, 10_000, "5", True, None):
            for iterate in (store.iter_agent_sessions, store.histories):
                with pytest.raises(InvalidQueryError, match=r"^batch must be an integer from 1 to 500"):
                    async for _ in iterate(batch=batch):  # type: ignore[arg-type]
                        pass
        assert len([h async for h in store.histories(batch=500)]) == 12


async def test_history_rows_refuses_columns_it_cannot_group_by_an_invalid_query(
    filled: tuple[SqlSink, ResponseStore],
) -> None:
    """``history_rows(event_columns=)`` takes columns of the events table, ``response_id`` and
    ``attempt`` among them (its docstring's contract). Before: a column name as a string was
    SQLAlchemy's ArgumentError, an int its TypeError, a list without ``response_id`` an
    AttributeError on the first row, and another table's column a silent cartesian product (every
    event once per response row); a list without ``attempt`` went through."""
    _, store = filled
    wrong: list[Any] = [
        "response_id",
        b"seq",
        123,
        ["response_id", "attempt"],
        [events.c.response_id, events.c.attempt, responses.c.status],
        [events.c.attempt, events.c.seq],
        [events.c.response_id, events.c.seq],
        [None],
    ]
    async with asyncio.timeout(60):
        for columns in wrong:
            with pytest.raises(InvalidQueryError) as caught:
                async for _ in store.history_rows(10, columns):
                    pass
            assert str(caught.value).isprintable() and len(str(caught.value)) < 300
        chosen = (events.c.response_id, events.c.attempt, events.c.seq)
        rows = [
            (row.response_id, [e.seq for e in evs]) async for row, evs, *_ in store.history_rows(5, chosen)
        ]
        everything = [(row.response_id, [e.seq for e in evs]) async for row, evs, *_ in store.history_rows(5)]
    assert rows == everything and len(rows) == 12 and all(seqs for _rid, seqs in rows)
