"""Counts what the sink does per short response (issue 13): write transactions, statements, batches.

Sequential 28-event responses (``eventguard.testing.stream_events``) through ``guard()`` and an
``SqlSink``, each response spread over ``--duration`` seconds (the events evenly paced), as a
host's model-free response is. Counts, not times, so a busy machine does not change them much;
run it under ``valgrind --tool=callgrind`` with N and 3N responses (``--scale`` stretches every
time, the sink's ``flush_interval`` included, so valgrind's slowdown does not change the schedule)
and the difference of the two instruction counts over 2N is the cost of one response.

    PYTHONHASHSEED=0 python scripts/sink_per_response.py --db sqlite -n 50 --duration 0.06
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

from eventguard import guard
from eventguard.sink import SqlSink, apply, direct
from eventguard.sql import sqlite_thread
from eventguard.testing import stream_events

PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"
PG_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"

statements = 0


def _count_statements() -> None:
    """Count every statement the write path sends: the SQLite thread's and asyncpg's calls."""
    run, execute = sqlite_thread.SqliteConnection.run, sqlite_thread.SqliteConnection.execute
    driver_call = apply._driver_call

    def counted_run(self: Any, sql: str, params: Any) -> int:
        global statements
        statements += 1
        return run(self, sql, params)

    async def counted_execute(self: Any, statement: Any, parameters: Any = None) -> Any:
        global statements
        statements += 1
        return await execute(self, statement, parameters)

    async def counted_call(conn: Any, sql: Any, call: Any) -> Any:
        global statements
        statements += 1
        return await driver_call(conn, sql, call)

    sqlite_thread.SqliteConnection.run = counted_run  # type: ignore[method-assign]
    sqlite_thread.SqliteConnection.execute = counted_execute  # type: ignore[method-assign]
    apply._driver_call = counted_call
    direct._driver_call = counted_call  # type: ignore[attr-defined]


async def paced(events: list[dict[str, Any]], rid: str, duration: float) -> Any:
    pause = duration / len(events)
    for ev in events:
        await asyncio.sleep(pause)
        resp = ev.get("response")
        yield {**ev, "response": {**resp, "id": rid}} if resp else ev


async def _backend_cpu(owner: str) -> float:
    """CPU seconds (user + system) of the PostgreSQL backends serving the sink's connections, read
    from /proc (the server runs on this machine): a time, but CPU time, which load changes little."""
    import asyncpg

    conn = await asyncpg.connect(PG_DSN)
    try:
        pids = [
            r[0]
            for r in await conn.fetch(
                "SELECT pid FROM pg_stat_activity WHERE application_name = $1", f"eventguard {owner}"
            )
        ]
    finally:
        await conn.close()
    return _proc_cpu(pids)


def _proc_cpu(pids: list[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


async def _without_sink(args: argparse.Namespace) -> None:
    """The same responses through guard() alone: the baseline the sink's cost is read against."""
    events = stream_events(n_deltas=25)
    async with asyncio.timeout(600 * args.scale):
        async for _ in guard(paced(events, "resp_warm", 0.0), asyncio.Event()):
            pass
        for i in range(args.n):
            async with guard(paced(events, f"resp_{i}", args.duration * args.scale), asyncio.Event()) as g:
                async for _ in g:
                    pass
    print(f"none: {args.n} responses x {len(events)} events, {args.duration * 1000:.0f} ms each, no sink")


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--db", choices=["sqlite", "postgres", "none"], default="sqlite", help="none: no sink")
    p.add_argument("-n", type=int, default=50)
    p.add_argument("--duration", type=float, default=0.06, help="seconds per response")
    p.add_argument("--flush-interval", type=float, default=0.05)
    p.add_argument("--scale", type=float, default=1.0, help="stretch every time by this")
    args = p.parse_args()
    _count_statements()
    tmp = Path(tempfile.mkdtemp(prefix="eg-c13-"))
    schema = None
    if args.db == "none":
        await _without_sink(args)
        return
    if args.db == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp / 'eg.db'}"
    else:
        import asyncpg  # type: ignore[import-untyped]

        schema = f"eg_c13_{uuid.uuid4().hex[:10]}"
        conn = await asyncpg.connect(PG_DSN)
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        await conn.close()
        url = PG_URL
    sink = SqlSink(
        url, schema=schema, spool_path=tmp / "spool.jsonl", flush_interval=args.flush_interval * args.scale
    )
    transactions = 0

    def on_write(_: float) -> None:
        nonlocal transactions
        transactions += 1

    sink.stats.on_write = on_write
    events = stream_events(n_deltas=25)  # created, in_progress, 25 deltas, completed: 28
    try:
        async with asyncio.timeout(600 * args.scale):
            await sink.start()
            # One response to warm up (the connection, prepared statements), not counted.
            async for _ in guard(paced(events, "resp_warm", 0.0), asyncio.Event(), sink=sink):
                pass
            t0, s0, b0, e0 = transactions, statements, sink.stats.batches_written, sink.stats.events_written
            cpu0 = await _backend_cpu(sink.owner) if args.db == "postgres" else 0.0
            for i in range(args.n):
                stream = paced(events, f"resp_{i}", args.duration * args.scale)
                async with guard(stream, asyncio.Event(), sink=sink) as g:
                    async for _ in g:
                        pass
            n = args.n
            backend = ""
            if args.db == "postgres":
                cpu = (await _backend_cpu(sink.owner) - cpu0) / n
                backend = f", PostgreSQL backend CPU {cpu * 1000:.2f} ms per response"
            print(
                f"{args.db}: {n} responses x {len(events)} events, {args.duration * 1000:.0f} ms each, "
                f"flush_interval {args.flush_interval * 1000:.0f} ms (scale {args.scale}): "
                f"{(transactions - t0) / n:.2f} transactions, {(statements - s0) / n:.2f} statements, "
                f"{(sink.stats.batches_written - b0) / n:.2f} batches per response; "
                f"events written {sink.stats.events_written - e0} of {n * len(events)}, "
                f"spooled {sink.stats.batches_spooled}{backend}"
            )
            await sink.aclose()
    finally:
        if schema is not None:
            conn = await asyncpg.connect(PG_DSN)
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
            await conn.close()


if __name__ == "__main__":
    asyncio.run(main())
