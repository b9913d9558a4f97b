"""How close any in-process sink can come to the raw driver on the long-stream benchmark (issue 13).

``python -m benchmarks sqlite`` sets ``guard + SqlSink`` on one 100,000-event stream against raw
``sqlite3`` writing the same rows, and asks for 0.7x. This measures, in one run, on the same
stream and table, the figure of a sink that does the least any sink must:

- **ideal**: the guard without a sink, one ``list.append`` per event on the event loop, and a
  thread that, every ``--batch`` events, serialises them with orjson and inserts them in one
  transaction (``INSERT ... SELECT FROM json_each(?)``, ``executemany``, or multi-row ``VALUES`` in
  the sink's own power-of-two pieces, :func:`eventguard.sink.apply.sqlite_pieces`). No storable checks,
  no lifecycle rows, no spool, no budget on how long the thread holds the GIL;
- **SqlSink**: the real sink, as the benchmark runs it;
- **raw**: the benchmark's own baseline (:func:`benchmarks.throughput._raw_sqlite`).

Both the event loop and the writer thread need the GIL for every Python step, so the stream and
its writes are not parallel on two cores, and the ideal is the ceiling for this design:

    python scripts/sink_ceiling.py                 # 3 rounds, batches of 500 and 5,000
    python scripts/sink_ceiling.py --rounds 5 --batch 500 --batch 20000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import queue
import sqlite3
import tempfile
import threading
import time
from itertools import chain
from pathlib import Path
from typing import Any

import orjson

from benchmarks._common import network_stream, script
from benchmarks._sinks import timed_guarded
from benchmarks.throughput import _raw_sqlite
from eventguard import guard
from eventguard.sink import SqlSink
from eventguard.sink.apply import sqlite_pieces

_COLUMNS = "response_id, attempt, seq, type, payload, recorded_at"
_JSON_EACH = (
    f"INSERT INTO eventguard_events ({_COLUMNS}) SELECT "
    + ", ".join(f"json_extract(value, '$[{i}]')" for i in range(6))
    + " FROM json_each(?) WHERE true ON CONFLICT DO NOTHING"
)
_MANY = f"INSERT INTO eventguard_events ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
METHODS = ("json_each", "executemany", "values")


def _values(n: int) -> str:
    rows = ", ".join(["(?, ?, ?, ?, ?, ?)"] * n)
    return f"INSERT INTO eventguard_events ({_COLUMNS}) VALUES {rows} ON CONFLICT DO NOTHING"


async def _database(directory: Path) -> Path:
    """A database made by the sink's own migration, with the response row the events refer to."""
    path = directory / "ceiling.db"
    sink = SqlSink(f"sqlite+aiosqlite:///{path}", spool_path=directory / "spool.jsonl")
    await sink.start()
    await sink.aclose()
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute(
            "INSERT INTO eventguard_responses (response_id, status, updated_at) "
            "VALUES ('resp_ideal', 'in_progress', '2026-01-01 00:00:00')"
        )
    return path


class _IdealWriter:
    """A thread that serialises and inserts each batch handed to it, in one transaction."""

    def __init__(self, path: Path, method: str) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        for pragma in ("journal_mode = WAL", "synchronous = NORMAL", "foreign_keys = ON"):
            self._conn.execute(f"PRAGMA {pragma}")
        self._method = method
        self._batches: queue.SimpleQueue[list[tuple[int, str, Any]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name="ideal writer")
        self._thread.start()

    def hand_over(self, batch: list[tuple[int, str, Any]]) -> None:
        self._batches.put(batch)

    async def close(self) -> None:
        self._batches.put(None)
        await asyncio.to_thread(self._thread.join)
        self._conn.close()

    def _work(self) -> None:
        at = "2026-01-01 00:00:00"
        dumps = orjson.dumps
        while (batch := self._batches.get()) is not None:
            rows = [("resp_ideal", 1, seq, etype, dumps(ev).decode(), at) for seq, etype, ev in batch]
            self._conn.execute("BEGIN IMMEDIATE")
            if self._method == "executemany":
                self._conn.executemany(_MANY, rows)
            elif self._method == "values":
                for piece in sqlite_pieces(rows):
                    self._conn.execute(_values(len(piece)), list(chain.from_iterable(piece))).close()
            else:
                self._conn.execute(_JSON_EACH, (dumps(rows).decode(),)).close()
            self._conn.execute("COMMIT")


async def _ideal(directory: Path, n: int, batch_size: int, method: str) -> float:
    writer = _IdealWriter(await _database(directory), method)
    t = time.perf_counter()
    batch: list[tuple[int, str, Any]] = []
    seq = 0
    async with guard(network_stream(script("resp_ideal", n - 3)), asyncio.Event(), cancel_grace=None) as g:
        async for ev in g:
            batch.append((seq, ev["type"], ev))
            seq += 1
            if len(batch) >= batch_size:
                writer.hand_over(batch)
                batch = []
    writer.hand_over(batch)
    await writer.close()
    return n / (time.perf_counter() - t)


async def _sqlsink(directory: Path, n: int) -> float:
    path = directory / "sink.db"
    sink = SqlSink(f"sqlite+aiosqlite:///{path}", spool_path=directory / "sink-spool.jsonl")
    await sink.start()
    try:
        return n / await timed_guarded(sink, "resp_sink", n)
    finally:
        await sink.aclose()


async def _raw(directory: Path, n: int) -> float:
    return n / await _raw_sqlite(await _database(directory), "resp_raw", list(script("resp_raw", n - 3)))


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=100_000, help="events in the stream (default 100,000)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, action="append", help="events per ideal transaction (repeatable)")
    args = ap.parse_args()
    batches = args.batch or [500, 5_000]
    for r in range(args.rounds):
        figures: list[str] = []
        with tempfile.TemporaryDirectory(prefix="eg-ceiling-") as d:
            raw = await _raw(_fresh(d, "raw"), args.n)
            for size in batches:
                for method in METHODS:
                    rate = await _ideal(_fresh(d, f"ideal-{size}-{method}"), args.n, size, method)
                    figures.append(f"ideal {method} /{size:,}: {rate / raw:.2f}x")
            figures.append(f"SqlSink: {await _sqlsink(_fresh(d, 'sink'), args.n) / raw:.2f}x")
        print(f"round {r + 1}: raw sqlite3 {raw:,.0f} ev/s; " + "; ".join(figures), flush=True)


def _fresh(parent: str, name: str) -> Path:
    """A new directory of its own for each measurement: every database starts empty."""
    path = Path(parent) / name
    path.mkdir()
    return path


if __name__ == "__main__":
    asyncio.run(main())
