"""What the cyclic garbage collector costs the 1,000 x 20 benchmark, with and without ``gc.freeze()``.

``python -m benchmarks sqlite`` (and ``postgres``) runs 1,000 guarded 20-event streams through one
``SqlSink`` at once. With 1,000 streams in flight, each holding about 60 objects the collector
tracks, their promotions trigger full collections, which walk the whole heap (the imported
libraries' objects included). ``gc.freeze()`` once the imports are done moves that startup heap to a
generation the collector skips; a server can call it, eventguard does not (the collector's settings
are the application's). This alternates the two in one process, each round on a fresh database, and
prints the raw driver's time, the sink's, and how many full collections ran during the sink's:

    python scripts/short_responses_gc.py                  # SQLite, 4 rounds
    python scripts/short_responses_gc.py --db postgresql --rounds 6
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time

from benchmarks._sinks import guarded, pg_sink, pg_unreachable, sqlite_sink
from benchmarks.throughput import _raw_pg_short, _raw_sqlite_short

_STREAMS = 1_000
_EVENTS = 20


async def _round(db: str, freeze: bool) -> tuple[float, float, int]:
    """The raw driver's seconds, the sink's seconds and the full collections during the sink's run."""
    gc.collect()
    gc.collect()
    if freeze:
        gc.freeze()
    try:
        make = sqlite_sink if db == "sqlite" else pg_sink
        raw_short = _raw_sqlite_short if db == "sqlite" else _raw_pg_short
        async with make() as (_sink, where):
            raw = await raw_short(where, _STREAMS, _EVENTS)  # type: ignore[arg-type]
        async with make() as (sink, _where):
            full_before = gc.get_stats()[2]["collections"]
            start = time.perf_counter()
            await asyncio.gather(*(guarded(sink, f"r{i}", _EVENTS) for i in range(_STREAMS)))
            await sink.flush()
            took = time.perf_counter() - start
            full = gc.get_stats()[2]["collections"] - full_before
        return raw, took, full
    finally:
        if freeze:
            gc.unfreeze()


async def _main(db: str, rounds: int) -> None:
    if db == "postgresql":
        why = await pg_unreachable()
        if why is not None:
            raise SystemExit(f"PostgreSQL: {why}")
    for _ in range(rounds):
        for freeze in (False, True):
            raw, took, full = await _round(db, freeze)
            print(
                f"{db:10} gc.freeze() {'yes' if freeze else 'no ':3}  raw {raw:.3f} s  sink {took:.3f} s  "
                f"ratio {raw / took:.2f}x  full collections {full}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    asyncio.run(_main(args.db, args.rounds))


if __name__ == "__main__":
    main()
