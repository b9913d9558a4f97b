"""How long ``eventguard verify`` takes on 10,000 responses / 100,000 events (SQLite).

Usage::

    python scripts/verify_scale.py [DB] [--responses N] [--profile]

Fills ``DB`` (default ``/tmp/eventguard-verify-scale.db``; kept, and reused when it already holds
``N`` responses) through the real guard and ``SqlSink``: N scripted responses of 10 events each
(created, in_progress, 8 text deltas, completed; every 10th one failed after 3 events instead, every
25th a cancelled one whose stream claimed completed), then times :func:`eventguard.verify.verify`
on it, best of three, and prints the seconds. ``--profile`` runs verify once under cProfile and
prints the 25 costliest functions by cumulative time.

The issue's target is under 5 s for 10,000 responses on SQLite. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import logging
import pstats
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from eventguard import guard
from eventguard.sink import SqlSink
from eventguard.store import ResponseStore
from eventguard.verify import verify


class _Context:
    """Stands in for the host's ResponseContext: the cause flags the guard reads."""

    def __init__(self, *, client_cancelled: bool) -> None:
        self.client_cancelled = client_cancelled
        self.shutdown = asyncio.Event()


def _script(rid: str, i: int) -> list[dict[str, Any]]:
    def life(etype: str, status: str) -> dict[str, Any]:
        return {"type": etype, "response": {"id": rid, "status": status}}

    head = [life("response.created", "queued"), life("response.in_progress", "in_progress")]
    delta = {"type": "response.output_text.delta", "delta": "some words ", "output_index": 0}
    if i % 10 == 9:
        return [*head, life("response.failed", "failed")]
    return [*head, *([delta] * 8), life("response.completed", "completed")]


async def fill(url: str, n: int) -> None:
    sink = SqlSink(url, spool_path=Path("/tmp/eventguard-verify-scale.spool.jsonl"))
    await sink.start()
    try:
        for i in range(n):
            rid = f"resp_{i:06d}"
            cancelled = i % 25 == 24
            signal = asyncio.Event()
            if cancelled:
                signal.set()

            script = _script(rid, i)

            async def stream(events: list[dict[str, Any]] = script) -> AsyncIterator[Any]:
                for e in events:
                    yield e

            ctx = _Context(client_cancelled=cancelled)
            async with guard(stream(), signal, context=ctx, sink=sink, cancel_grace=None) as g:
                async for _ in g:
                    pass
    finally:
        await sink.aclose()


def _stored(path: Path) -> int:
    if not path.exists():
        return -1
    try:
        with sqlite3.connect(path) as conn:
            return int(conn.execute("SELECT count(*) FROM eventguard_responses").fetchone()[0])
    except sqlite3.Error:
        return -1


async def _verify(url: str) -> float:
    async with ResponseStore(url) as store:
        started = time.perf_counter()
        report = await verify(store)
        took = time.perf_counter() - started
    if not report.ok or report.checked == 0:
        raise SystemExit(f"verify found {report.disagreeing} disagreeing of {report.checked}")
    return took


def main() -> None:
    logging.getLogger("eventguard.anomaly").setLevel(logging.ERROR)  # 400 corrected cancels: no lines
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("db", nargs="?", default="/tmp/eventguard-verify-scale.db")
    parser.add_argument("--responses", type=int, default=10_000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    path = Path(args.db)
    url = f"sqlite:///{path}"
    if _stored(path) != args.responses:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        started = time.perf_counter()
        asyncio.run(fill(url, args.responses))
        print(f"filled {args.responses:,} responses in {time.perf_counter() - started:.1f} s")
    with sqlite3.connect(path) as conn:
        events = conn.execute("SELECT count(*) FROM eventguard_events").fetchone()[0]
    print(f"{args.responses:,} responses, {events:,} events in {path}")
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        asyncio.run(_verify(url))
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
        return
    runs = [asyncio.run(_verify(url)) for _ in range(3)]
    print(f"verify: best {min(runs):.2f} s of {', '.join(f'{r:.2f}' for r in runs)}")


if __name__ == "__main__":
    main()
