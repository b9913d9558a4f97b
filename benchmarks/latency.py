"""(4) What the sink adds to the client's stream: per-event latency with and without it.

The client times each ``__anext__`` of a guarded, socket-like stream (one loop turn per event).
With the sink, the writer task shares the loop: whatever it does synchronously (collecting,
serialising, building statements) shows up here as latency added to the client's events.
"""

from __future__ import annotations

import asyncio
import statistics
from typing import Any

from eventguard import guard
from eventguard.sink import SqlSink

from ._common import Row, Sizes, collect, median, network_stream, now, script
from ._sinks import sqlite_sink

NAME = "latency"


async def _latencies(n: int, sink: SqlSink | None) -> list[float]:
    lat: list[float] = []
    g = guard(network_stream(script("resp_latency", n - 3)), asyncio.Event(), sink=sink)
    async with g:
        it = g.__aiter__()
        while True:
            t = now()
            try:
                await it.__anext__()
            except StopAsyncIteration:
                break
            lat.append(now() - t)
    return lat


def _pct(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] * 1e6


async def run(sizes: Sizes) -> list[Row]:
    n = sizes.latency_events
    p: dict[str, list[float]] = {}
    for _ in range(sizes.reps):
        collect()
        without = await _latencies(n, None)
        collect()
        async with sqlite_sink() as (sink, _path):
            with_sink = await _latencies(n, sink)
        for key, xs in (("without", without), ("with", with_sink)):
            p.setdefault(f"{key}50", []).append(_pct(xs, 50))
            p.setdefault(f"{key}99", []).append(_pct(xs, 99))
    m: dict[str, Any] = {k: median(v) for k, v in p.items()}
    return [
        Row(
            "4 latency",
            "p50 per event, guard + SqlSink (SQLite)",
            m["with50"],
            "us",
            "guard without sink",
            m["without50"],
            note=f"{n:,} events per run; added at p50: {m['with50'] - m['without50']:.1f} us",
        ),
        Row(
            "4 latency",
            "p99 per event, guard + SqlSink (SQLite)",
            m["with99"],
            "us",
            "guard without sink",
            m["without99"],
        ),
        Row(
            "4 latency",
            "p99 added by the sink (target <= 50 us)",
            m["with99"] - m["without99"],
            "us",
            direction="<=",
            target=50.0,
            absolute=True,
        ),
    ]
