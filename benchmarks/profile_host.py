"""Where a guarded server's CPU goes: py-spy on the host benchmark's server processes.

``python -m benchmarks.profile_host [--rounds N] [--out PATH] [--keep DIR]`` starts the host benchmark's
servers (``benchmarks.host``), attaches ``py-spy record`` to each (raw collapsed stacks, every thread, active
samples only: time on the CPU, not waiting), runs the same interleaved rounds at concurrency 1
and 16, stops the samplers and writes ``benchmarks/PROFILE.md``: per variant, the functions with the
most own time (the frame on top of the stack), the share of samples with eventguard's code anywhere
on the stack, and the same by thread (the event loop, the aiosqlite thread, ...). ``--keep DIR`` keeps
py-spy's raw files; ``--fold DIR`` summarises kept ones again without recording.

py-spy is a tool, not a dependency of eventguard: ``pip install py-spy`` (it needs to ptrace the
server, which a container may forbid). It samples ``--nonblocking``: a sampler that pauses the
process reads every paused thread as running, so threads blocked on a queue or a read (the
executor's workers, aiosqlite's idle thread) showed up as busy; without pausing they read as idle.
That excludes native frames (py-spy cannot unwind them without pausing): time in sqlite3, orjson or
asyncpg's C code shows on the Python function that called it.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import signal
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from ._common import Sizes, machine
from ._sinks import pg_unreachable
from .host import CONCURRENCY, LABEL, measure, servers

OUT = Path(__file__).with_name("PROFILE.md")
TOP = 20


@dataclass
class Profile:
    """One process's samples, folded."""

    total: int = 0
    #: Samples in the benchmark's own reset route (emptying the state folder), left out of ``total``.
    harness: int = 0
    own: Counter[str] = field(default_factory=Counter)
    packages: Counter[str] = field(default_factory=Counter)
    eventguard_inclusive: Counter[str] = field(default_factory=Counter)
    threads: Counter[str] = field(default_factory=Counter)
    eventguard: int = 0
    eventguard_by_thread: Counter[str] = field(default_factory=Counter)


def _short(frame: str) -> str:
    """``func (path/to/site-packages/pkg/mod.py)`` -> ``func (pkg/mod.py)``."""
    m = re.match(r"^(?P<fn>.*) \((?P<file>[^()]*)\)$", frame)
    if not m:
        return frame
    path = m["file"]
    for marker in ("site-packages/", "/lib/python3.", "/wt-bench/", "/main/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            if marker == "/lib/python3.":
                path = "stdlib/" + path.split("/", 1)[-1]
            break
    return f"{m['fn']} ({path})"


def package(short: str) -> str:
    """The package a shortened frame belongs to (``stdlib/json``, ``sqlalchemy``, ``eventguard/sink``)."""
    m = re.match(r"^.* \((?P<file>[^()]*)\)$", short)
    if not m:
        return "(other)"
    parts = m["file"].split("/")
    if parts[0] in ("stdlib", "eventguard") and len(parts) > 2:
        return "/".join(parts[:2])
    if parts[0].startswith("<frozen"):
        return "stdlib"
    return parts[0] if len(parts) > 1 else "(other)"


def thread_name(first: str) -> str:
    """py-spy's thread frame (``thread (24665): MainThread``) without its id: ``MainThread``."""
    return re.sub(r"^thread \((?:0x)?[0-9A-Fa-f]+\):?\s*", "", first).strip() or "(unnamed thread)"


def fold(raw: str) -> Profile:
    """Fold py-spy's raw output (``frame;frame;... count`` per line) into own time and shares."""
    prof = Profile()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        if any("add_bench_routes.<locals>.reset" in f for f in frames):
            prof.harness += n
            continue
        thread = thread_name(frames[0])
        prof.total += n
        prof.threads[thread] += n
        top = _short(frames[-1])
        prof.own[top] += n
        prof.packages[package(top)] += n
        mine = {_short(f) for f in frames[1:] if "eventguard/" in f and "eventguard/testing/" not in f}
        if mine:
            prof.eventguard += n
            prof.eventguard_by_thread[thread] += n
            for fn in mine:
                prof.eventguard_inclusive[fn] += n
    return prof


def pct(n: int, total: int) -> str:
    return f"{100 * n / total:.1f} %" if total else "-"


def section(variant: str, prof: Profile) -> list[str]:
    lines = [
        f"### {LABEL[variant]}",
        "",
        f"{prof.total:,} active samples ({prof.harness:,} more in the benchmark's reset route, left out); "
        f"eventguard's code (not its test kit) on the stack in {pct(prof.eventguard, prof.total)} of them.",
        "",
        "| thread | samples | share | with eventguard on the stack |",
        "|---|---|---|---|",
    ]
    for thread, n in prof.threads.most_common(6):
        eg = prof.eventguard_by_thread[thread]
        lines.append(f"| {thread} | {n:,} | {pct(n, prof.total)} | {pct(eg, prof.total)} |")
    lines += ["", f"Top {TOP} by own time:", "", "| own | function (file) |", "|---|---|"]
    for fn, n in prof.own.most_common(TOP):
        lines.append(f"| {pct(n, prof.total)} | `{fn}` |")
    lines += ["", "Own time by package:", "", "| own | package |", "|---|---|"]
    lines += [f"| {pct(n, prof.total)} | {pkg} |" for pkg, n in prof.packages.most_common(12)]
    eg_own = [(fn, n) for fn, n in prof.own.most_common() if "eventguard/" in fn][:10]
    if eg_own:
        lines += ["", "eventguard's own functions by own time:", "", "| own | function (file) |", "|---|---|"]
        lines += [f"| {pct(n, prof.total)} | `{fn}` |" for fn, n in eg_own]
    if prof.eventguard_inclusive:
        lines += [
            "",
            "eventguard's functions by time on the stack (inclusive: the guard's frames hold the host's",
            "handler below them, the sink's hold SQLAlchemy and the driver):",
            "",
            "| on the stack | function (file) |",
            "|---|---|",
        ]
        lines += [f"| {pct(n, prof.total)} | `{fn}` |" for fn, n in prof.eventguard_inclusive.most_common(12)]
    return [*lines, ""]


async def record(rounds: int, sizes: Sizes, folder: Path) -> dict[str, Profile]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    variants = ["unguarded", "guarded", "sqlite"] + ([] if await pg_unreachable() else ["postgres"])
    per_c = {1: sizes.host_responses_c1, 16: sizes.host_responses_c16}
    async with servers(variants) as running:
        spies = {}
        for v, s in running.items():
            args = ["record", "--pid", str(s.pid), "-f", "raw", "-r", "200", "-t", "--nolineno"]
            args += ["--nonblocking", "--full-filenames", "-o", str(folder / f"{v}.txt")]
            spies[v] = await asyncio.create_subprocess_exec(
                spy, *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
            )
        await asyncio.sleep(1.0)  # the samplers attach
        for rnd in range(rounds):
            k = rnd % len(variants)
            for c in CONCURRENCY:
                for v in variants[k:] + variants[:k]:
                    await measure(running[v], c, per_c[c])
            print(f"    profile round {rnd + 1}/{rounds}", file=sys.stderr, flush=True)
        for proc in spies.values():
            proc.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
        for v, proc in spies.items():
            async with asyncio.timeout(60):
                _, err = await proc.communicate()
            if not (folder / f"{v}.txt").exists():
                raise RuntimeError(f"py-spy wrote nothing for {v}: {err.decode()[-1000:]}")
    return {v: fold((folder / f"{v}.txt").read_text(errors="replace")) for v in variants}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.profile_host", description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--keep", type=Path, default=None, help="also keep py-spy's raw files here")
    ap.add_argument("--fold", type=Path, default=None, help="record nothing: summarise raw files kept here")
    args = ap.parse_args(argv)
    sizes = Sizes()
    if args.fold is not None:
        profiles = {
            v: fold((args.fold / f"{v}.txt").read_text(errors="replace"))
            for v in LABEL
            if (args.fold / f"{v}.txt").exists()
        }
    else:
        with tempfile.TemporaryDirectory(prefix="eg-prof-") as d:
            folder = Path(d)
            profiles = asyncio.run(record(args.rounds, sizes, folder))
            if args.keep is not None:
                args.keep.mkdir(parents=True, exist_ok=True)
                for f in folder.glob("*.txt"):
                    shutil.copy(f, args.keep / f.name)
    command = "python -m benchmarks.profile_host" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    parts = [
        "# Where a guarded server's CPU goes",
        "",
        f"Produced by `{command}` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC: py-spy "
        "(`record --nonblocking -f raw -r 200 -t --nolineno`, active samples only) attached to each "
        f"server process of the host benchmark for {args.rounds} interleaved rounds at concurrency 1 "
        f"({sizes.host_responses_c1} responses) and 16 ({sizes.host_responses_c16}). 'Own' is the share "
        "of the process's samples with that function on top of the stack.",
        "",
        "## Machine",
        "",
        *(f"- {k}: {v}" for k, v in machine()),
        "",
        "## Per server",
        "",
    ]
    for v, prof in profiles.items():
        parts += section(v, prof)
    args.out.write_text("\n".join(parts) + "\n", encoding="utf-8")
    print(f"written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
