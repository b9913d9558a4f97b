"""What one SQLite write transaction costs a thread that has just been idle (issue 13).

At concurrency 1 the sink's writer thread waits between responses, and each response's
transaction is the first thing it runs after the wait. This times, in CPU time of the thread that
runs it, the sink's kind of transaction (``BEGIN IMMEDIATE``, a response row, 25 events in the
statements the sink uses for them, ``COMMIT``) on the sink's own schema, run back to back and
after the thread slept ``--pauses`` milliseconds before each. The statements are the same every
time; only what the caches and the core still hold of them differs.

    python scripts/sqlite_cold_writer.py                   # pauses of 0, 2 and 20 ms, 200 each
    python scripts/sqlite_cold_writer.py --pauses 0 50 --transactions 100
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sqlite3
import tempfile
import time
from itertools import chain, count
from pathlib import Path

import orjson

from eventguard.sink import SqlSink

#: Events per transaction: the deltas of a 28-event response, in the pieces the sink writes them.
_PIECES = (16, 8, 1)
_COLUMNS = "response_id, attempt, seq, type, payload, recorded_at"
_AT = "2026-12-06 10:00:00.000000"
#: Response ids: every transaction writes a new response.
_IDS = count()


def _insert(n: int) -> str:
    rows = ", ".join(["(?, ?, ?, ?, ?, ?)"] * n)
    return f"INSERT INTO eventguard_events ({_COLUMNS}) VALUES {rows} ON CONFLICT DO NOTHING"


def _transaction(conn: sqlite3.Connection, rid: str) -> float:
    """One transaction of ``rid``; the CPU seconds of ``BEGIN IMMEDIATE`` alone."""
    t = time.thread_time()
    conn.execute("BEGIN IMMEDIATE")
    begin = time.thread_time() - t
    conn.execute(
        "INSERT INTO eventguard_responses (response_id, status, updated_at) VALUES (?, 'in_progress', ?)",
        (rid, _AT),
    )
    seq = 0
    for n in _PIECES:
        rows = [
            (rid, 1, seq + i, "response.output_text.delta", orjson.dumps({"delta": f"d{i}"}).decode(), _AT)
            for i in range(n)
        ]
        conn.execute(_insert(n), tuple(chain.from_iterable(rows)))
        seq += n
    conn.execute("COMMIT")
    return begin


def _measure(conn: sqlite3.Connection, pause_ms: float, n: int) -> tuple[float, float]:
    """Median CPU seconds of ``BEGIN IMMEDIATE`` and of the whole transaction, each after a pause."""
    begins: list[float] = []
    wholes: list[float] = []
    for _ in range(n):
        if pause_ms:
            time.sleep(pause_ms / 1000)
        t = time.thread_time()
        begins.append(_transaction(conn, f"r{next(_IDS)}"))
        wholes.append(time.thread_time() - t)
    return sorted(begins)[n // 2], sorted(wholes)[n // 2]


async def _schema(path: Path) -> None:
    sink = SqlSink(f"sqlite+aiosqlite:///{path}", spool_path=path.with_suffix(".spool"))
    await sink.start()
    await sink.aclose()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pauses", type=float, nargs="+", default=[0.0, 2.0, 20.0], help="milliseconds")
    ap.add_argument("--transactions", type=int, default=200, help="per pause (default 200)")
    args = ap.parse_args()
    if not 1 <= args.transactions <= 100_000:
        ap.error("--transactions: from 1 to 100000")
    if not all(0 <= p <= 10_000 for p in args.pauses):  # NaN fails every comparison: refused too
        ap.error("--pauses: each from 0 to 10000 milliseconds")
    with tempfile.TemporaryDirectory(prefix="eg-cold-") as d:
        path = Path(d) / "cold.db"
        asyncio.run(_schema(path))
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
            for pragma in ("journal_mode = WAL", "synchronous = NORMAL", "foreign_keys = ON"):
                conn.execute(f"PRAGMA {pragma}")
            _measure(conn, 0.0, 20)  # statements prepared, pages read: first-use costs, not measured
            print(f"thread CPU per transaction (median of {args.transactions}), {sum(_PIECES)} events each:")
            for pause in args.pauses:
                begin, whole = _measure(conn, pause, args.transactions)
                print(f"  after {pause:g} ms idle: BEGIN IMMEDIATE {begin * 1e6:.1f} us,", end=" ")
                print(f"the whole transaction {whole * 1e6:.0f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
