"""``python -m benchmarks``: every measurement of issue 5, one table, non-zero exit on a miss.

Options: ``--quick`` (tiny sizes, a smoke test: the figures mean nothing), ``--only NAME``
(repeatable: overhead, sqlite, postgres, latency, scale, peer, provider), ``--reps N``, ``--out PATH``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from . import latency, overhead, peer, provider, scale, throughput
from ._common import Row, Sizes, now
from ._report import quiet_eventguard_logs, text, write_results

MEASUREMENTS: dict[str, Callable[[Sizes], Coroutine[Any, Any, list[Row]]]] = {
    "overhead": overhead.run,
    "sqlite": throughput.run_sqlite,
    "postgres": throughput.run_pg,
    "latency": latency.run,
    "scale": scale.run,
    "peer": peer.run,
    "provider": provider.run,
}
RESULTS = Path(__file__).with_name("RESULTS.md")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one repetition: a smoke test")
    ap.add_argument("--only", action="append", choices=sorted(MEASUREMENTS), help="run only these")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default 5; 1 with --quick)")
    ap.add_argument("--out", type=Path, default=None, help="where to write the table (default RESULTS.md)")
    args = ap.parse_args(argv)

    sizes = Sizes.quick() if args.quick else Sizes()
    if args.reps is not None:
        sizes = dataclasses.replace(sizes, reps=max(1, args.reps))
    names = args.only or list(MEASUREMENTS)
    logs = quiet_eventguard_logs()
    rows: list[Row] = []
    start = now()
    for name in names:
        t = now()
        print(f"running {name} ...", file=sys.stderr, flush=True)
        rows += asyncio.run(MEASUREMENTS[name](sizes))
        print(f"  {name}: {now() - t:.0f} s", file=sys.stderr, flush=True)
    seconds = now() - start

    print(text(rows))
    out = args.out
    if out is None and not args.quick:
        out = RESULTS
    if out is not None:
        command = "python -m benchmarks" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
        write_results(out, rows, command, seconds, logs)
        print(f"\nwritten to {out}", file=sys.stderr)
    misses = [r for r in rows if r.ok is False]
    if misses:
        print(f"\n{len(misses)} target(s) missed: " + "; ".join(f"{r.item}: {r.what}" for r in misses))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
