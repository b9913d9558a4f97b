"""Resident memory of responses held in flight, measured in a fresh process of its own.

``python -m benchmarks._inflight {bare,sqlite,postgres} STREAMS EVENTS`` opens ``STREAMS`` streams at
once (through the guard and a real ``SqlSink``, or through a bare pass-through layer with no sink),
lets each forward ``EVENTS`` events, then holds them all open (a client still reading, the model not
done). Once every stream is there and the sink has written what it was given, it reads the
process's resident set (``VmRSS``) and the interpreter's live allocated blocks
(``sys.getallocatedblocks()``, cheap, unlike tracemalloc) and prints one JSON object: what the held
streams add, per stream, over the same process just before they were opened. The two differ: the
resident set keeps the peak of what was ever alive at once (the allocator keeps freed arenas, and
the writer's backlog, bounded by ``max_buffered``, is freed once written), the blocks are what is
alive now. With a sink it also says how often the writer fell ``max_buffered`` events behind
(``overflows``) and how many batches it spooled instead of writing.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from eventguard import guard
from eventguard.sink import SqlSink

from ._child import _sink
from ._common import bare, network_stream, script
from ._report import quiet_eventguard_logs


def rss_bytes() -> int:
    """The resident set now (``VmRSS``), in bytes."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


async def hold(
    open_stream: Callable[[int], Any], streams: int, events: int, settle: Callable[[], Awaitable[None]]
) -> dict[str, Any]:
    """Open ``streams`` streams, let each forward ``events`` events, hold them, measure, release."""
    release = asyncio.Event()
    reached = [asyncio.Event() for _ in range(streams)]

    async def one(i: int) -> None:
        async with open_stream(i) as events_iter:
            n = 0
            async for _ in events_iter:
                n += 1
                if n == events:
                    reached[i].set()
                    await release.wait()

    await settle()
    gc.collect()
    before, blocks_before = rss_bytes(), sys.getallocatedblocks()
    tasks = [asyncio.ensure_future(one(i)) for i in range(streams)]
    for ev in reached:
        await ev.wait()
    await settle()  # everything forwarded so far is written: what stays is what the held streams keep
    gc.collect()
    held, blocks_held = rss_bytes(), sys.getallocatedblocks()
    release.set()
    await asyncio.gather(*tasks)
    return {
        "before": before,
        "held": held,
        "per_stream": (held - before) / streams,
        "blocks_per_stream": (blocks_held - blocks_before) / streams,
    }


class _Bare:
    """``async with`` over a bare pass-through layer, shaped like ``guard(...)``."""

    def __init__(self, stream: AsyncIterator[Any]) -> None:
        self._stream = bare(stream)

    async def __aenter__(self) -> AsyncIterator[Any]:
        return self._stream

    async def __aexit__(self, *exc: object) -> None:
        await self._stream.aclose()  # type: ignore[attr-defined]


async def measure(db: str, streams: int, events: int) -> dict[str, Any]:
    # Each stream would go on for ten more events: it is held mid-stream, never at its end.
    def source(i: int) -> AsyncIterator[Any]:
        return network_stream(script(f"h{i}", events + 10))

    if db == "bare":

        async def nothing() -> None:
            await asyncio.sleep(0)

        return await hold(lambda i: _Bare(source(i)), streams, events, nothing)
    async with _sink(db) as (sink, _count):
        s: SqlSink = sink
        async with guard(network_stream(script("warm-up", 500)), asyncio.Event(), sink=s) as g:
            async for _ in g:
                pass
        got = await hold(lambda i: guard(source(i), asyncio.Event(), sink=s), streams, events, s.flush)
        return {**got, "spooled": s.stats.batches_spooled, "overflows": s.stats.overflows}


def main(argv: list[str]) -> None:
    quiet_eventguard_logs()
    db, streams, events = argv[0], int(argv[1]), int(argv[2])
    print(json.dumps(asyncio.run(measure(db, streams, events))))


if __name__ == "__main__":
    main(sys.argv[1:])
