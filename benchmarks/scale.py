"""(5) 1,000 concurrent guarded streams on SQLite and PostgreSQL, and memory per in-flight stream.

Each measurement runs in a fresh process (``benchmarks._child``) so peak RSS is its own. The
baseline is the same streams through a bare pass-through layer with no sink. "Lost" counts events
that are not in the database once the streams ended and the sink flushed (spooled ones included:
they wait in a file for a replay). Memory per in-flight stream is traced (tracemalloc) with the
streams held open after 100 and after 100,000 events each, once everything buffered was written.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from ._common import Row, Sizes, median
from ._sinks import pg_unreachable

NAME = "scale"


async def child(*args: object, module: str = "benchmarks._child") -> dict[str, Any]:
    """Run ``python -m module *args`` and return the JSON object it prints last."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        *map(str, args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{module} {args} failed:\n{err.decode()[-2000:]}")
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


async def run(sizes: Sizes) -> list[Row]:
    s, e = sizes.scale_streams, sizes.scale_events
    pg_why = await pg_unreachable()
    dbs = ["sqlite"] if pg_why else ["sqlite", "postgres"]
    runs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(sizes.reps):
        for db in ["bare", *dbs]:
            runs.setdefault(db, []).append(await child("scale", db, s, e))

    def m(db: str, key: str) -> float:
        return median([float(r[key]) for r in runs[db]])

    rows: list[Row] = []
    label = {"sqlite": "SQLite", "postgres": "PostgreSQL"}
    for db in dbs:
        worst = max(int(r["lost"]) for r in runs[db])
        spooled = max(int(r["spooled"]) for r in runs[db])
        rows += [
            Row(
                "5 scale",
                f"{label[db]}: wall, {s:,} streams x {e} events",
                m(db, "wall"),
                "s",
                "same streams, bare layer, no sink",
                m("bare", "wall"),
            ),
            Row(
                "5 scale",
                f"{label[db]}: peak RSS",
                m(db, "rss"),
                "MiB",
                "same streams, bare layer, no sink",
                m("bare", "rss"),
            ),
            Row(
                "5 scale",
                f"{label[db]}: events not in the database (worst run)",
                float(worst),
                "events",
                direction="<=",
                target=0.0,
                absolute=True,
                note=f"of {s * e:,}; up to {spooled} batches went to the spool instead",
            ),
        ]
    if pg_why:
        rows.append(Row("5 scale", "PostgreSQL", None, "", skipped=pg_why))

    for db in dbs:
        small = [await child("memory", db, sizes.memory_streams, sizes.memory_small)]
        large = [await child("memory", db, sizes.memory_streams, sizes.memory_large)]
        small_b = median([r["per_stream"] for r in small])
        large_b = median([r["per_stream"] for r in large])
        per_event = (large_b - small_b) / (sizes.memory_large - sizes.memory_small)
        rows += [
            Row(
                "5 scale",
                f"{label[db]}: traced memory per in-flight stream at {sizes.memory_large:,} events",
                large_b / 1024,
                "KiB",
                f"same at {sizes.memory_small:,} events",
                small_b / 1024,
                note=f"{sizes.memory_streams} streams held open; one run each (tracemalloc is deterministic)",
            ),
            Row(
                "5 scale",
                f"{label[db]}: memory kept per forwarded event (flat: < 1 B)",
                per_event,
                "B",
                direction="<=",
                target=1.0,
                absolute=True,
                note="a leak of one pointer per event would show as >= 8 B",
            ),
        ]
    return rows
