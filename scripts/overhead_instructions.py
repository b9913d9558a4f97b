"""The guard's added cost per event in instructions, not time (issues 12 and 13).

``python -m benchmarks overhead`` divides the guard's added nanoseconds by a bare layer's, and on a
shared machine that baseline moves between runs (53 to 140 ns seen on one machine in one hour), so
its ratio spreads from 1.4x to 2.4x. Instruction counts barely move: this runs each overhead variant
(``benchmarks.overhead._variants()``) under ``valgrind --tool=callgrind`` with 0 and N events, takes
the difference per event, subtracts the source's, and prints the guard's against the bare layer's.

    python scripts/overhead_instructions.py            # N = 50,000; about 4 minutes
    PYTHONPATH=/other/checkout python scripts/overhead_instructions.py   # another commit's guard
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_MODES = ("source", "bare", "guard", "guard_grace")


def _drain_one(mode: str, n: int) -> None:
    from benchmarks._common import drain
    from benchmarks.overhead import _source, _variants

    asyncio.run(drain(_variants()[mode](_source(n))))


def _instructions(mode: str, n: int, out: Path) -> int:
    """Instructions the whole process ran to drain ``n`` events through ``mode``."""
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, __file__]
    env = {**os.environ, "PYTHONHASHSEED": "0"}  # the same dict layouts in every run: counts repeat
    done = subprocess.run([*cmd, "--one", mode, str(n)], capture_output=True, text=True, check=True, env=env)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"callgrind printed no count for {mode} {n}:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=50_000, help="events per measured run (default 50,000)")
    ap.add_argument("--one", nargs=2, metavar=("MODE", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        _drain_one(args.one[0], int(args.one[1]))
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not on PATH", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        per = {}
        for mode in _MODES:
            counts = [_instructions(mode, n, Path(tmp) / f"{mode}-{n}.out") for n in (0, args.n)]
            per[mode] = (counts[1] - counts[0]) / args.n
    bare = per["bare"] - per["source"]
    where = os.environ.get("PYTHONPATH") or "this checkout"
    print(f"bare layer: {bare:.0f} instructions added per event ({where})")
    for mode in ("guard", "guard_grace"):
        added = per[mode] - per["source"]
        print(f"{mode}: {added:.0f} instructions added per event, {added / bare:.3f}x the bare layer")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
