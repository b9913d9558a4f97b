"""``python -m benchmarks [PART ...]``: every measurement of issues 5 and 13, one table, exit 1 on a miss.

Parts (all when none is named; ``--only NAME`` is the same, repeatable): overhead, sqlite, postgres,
latency, scale, peer, host, memory, provider. Options: ``--quick`` (tiny sizes, a smoke test: the
figures mean nothing), ``--reps N``, ``--out PATH``, ``--load N`` (N busy processes compete for
the CPU while the parts run), ``--runs K`` (the parts K times; the table keeps each figure's
worst run), ``--host-rounds N`` and ``--host-responses N`` (the host part's interleaved rounds, and
its responses per round at concurrency 1; four times as many at 16).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from . import host, latency, memory, overhead, peer, provider, scale, throughput
from ._common import Row, Sizes, now
from ._load import busy_processes
from ._report import quiet_eventguard_logs, text, write_results
from ._runs import worst

MEASUREMENTS: dict[str, Callable[[Sizes], Coroutine[Any, Any, list[Row]]]] = {
    "overhead": overhead.run,
    "sqlite": throughput.run_sqlite,
    "postgres": throughput.run_pg,
    "latency": latency.run,
    "scale": scale.run,
    "peer": peer.run,
    "host": host.run,
    "memory": memory.run,
    "provider": provider.run,
}
RESULTS = Path(__file__).with_name("RESULTS.md")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one repetition: a smoke test")
    ap.add_argument("parts", nargs="*", metavar="PART", help=f"run only these: {', '.join(MEASUREMENTS)}")
    ap.add_argument("--only", action="append", choices=sorted(MEASUREMENTS), help="run only these")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default 5; 1 with --quick)")
    ap.add_argument("--out", type=Path, default=None, help="where to write the table (default RESULTS.md)")
    ap.add_argument("--load", type=int, default=0, help="busy processes competing for the CPU (default 0)")
    ap.add_argument("--runs", type=int, default=1, help="run the parts K times, keep each figure's worst run")
    ap.add_argument(
        "--host-rounds", type=int, default=None, help="interleaved rounds of the host part (default 8)"
    )
    ap.add_argument(
        "--host-responses",
        type=int,
        default=None,
        help="responses per round of the host part at concurrency 1 (16: four times as many; default 40)",
    )
    args = ap.parse_args(argv)
    unknown = sorted(set(args.parts) - set(MEASUREMENTS))
    if unknown:
        ap.error(f"no such part: {', '.join(unknown)} (parts: {', '.join(MEASUREMENTS)})")

    sizes = Sizes.quick() if args.quick else Sizes()
    if args.reps is not None:
        sizes = dataclasses.replace(sizes, reps=max(1, args.reps))
    if args.host_rounds is not None:
        # A busy shared machine makes a round take minutes: fewer rounds, more runs.
        sizes = dataclasses.replace(sizes, host_rounds=max(1, args.host_rounds))
    if args.host_responses is not None:
        # Longer rounds average more of the machine's noise into each per-round ratio.
        n = max(1, args.host_responses)
        sizes = dataclasses.replace(sizes, host_responses_c1=n, host_responses_c16=4 * n)
    names = [*args.parts, *(args.only or [])] or list(MEASUREMENTS)
    logs = quiet_eventguard_logs()
    runs: list[list[Row]] = []
    start = now()
    with busy_processes(args.load):
        for k in range(max(args.runs, 1)):
            rows: list[Row] = []
            for name in names:
                t = now()
                print(f"running {name} (run {k + 1}, load {args.load}) ...", file=sys.stderr, flush=True)
                rows += asyncio.run(MEASUREMENTS[name](sizes))
                print(f"  {name}: {now() - t:.0f} s", file=sys.stderr, flush=True)
            runs.append(rows)
    rows = worst(runs)
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
