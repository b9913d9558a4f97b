"""(1) What the guard adds to each event, against one bare ``async for ... yield`` layer.

Every variant drains the same in-memory source of small delta events; the source alone is timed
too and subtracted, so each figure is the cost the layer adds per event.

A second bare layer (the twin) is timed the same way and reported against the first: the ratio two
identical layers show is the measurement's own resolution (an A/A comparison). Its rows carry the
target's direction, so ``--runs K`` keeps its worst run, but no target.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from eventguard import guard

from ._common import Row, Sizes, bare, collect, delta, drain, median, now

NAME = "overhead"
#: Issue 13: the guard costs at most 1.8x one bare pass-through layer per event.
TARGET = 1.8
_POOL = [delta(i) for i in range(1_000)]


async def _source(n: int) -> AsyncIterator[Any]:
    pool = _POOL
    yield {"type": "response.created", "response": {"id": "resp_overhead", "status": "in_progress"}}
    for i in range(n):
        yield pool[i % 1_000]
    yield {"type": "response.completed", "response": {"id": "resp_overhead", "status": "completed"}}


def _variants() -> dict[str, Callable[[AsyncIterator[Any]], Any]]:
    return {
        "source": lambda s: s,
        "bare": bare,
        "guard": lambda s: guard(s, asyncio.Event(), cancel_grace=None),
        "guard_grace": lambda s: guard(s, asyncio.Event(), cancel_grace=10.0),
        # Last, after the guards: it meets what they meet, later in each repetition.
        "bare_twin": bare,
    }


async def run(sizes: Sizes) -> list[Row]:
    n = sizes.overhead_events
    times: dict[str, list[float]] = {}
    for _ in range(sizes.reps):
        for name, wrap in _variants().items():
            collect()
            t = now()
            await drain(wrap(_source(n)))
            times.setdefault(name, []).append(now() - t)
    src = median(times["source"])

    def added_ns(name: str) -> float:
        return (median(times[name]) - src) / n * 1e9

    base = added_ns("bare")
    rows = [
        Row(
            "1 overhead",
            "guard, no sink, cancel_grace=None: added per event",
            added_ns("guard"),
            "ns",
            "bare pass-through layer",
            base,
            "<=",
            TARGET,
            note=f"{n:,} events; source alone {src / n * 1e9:.0f} ns/event, subtracted",
        ),
        Row(
            "1 overhead",
            "guard, no sink, cancel_grace=10: added per event",
            added_ns("guard_grace"),
            "ns",
            "bare pass-through layer",
            base,
            "<=",
            TARGET,
        ),
        Row(
            "1 overhead",
            "a second bare layer (A/A: the measurement's resolution): added per event",
            added_ns("bare_twin"),
            "ns",
            "bare pass-through layer",
            base,
            "<=",
            note="the same layer as the baseline: its distance from 1.0x is noise, not cost",
        ),
    ]
    return rows
