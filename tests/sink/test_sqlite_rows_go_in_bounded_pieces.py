"""On SQLite a short cycle's rows go as multi-row ``VALUES`` in pieces of power-of-two sizes: every
row once and in order, no statement over SQLite's oldest bind limit (999 values), and few enough
statement texts that ``sqlite3``'s statement cache keeps them all, whatever the batch sizes. A
longer cycle's rows go in one ``json_each`` statement, so the writer thread takes the GIL back from
the streams once for them, not once per piece."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import func, select

from eventguard.sink import SqlSink
from eventguard.sink.apply import SQLITE_MAX_PIECE, SQLITE_MAX_VALUES, sqlite_pieces
from eventguard.sql import sqlite_thread
from eventguard.sql.tables import events, responses, transitions

from .conftest import Target
from .helpers import run_guarded, script


@pytest.mark.parametrize("width", [1, 6, 8, 12, 31, 40])
def test_rows_are_cut_into_power_of_two_pieces_in_order_within_the_bind_limit(width: int) -> None:
    sizes: set[int] = set()
    for n in range(0, 300):
        rows = [tuple(range(i * width, (i + 1) * width)) for i in range(n)]
        pieces = list(sqlite_pieces(rows))
        assert [row for piece in pieces for row in piece] == rows
        for piece in pieces:
            size = len(piece)
            assert size & (size - 1) == 0  # a power of two
            assert size <= SQLITE_MAX_PIECE
            assert size * width <= SQLITE_MAX_VALUES
            sizes.add(size)
        # Largest first: a run of full pieces, then each smaller size at most once.
        lengths = [len(p) for p in pieces]
        assert lengths == sorted(lengths, reverse=True)
        tail = [size for size in lengths if size != max(lengths, default=0)]
        assert len(tail) == len(set(tail))
    assert len(sizes) <= 7  # so at most seven statement texts per table


def test_no_rows_make_no_piece() -> None:
    assert list(sqlite_pieces([])) == []


async def test_streams_of_every_length_are_stored_whole_with_few_statement_texts(
    sqlite_target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 70 responses of 1 to 70 deltas, each flushed alone: every batch size a cycle can have, past
    # the last one written as VALUES. Every event is stored once; the writer thread prepared at
    # most seven VALUES texts per table and one json_each text (sqlite3 caches 128 per connection),
    # and every cycle of more than SQLITE_VALUES_UP_TO events wrote them in one statement.
    texts: set[str] = set()
    long_cycles: list[int] = []
    run = sqlite_thread.SqliteConnection.run

    def seen(self: Any, sql: str, params: Any) -> int:
        texts.add(sql)
        if sql.startswith(f"INSERT INTO {events.name} ") and "json_each" in sql:
            long_cycles.append(len(params))
        return run(self, sql, params)

    monkeypatch.setattr(sqlite_thread.SqliteConnection, "run", seen)
    sink = SqlSink(sqlite_target.url, spool_path=sqlite_target.spool)
    async with asyncio.timeout(120):
        await sink.start()
        sent = 0
        for n in range(1, 71):
            sent += len(await run_guarded(sink, script(f"resp_{n}", n_deltas=n)))
            await sink.flush()
        await sink.aclose()
        async with sink.engine.connect() as conn:
            stored = (await conn.execute(select(func.count()).select_from(events))).scalar_one()
            completed = (
                await conn.execute(select(func.count()).where(responses.c.status == "completed"))
            ).scalar_one()
        await sink.engine.dispose()
    assert (stored, completed) == (sent, 70)
    for table in (events, transitions, responses):
        into = f"INSERT INTO {table.name} "
        assert 1 <= sum(t.startswith(into) and "json_each" not in t for t in texts) <= 7, table.name
    assert sum("json_each" in t for t in texts) == 1  # the events of the longest cycles
    assert long_cycles and set(long_cycles) == {1}  # one bound array each
