"""(8) 1,000 responses held in flight at once: resident memory per response, and whether it stays flat.

Each measurement is a fresh process (``benchmarks._inflight``): the streams are opened together,
each forwards N events, and all are held open while the process's resident set and its live
allocated blocks are read. The baseline is the same streams through a bare pass-through layer with
no sink. "Flat" is judged on live blocks (what stays alive per forwarded event, per response); the
resident set is reported beside it, because it also keeps the peak of the sink's backlog (events
waiting for the writer, bounded by ``max_buffered``), which the allocator does not hand back.

1,000 responses x 100,000 events each is 10^8 rows: hours on two cores. The full mode holds 1,000
responses at 100 and at 1,000 events; ``scale`` traces 4 streams to 100,000 events with tracemalloc.
"""

from __future__ import annotations

from typing import Any

from ._common import Row, Sizes
from ._sinks import pg_unreachable
from .scale import child

NAME = "memory"
ITEM = "8 memory"
LABEL = {"sqlite": "SQLite", "postgres": "PostgreSQL"}


async def run(sizes: Sizes) -> list[Row]:
    n, small, large = sizes.inflight_streams, sizes.inflight_small, sizes.inflight_large
    pg_why = await pg_unreachable()
    dbs = ["sqlite"] if pg_why else ["sqlite", "postgres"]
    got: dict[tuple[str, int], dict[str, Any]] = {}
    for db in ["bare", *dbs]:
        for events in (small, large):
            got[db, events] = await child(db, n, events, module="benchmarks._inflight")
    rows: list[Row] = []
    for db in dbs:
        for events in (small, large):
            rows.append(
                Row(
                    ITEM,
                    f"{LABEL[db]}: resident memory per in-flight response, {n:,} held at {events:,} events",
                    got[db, events]["per_stream"] / 1024,
                    "KiB",
                    "same streams, bare layer, no sink",
                    got["bare", events]["per_stream"] / 1024,
                )
            )
        span = large - small
        rss_slope = (got[db, large]["per_stream"] - got[db, small]["per_stream"]) / span
        blocks_slope = (got[db, large]["blocks_per_stream"] - got[db, small]["blocks_per_stream"]) / span
        rows += [
            Row(
                ITEM,
                f"{LABEL[db]}: live blocks kept per forwarded event, per response (flat: < 0.1)",
                blocks_slope,
                "blocks",
                direction="<=",
                target=0.1,
                absolute=True,
                note=f"{got[db, small]['blocks_per_stream']:.0f} -> {got[db, large]['blocks_per_stream']:.0f}"
                f" live blocks per response from {small:,} to {large:,} events; a leak of one object per "
                f"event shows as >= 1; the writer fell max_buffered behind {got[db, large]['overflows']} "
                f"times and spooled {got[db, large]['spooled']:,} batches at {large:,} events "
                f"({got[db, small]['overflows']} / {got[db, small]['spooled']:,} at {small:,})",
            ),
            Row(
                ITEM,
                f"{LABEL[db]}: resident memory added per forwarded event, per response",
                rss_slope,
                "B",
                note="the resident set keeps the peak of the writer's backlog (freed once written, "
                "bounded by max_buffered), so it grows with the events in flight at once, not per event kept",
            ),
        ]
    if pg_why:
        rows.append(Row(ITEM, "PostgreSQL", None, "", skipped=pg_why))
    return rows
