"""One scale or memory measurement in a fresh process, so peak RSS and traced memory are its own.

``python -m benchmarks._child scale {bare,sqlite,postgres} STREAMS EVENTS`` and
``python -m benchmarks._child memory {sqlite,postgres} STREAMS EVENTS`` print one JSON object.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import resource
import sys
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

from eventguard import guard
from eventguard.sink import SqlSink

from ._common import bare, drain, network_stream, now, script
from ._report import quiet_eventguard_logs
from ._sinks import guarded, pg_count, pg_sink, sqlite_count, sqlite_sink


def _peak_rss_mib() -> float:
    # VmHWM starts afresh at exec; ru_maxrss would carry the parent's peak over from the fork.
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@contextlib.asynccontextmanager
async def _sink(db: str) -> AsyncIterator[tuple[SqlSink, Any]]:
    if db == "sqlite":
        async with sqlite_sink() as (sink, path):
            yield sink, lambda: asyncio.sleep(0, sqlite_count(path))
    else:
        async with pg_sink() as (sink, schema):
            yield sink, lambda: pg_count(schema)


async def scale(db: str, streams: int, events: int) -> dict[str, Any]:
    expected = streams * events
    if db == "bare":
        t = now()
        counts = await asyncio.gather(
            *(drain(bare(network_stream(script(f"r{i}", events - 3)))) for i in range(streams))
        )
        wall = now() - t
        return {"wall": wall, "rss": _peak_rss_mib(), "lost": expected - sum(counts), "spooled": 0}
    async with _sink(db) as (sink, count):
        t = now()
        await asyncio.gather(*(guarded(sink, f"r{i}", events) for i in range(streams)))
        await sink.flush()
        wall = now() - t
        stored = await count()
        return {
            "wall": wall,
            "rss": _peak_rss_mib(),
            "lost": expected - stored,
            "spooled": sink.stats.batches_spooled,
        }


async def memory(db: str, streams: int, events: int) -> dict[str, Any]:
    """Traced bytes per stream held open after ``events`` events (written by the sink)."""
    tracemalloc.start(1)
    async with _sink(db) as (sink, _count):
        await guarded(sink, "warm-up", 500)  # statement caches, pools, first-use allocations
        await sink.flush()
        gc.collect()
        base = tracemalloc.get_traced_memory()[0]
        release = asyncio.Event()
        reached = [asyncio.Event() for _ in range(streams)]

        async def one(i: int) -> None:
            async with guard(network_stream(script(f"m{i}", events + 10)), asyncio.Event(), sink=sink) as g:
                n = 0
                async for _ in g:
                    n += 1
                    if n == events:
                        reached[i].set()
                        await release.wait()

        tasks = [asyncio.ensure_future(one(i)) for i in range(streams)]
        for ev in reached:
            await ev.wait()
        await sink.flush()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
        release.set()
        await asyncio.gather(*tasks)
    tracemalloc.stop()
    return {"per_stream": held / streams}


def main(argv: list[str]) -> None:
    quiet_eventguard_logs()
    what, db, streams, events = argv[0], argv[1], int(argv[2]), int(argv[3])
    fn = scale if what == "scale" else memory
    print(json.dumps(asyncio.run(fn(db, streams, events))))


if __name__ == "__main__":
    main(sys.argv[1:])
