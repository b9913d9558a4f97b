"""(1) What the guard adds to each event, against one bare ``async for ... yield`` layer.

Every variant drains the same in-memory source of small delta events; the source alone is timed
too and subtracted, so each figure is the cost the layer adds per event.

Each drain is timed in the process's CPU time, not the wall clock: the layers run on one thread and
never wait, so their CPU time is their cost, and a busy machine's preemption (``--load``) is not
counted in it. Repetitions are many and short (five times ``Sizes.reps``), every variant once in
each, the order rotating from one to the next; a ratio is the median of the repetitions' own ratios
(as the host part's are of its rounds'), so what drifts over seconds (a noisy neighbour, the clock
speed) falls on both sides of each ratio alike. The wall clock, a fixed order and the ratio of five
long repetitions' medians read the A/A row below at 0.66-2.40x beside two busy processes and
0.95-1.14x quiet; this way it read 0.95-1.04x (2026-12-06, AMD EPYC, 2 cores, eight runs).

A second bare layer (the twin) is timed the same way and reported against the first: the ratio two
identical layers show is the measurement's own resolution (an A/A comparison). Its rows carry the
target's direction, so ``--runs K`` keeps its worst run, but no target.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from eventguard import guard

from ._common import Row, Sizes, bare, collect, delta, drain, median

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
        # The same layer as "bare", timed as a variant of its own: the measurement's resolution.
        "bare_twin": bare,
    }


#: Repetitions per ``Sizes.reps``: the medians are of many short drains rather than a few long ones.
REPS_PER_REP = 5


async def run(sizes: Sizes) -> list[Row]:
    n = sizes.overhead_events
    variants = list(_variants().items())
    times: dict[str, list[float]] = {name: [] for name, _ in variants}
    for rep in range(sizes.reps * REPS_PER_REP):
        k = rep % len(variants)
        for name, wrap in variants[k:] + variants[:k]:
            collect()
            t = time.process_time()
            await drain(wrap(_source(n)))
            times[name].append(time.process_time() - t)
    src = median(times["source"])

    def added_ns(name: str) -> float:
        return (median(times[name]) - src) / n * 1e9

    def paired(name: str) -> float | None:
        """The median, over the repetitions, of what ``name`` added against what the bare layer added
        (None if the bare layer never took longer than the source: a run too short to tell)."""
        reps = zip(times[name], times["bare"], times["source"], strict=True)
        ratios = [(t - s) / (b - s) for t, b, s in reps if b > s]
        return median(ratios) if ratios else None

    base = added_ns("bare")
    return [
        Row(
            "1 overhead",
            "guard, no sink, cancel_grace=None: added per event",
            added_ns("guard"),
            "ns",
            "bare pass-through layer",
            base,
            "<=",
            TARGET,
            paired=paired("guard"),
            note=(
                f"{n:,} events, {len(times['source'])} repetitions in CPU time, each ratio the median of "
                f"theirs; source alone {src / n * 1e9:.0f} ns/event, subtracted"
            ),
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
            paired=paired("guard_grace"),
        ),
        Row(
            "1 overhead",
            "a second bare layer (A/A: the measurement's resolution): added per event",
            added_ns("bare_twin"),
            "ns",
            "bare pass-through layer",
            base,
            "<=",
            paired=paired("bare_twin"),
            note="the same layer as the baseline: its distance from 1.0x is noise, not cost",
        ),
    ]
