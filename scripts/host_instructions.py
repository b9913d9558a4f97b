"""What a real server pays per response, in instructions, not time (issue 13).

``python -m benchmarks host`` reads each server's CPU time, and on a shared machine that moves by
20 % or more from round to round, more than the sink's whole cost. Instruction counts barely move:
this serves ``--responses`` and three times as many 28-event streaming responses, one after another,
from the host benchmark's own servers (:func:`benchmarks._host_server.build_server`: the real
``ResponsesHostServer`` over a model-free chat agent) in-process through ``httpx.ASGITransport``,
under ``valgrind --tool=callgrind``; the difference of the two counts over twice ``--responses`` is
one response's cost, every thread of the process included (the SQLite writer's too). Kernel time
(the WAL's writes, a thread's wake-up) is not counted.

Every time is stretched ``--scale`` times (the sink's ``flush_interval``), so valgrind's slowdown
keeps the schedule of a quick response: one write transaction per response, as at concurrency 1.
``sqlite-store`` is the server with ``database=`` on SQLite (the SQL response store and agent
sessions, the host's state folder unused) and the SQLite sink on the same file, as the host
benchmark builds it, served inside the app's lifespan.

``--where`` also says where each variant's extra instructions run: the difference to the unguarded
server per response, by the library that ran them (SQLite, orjson, pydantic, the C library), and
inside the interpreter by its source file, so that the garbage collector (``gcmodule.c``), the
allocator (``obmalloc.c``) and the bytecode loop (``ceval.c``) are told apart. Self cost only, read
from callgrind's own output (each function's instructions, not those of what it calls).

``--statements`` (no tool, the sink's real times: one transaction per response as at concurrency 1)
times the SQLite writer thread's work in that thread's CPU time: each statement, each whole
transaction, and the checkpoints it runs after answering, per response.

``--close-wait`` (no tool, real times, one response at a time) says what each response's end
waits for: its recorder's ``close()`` (the guard's final flush) returns once the response's last
batch is written, and the host ends the stream only after it, so at concurrency 1 every response's
time includes that wait. Step by step in wall-clock time, median and 90th percentile: until the
writer's cycle begins, serialising, the write (the SQLite thread's transaction and the hand-off to
it and back, or PostgreSQL's round trips), and the close's return after it.

``--syscalls`` counts system calls instead, by name (``strace -f -c``, every thread): what a
variant asks of the kernel per response (the WAL's writes, a thread's wake-up through a futex), the
part of its CPU time an instruction count does not see. Counts, not times: strace's own slowdown
changes how often the event loop waits, so ``epoll_wait`` moves a little; the rest repeat.

    python scripts/host_instructions.py                      # unguarded, guarded, sqlite; ~4 minutes
    python scripts/host_instructions.py --variant postgres   # unguarded and the PostgreSQL sink
    python scripts/host_instructions.py --syscalls --variant guarded --variant sqlite --variant postgres
    python scripts/host_instructions.py --where              # + where the extra instructions run
    python scripts/host_instructions.py --statements --responses 300  # the SQLite writer's statements
    python scripts/host_instructions.py --close-wait --responses 200  # what a response's end waits for
    python scripts/host_instructions.py --close-wait --variant postgres --responses 200
    python scripts/host_instructions.py --rusage --responses 300 # no tool: time, faults, blocks, threads
    python scripts/host_instructions.py --rusage --variant sqlite --variant sqlite-store  # + database=
    PYTHONPATH=/other/checkout python scripts/host_instructions.py   # another commit's eventguard
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("unguarded", "guarded", "sqlite", "postgres", "sqlite-store")
PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"
T = TypeVar("T")


async def _serve_some(
    variant: str,
    n: int,
    scale: float,
    rusage: bool = False,
    statements: bool = False,
    close_wait: bool = False,
) -> None:
    """``n`` streaming responses from ``variant``'s server, one after another, in this process.
    ``rusage``: after ten untimed ones, print what the ``n`` cost the process (:func:`_usage`);
    ``statements``: after ten untimed ones, print what the SQLite writer thread's statements cost
    (:class:`_StatementClock`); ``close_wait``: after ten untimed ones, print what each response's
    end waited for (:class:`_CloseWait`)."""
    import httpx

    from benchmarks._common import PG_URL
    from benchmarks._host_server import build_server
    from eventguard.sink import SqlSink

    tmp = Path(tempfile.mkdtemp(prefix="eg-host-instr-"))
    os.environ["AGENTSERVER_STATE_ROOT"] = str(tmp / "state")
    sink: SqlSink | None = None
    schema: str | None = None
    every = 0.05 * scale  # the sink's default flush_interval, stretched
    if variant in ("sqlite", "sqlite-store"):
        # sqlite-store: the host benchmark's database= server also takes its sink on the same file
        # (with sink=None, database= would build no sink at all).
        sink = SqlSink(
            f"sqlite+aiosqlite:///{tmp / 'eg.db'}", spool_path=tmp / "spool.jsonl", flush_interval=every
        )
    elif variant == "postgres":
        import asyncpg  # type: ignore[import-untyped]

        schema = f"eg_instr_{uuid.uuid4().hex[:10]}"
        conn = await asyncpg.connect(PG_DSN)
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        await conn.close()
        sink = SqlSink(PG_URL, schema=schema, spool_path=tmp / "spool.jsonl", flush_interval=every)
    if sink is not None:
        await sink.start()
    server = build_server(
        argparse.Namespace(
            variant=variant, pg_schema=schema, sqlite=tmp / "eg.db", spool=tmp / "spool.jsonl"
        ),
        sink,
    )
    # database= opens what it builds (its sink, the SQL response store) in the app's lifespan;
    # the other servers are served without one, as they always were here.
    lifespan = (
        server.router.lifespan_context(server) if variant.endswith("-store") else contextlib.nullcontext()
    )
    body = {"model": "m", "input": "hi", "stream": True}
    try:
        async with (
            asyncio.timeout(600 * scale),
            lifespan,
            httpx.AsyncClient(transport=httpx.ASGITransport(app=server), base_url="http://host") as client,
        ):

            async def serve(k: int, marks: _CloseWait | None = None) -> None:
                for _ in range(k):
                    if marks is not None:
                        marks.mark("request")
                    async with client.stream("POST", "/responses", json=body) as response:
                        async for _ in response.aiter_lines():
                            pass
                    if marks is not None:
                        marks.mark("response")
                if sink is not None:
                    await sink.flush()

            if not (close_wait or statements or rusage):
                await serve(n)  # under a tool: it counts the whole process, warm-up or not
                return
            await serve(10)  # connections, caches and the schema: first-use costs, not measured
            if close_wait:
                with _CloseWait() as waits:
                    await serve(n, waits)
                waits.print(variant, n)
            elif statements:
                with _StatementClock() as clock:
                    await serve(n)
                clock.print(variant, n)
            else:
                before = _usage()
                await serve(n)
                _print_usage(variant, n, before, _usage())
    finally:
        if sink is not None:
            await sink.aclose()
        if schema is not None:
            conn = await asyncpg.connect(PG_DSN)
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
            await conn.close()
        shutil.rmtree(tmp, ignore_errors=True)


class _Wrapping:
    """What the two clocks below share: functions of the library replaced by timed wrappers while
    in use (``with``), the originals put back on exit."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def _wrap(self, owner: object, name: str, wrapper: Callable[..., Any]) -> Any:
        """Put ``wrapper`` in the place of ``owner.name`` (a method or a module function) until
        exit; the original."""
        original = getattr(owner, name)
        setattr(owner, name, wrapper)
        self._undo.append(functools.partial(setattr, owner, name, original))
        return original

    def __exit__(self, *exc: object) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()


class _StatementClock(_Wrapping):
    """Times the SQLite writer thread's work in that thread's CPU time (``time.thread_time``), while
    in use: each statement by its first words, each whole transaction, and the checkpoints the
    thread runs after answering. It wraps the thread's functions (the module's, for every thread)
    and puts them back on exit."""

    def __init__(self) -> None:
        super().__init__()
        self.statements: dict[str, list[float]] = {}
        self.transactions: list[float] = []
        self.checkpoints: list[float] = []

    def __enter__(self) -> _StatementClock:
        from eventguard.sql import sqlite_thread

        run, in_transaction = sqlite_thread.SqliteConnection.run, sqlite_thread._in_transaction
        checkpoint = sqlite_thread.SqliteThread._checkpoint_if_due

        def timed_run(conn: sqlite_thread.SqliteConnection, sql: str, params: tuple[object, ...]) -> int:
            t = time.thread_time()
            try:
                return run(conn, sql, params)
            finally:
                key = " ".join(sql.split("(", 1)[0].split()[:3])
                self.statements.setdefault(key, []).append(time.thread_time() - t)

        def timed_transaction(*args: Any) -> Any:
            t = time.thread_time()
            try:
                return in_transaction(*args)
            finally:
                self.transactions.append(time.thread_time() - t)

        def timed_checkpoint(thread: sqlite_thread.SqliteThread) -> None:
            t, before = time.thread_time(), thread.checkpoints
            checkpoint(thread)
            if thread.checkpoints != before:
                self.checkpoints.append(time.thread_time() - t)

        # The wrappers take the place of methods and of a module function, for a while.
        self._wrap(sqlite_thread.SqliteConnection, "run", timed_run)
        self._wrap(sqlite_thread, "_in_transaction", timed_transaction)
        self._wrap(sqlite_thread.SqliteThread, "_checkpoint_if_due", timed_checkpoint)
        return self

    def print(self, variant: str, n: int) -> None:
        print(f"{variant}: the SQLite writer thread's CPU time per response, {n} responses:")
        rows = sorted(self.statements.items(), key=lambda kv: -sum(kv[1]))
        for key, times in rows:
            mean = sum(times) / len(times)
            print(f"  {key:36} {sum(times) / n * 1e6:8.1f} us  ({len(times) / n:.2f} x {mean * 1e6:.1f} us)")
        inside = sum(sum(t) for t in self.statements.values())
        total = sum(self.transactions)
        print(f"  {'all statements':36} {inside / n * 1e6:8.1f} us")
        per = len(self.transactions) / n
        print(f"  {'whole transactions':36} {total / n * 1e6:8.1f} us  ({per:.2f} per response)")
        if self.checkpoints:
            each = sum(self.checkpoints) / len(self.checkpoints)
            print(
                f"  {'checkpoints, after the answer':36} {sum(self.checkpoints) / n * 1e6:8.1f} us"
                f"  ({len(self.checkpoints) / n:.2f} x {each * 1e6:.0f} us)"
            )


class _CloseWait(_Wrapping):
    """Times what a response's end waits for, in wall-clock time, one response at a time: from the
    moment the response ended (its recorder told the writer: ``Writer.note_change`` with an ended
    state) to its recorder's ``close()`` returning (the guard's final flush), in steps: until the
    writer's next cycle begins, serialising, the rest of the writer's preparation, the write itself
    (``Committer.apply``: the hand-off to the SQLite thread, its transaction and the way back, or
    PostgreSQL's round trips) and the close's return after it. The stream's end is sent only after
    that close, so at concurrency 1 every response's time includes it. It wraps those methods and
    puts them back on exit."""

    #: The steps, each from the first mark after the one before it (after "ended").
    STEPS = (
        ("ended", "cycle", "until the writer's cycle begins"),
        ("cycle", "serialised", "serialising the events"),
        ("serialised", "write", "until the write begins"),
        ("write", "written", "the write"),
        ("written", "closed", "until the close returns"),
    )

    def __init__(self) -> None:
        super().__init__()
        self.marks: list[tuple[str, float]] = []

    def mark(self, what: str) -> None:
        self.marks.append((what, time.perf_counter()))

    def __enter__(self) -> _CloseWait:
        from eventguard.lifecycle import ENDED_STATES
        from eventguard.sink import collect, commit, recorder, writer

        note_change, cycle = writer.Writer.note_change, writer.Writer.cycle
        serialise, apply = collect.Collector.serialise, commit.Committer.apply
        close = recorder.SqlRecorder.close

        def marked_note_change(w: writer.Writer, rec: recorder.SqlRecorder) -> None:
            if rec.lifecycle.state in ENDED_STATES:
                self.mark("ended")  # (a response's steps start at its first)
            note_change(w, rec)

        async def marked_cycle(w: writer.Writer, recorders: Any) -> None:
            self.mark("cycle")
            await cycle(w, recorders)

        async def marked_serialise(c: collect.Collector, batches: Any) -> None:
            await serialise(c, batches)
            self.mark("serialised")

        async def marked_apply(c: commit.Committer, batches: Any, tally: Any) -> None:
            self.mark("write")
            try:
                await apply(c, batches, tally)
            finally:
                self.mark("written")

        async def marked_close(rec: recorder.SqlRecorder) -> None:
            await close(rec)
            self.mark("closed")

        self._wrap(writer.Writer, "note_change", marked_note_change)
        self._wrap(writer.Writer, "cycle", marked_cycle)
        self._wrap(collect.Collector, "serialise", marked_serialise)
        self._wrap(commit.Committer, "apply", marked_apply)
        self._wrap(recorder.SqlRecorder, "close", marked_close)
        return self

    def steps(self) -> list[dict[str, float]]:
        """Each response's steps (seconds), from its marks between "request" and "response"."""
        out: list[dict[str, float]] = []
        window: list[tuple[str, float]] = []
        for what, at in self.marks:
            if what == "request":
                window = [(what, at)]
            elif what == "response":
                found = self._steps([*window, (what, at)])
                if found is not None:
                    out.append(found)
            else:
                window.append((what, at))
        return out

    def _steps(self, window: list[tuple[str, float]]) -> dict[str, float] | None:
        marks = [w for w, _ in window]
        if "ended" not in marks:
            return None
        at: dict[str, float] = {}
        i = marks.index("ended")
        at["ended"] = window[i][1]
        for _, end, _ in self.STEPS:
            while i < len(window) and window[i][0] != end:
                i += 1
            if i == len(window):
                return None  # a step that did not happen after the end (nothing left to write)
            at[end] = window[i][1]
        steps = {label: at[b] - at[a] for a, b, label in self.STEPS}
        steps["waited in all"] = at["closed"] - at["ended"]
        steps["the whole response"] = window[-1][1] - window[0][1]
        return steps

    def print(self, variant: str, n: int) -> None:
        found = self.steps()
        print(
            f"{variant}: what a response's end waits for, wall clock, {len(found)} of {n} responses "
            "(median, 90th percentile):"
        )
        if not found:
            return
        for label in [label for _, _, label in self.STEPS] + ["waited in all", "the whole response"]:
            times = sorted(f[label] for f in found)
            p90 = times[min(len(times) - 1, int(0.9 * len(times)))]
            print(f"  {label:34} {statistics.median(times) * 1e3:8.3f} ms  {p90 * 1e3:8.3f} ms")


def _usage() -> tuple[resource.struct_rusage, dict[str, tuple[int, int]]]:
    """The process's resource usage (every thread) and each live thread's context switches
    (voluntary, involuntary), from ``/proc``."""
    threads: dict[str, tuple[int, int]] = {}
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended in between
            fields = dict(
                line.split(":\t", 1) for line in (task / "status").read_text().splitlines() if ":\t" in line
            )
            threads[task.name] = (
                int(fields["voluntary_ctxt_switches"]),
                int(fields["nonvoluntary_ctxt_switches"]),
            )
    return resource.getrusage(resource.RUSAGE_SELF), threads


def _print_usage(
    variant: str,
    n: int,
    before: tuple[resource.struct_rusage, dict[str, tuple[int, int]]],
    after: tuple[resource.struct_rusage, dict[str, tuple[int, int]]],
) -> None:
    (r0, t0), (r1, t1) = before, after
    print(
        f"{variant}: per response, user {(r1.ru_utime - r0.ru_utime) / n * 1e3:.2f} ms, kernel "
        f"{(r1.ru_stime - r0.ru_stime) / n * 1e3:.2f} ms, "
        f"minor page faults {(r1.ru_minflt - r0.ru_minflt) / n:.1f}, "
        f"512-byte blocks written {(r1.ru_oublock - r0.ru_oublock) / n:.1f}; context switches by thread "
        "(voluntary + involuntary; the event loop's thread first):"
    )
    main = str(threading.get_native_id())
    names = {str(t.native_id): t.name for t in threading.enumerate()}
    for tid in sorted(t1, key=lambda t: (t != main, t)):
        v0, i0 = t0.get(tid, (0, 0))
        v1, i1 = t1[tid]
        if (v1 - v0) + (i1 - i0):
            print(f"  thread {tid} ({names.get(tid, 'ended')}): {(v1 - v0) / n:.2f} + {(i1 - i0) / n:.2f}")


def _serve_in_child(
    tool: list[str], variant: str, n: int, scale: float, *extra: str
) -> subprocess.CompletedProcess[str]:
    """``python this-script --one variant n`` under ``tool`` (a command prefix, or none), with this
    checkout's benchmarks package and the same dict layouts in every run (counts repeat)."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(ROOT)) if p)
    args = ["--one", variant, str(n), "--scale", str(scale), *extra]
    done = subprocess.run(
        [*tool, sys.executable, __file__, *args], capture_output=bool(tool), text=True, check=False, env=env
    )
    if done.returncode != 0:
        raise RuntimeError(f"{variant} {n} failed (exit {done.returncode}):\n{(done.stderr or '')[-2000:]}")
    return done


def _instructions(variant: str, n: int, scale: float, out: Path) -> tuple[int, Counter[str]]:
    """Instructions the whole process ran to serve ``n`` responses from ``variant``, and the same
    by where they ran (:func:`_places`)."""
    done = _serve_in_child(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"], variant, n, scale)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"{variant} {n}: callgrind printed no count:\n{done.stderr[-2000:]}")
    return int(found.group(1)), _places(out)


#: The interpreter, by the name its shared library or executable has.
_INTERPRETER = re.compile(r"libpython|/python3?[\d.]*$")


#: The keys of callgrind's position lines, by the name space their ids live in: an object or a
#: file first named on a callee's line (``cob=``, ``cfi=``) is named by its id alone after that.
_NAME_SPACES = {"ob": "ob", "cob": "ob", "fl": "fl", "fi": "fl", "fe": "fl", "cfi": "fl", "cfl": "fl"}
#: The keys that say where the following costs are (the others only name a callee).
_CURRENT = {"ob", "fl", "fi", "fe"}


def _places(out: Path) -> Counter[str]:
    """Each function's own instructions in a callgrind output file, summed by where they ran: the
    library (its file name), or for the interpreter ``python: <its source file>``.

    The format (valgrind's "Callgrind Format Specification"): ``ob=``/``fl=``/``fi=``/``fe=``/``fn=``
    set the current object, file and function, each as ``(id) name`` the first time and ``(id)``
    after (the first time may be a callee's ``cob=``/``cfi=``); a line of numbers is a cost
    (position, then instructions) of the current function, except the one after ``calls=``, which
    is the callee's inclusive cost and is skipped here.
    """
    names: dict[tuple[str, str], str] = {}
    current = {"ob": "???", "fl": "???"}
    places: Counter[str] = Counter()
    skip_next = False
    with out.open(encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, 1):
            if line[:1].isdigit() or line[:1] in "+-*":
                if skip_next:
                    skip_next = False
                    continue
                parts = line.split()
                if len(parts) < 2 or not parts[1].isdigit():
                    # A file callgrind did not finish (killed, a full disk): no figure from it.
                    raise ValueError(f"{out}:{number}: not a cost line: {line.strip()[:80]!r}")
                ob, fl = current["ob"], current["fl"]
                lib = ob.rsplit("/", 1)[-1]
                where = f"python: {fl.rsplit('/', 1)[-1]}" if _INTERPRETER.search(ob) else lib
                places[where] += int(parts[1])
                continue
            key, sep, value = line.partition("=")
            if not sep:
                continue
            if key == "calls":
                skip_next = True
                continue
            space = _NAME_SPACES.get(key)
            if space is None:
                continue
            found_id = re.match(r"\((\d+)\)\s*(.*)", value.strip())
            name = value.strip()
            if found_id is not None:
                ident, given = found_id.groups()
                if given:
                    names[space, ident] = given  # a name is given once, on whichever line first uses it
                name = names.get((space, ident), "???")
            if key in _CURRENT:
                current[space] = name
    return places


def _syscalls(variant: str, n: int, scale: float, out: Path) -> dict[str, int]:
    """System calls by name that the whole process made to serve ``n`` responses from ``variant``."""
    _serve_in_child(["strace", "-f", "-c", "-o", str(out)], variant, n, scale)
    # strace -c's table: % time, seconds, usecs/call, calls, [errors], syscall.
    row = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$")
    found = (row.match(line) for line in out.read_text().splitlines())
    return {m.group(2): int(m.group(1)) for m in found if m is not None and m.group(2) != "total"}


def _each_run(
    runs: list[tuple[str, int]], measure: Callable[[str, int, Path], T]
) -> dict[tuple[str, int], T]:
    """``measure(variant, n, a file of its own)`` for every run, as many at once as there are cores."""
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        found = pool.map(lambda r: measure(r[0], r[1], Path(tmp) / f"{r[0]}-{r[1]}.out"), runs)
        return dict(zip(runs, found, strict=True))


def _print_syscalls(variants: list[str], counts: dict[tuple[str, int], dict[str, int]], n: int) -> None:
    per = {
        v: {k: (counts[v, 3 * n].get(k, 0) - counts[v, n].get(k, 0)) / (2 * n) for k in counts[v, 3 * n]}
        for v in variants
    }
    names = sorted(
        {k for p in per.values() for k in p}, key=lambda k: -max(abs(p.get(k, 0)) for p in per.values())
    )
    where = os.environ.get("PYTHONPATH") or "this checkout"
    print(f"system calls per 28-event response, {2 * n} responses counted ({where}):")
    print(f"  {'':14}" + "".join(f"{v:>11}" for v in variants))
    for k in [k for k in names if max(abs(p.get(k, 0)) for p in per.values()) >= 0.5]:
        print(f"  {k:14}" + "".join(f"{per[v].get(k, 0):11.1f}" for v in variants))
    print(f"  {'all':14}" + "".join(f"{sum(per[v].values()):11.1f}" for v in variants))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--responses", type=int, default=20, help="N: runs of N and 3N responses (default 20)")
    ap.add_argument(
        "--variant", action="append", choices=VARIANTS, help="(repeatable) default: all but postgres"
    )
    ap.add_argument("--scale", type=float, default=50.0, help="stretch the sink's times (default 50)")
    ap.add_argument("--syscalls", action="store_true", help="count system calls (strace) instead")
    ap.add_argument(
        "--where", action="store_true", help="also: where the extra instructions run, by library and file"
    )
    ap.add_argument(
        "--rusage",
        action="store_true",
        help="no tool: time, page faults, blocks written and each thread's context switches per response",
    )
    ap.add_argument(
        "--statements",
        action="store_true",
        help="no tool: the SQLite writer thread's CPU time per statement and transaction, per response",
    )
    ap.add_argument(
        "--close-wait",
        action="store_true",
        help="no tool: what each response's end waits for (its final flush), step by step, wall clock",
    )
    ap.add_argument("--one", nargs=2, metavar=("VARIANT", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.responses < 1:
        ap.error("--responses: at least 1")
    if args.one:
        asyncio.run(
            _serve_some(
                args.one[0], int(args.one[1]), args.scale, args.rusage, args.statements, args.close_wait
            )
        )
        return 0
    for flag, wanted, usable, lacks in (
        ("--close-wait", args.close_wait, {"sqlite", "postgres", "sqlite-store"}, "no sink to wait for"),
        ("--statements", args.statements, {"sqlite", "sqlite-store"}, "no SQLite writer thread"),
    ):
        if not wanted:
            continue
        variants = args.variant or ["sqlite"]
        # Every variant checked before any is served: an unusable one is a usage error, not a
        # failure after minutes of another's measurement.
        for v in variants:
            if v not in usable:
                ap.error(f"{flag}: {v} has {lacks}")
        for v in variants:
            _serve_in_child([], v, args.responses, 1.0, flag)
        return 0
    if args.rusage:
        # One process per variant, one after another (a thread's figures are its process's).
        for v in args.variant or ["unguarded", "guarded", "sqlite"]:
            _serve_in_child([], v, args.responses, 1.0, "--rusage")
        return 0
    tool = "strace" if args.syscalls else "valgrind"
    if shutil.which(tool) is None:
        print(f"{tool} is not on PATH", file=sys.stderr)
        return 2
    variants = args.variant or ["unguarded", "guarded", "sqlite"]
    if "unguarded" not in variants:
        variants.insert(0, "unguarded")
    n = args.responses
    runs = [(v, k) for v in variants for k in (n, 3 * n)]
    if args.syscalls:
        _print_syscalls(variants, _each_run(runs, lambda v, k, out: _syscalls(v, k, args.scale, out)), n)
        return 0
    counts = _each_run(runs, lambda v, k, out: _instructions(v, k, args.scale, out))
    per = {v: (counts[v, 3 * n][0] - counts[v, n][0]) / (2 * n) for v in variants}
    where = os.environ.get("PYTHONPATH") or "this checkout"
    print(f"instructions per 28-event response, {2 * n} responses counted ({where}):")
    for v in variants:
        print(f"  {v:10} {per[v] / 1e6:7.2f} M  {per[v] / per['unguarded']:.3f}x the unguarded server")
    if args.where:
        _print_places(variants, {key: places for key, (_total, places) in counts.items()}, n)
    return 0


def _print_places(variants: list[str], places: dict[tuple[str, int], Counter[str]], n: int) -> None:
    """Per response, each variant's instructions minus the unguarded server's, by where they ran:
    every place that differs by at least 1 % of the largest difference, largest first."""
    per = {
        v: {k: (places[v, 3 * n][k] - places[v, n][k]) / (2 * n) for k in places[v, 3 * n] | places[v, n]}
        for v in variants
    }
    base = per["unguarded"]
    extra = {v: {k: per[v].get(k, 0.0) - base.get(k, 0.0) for k in per[v] | base} for v in variants[1:]}
    if not extra:
        return
    largest = max(sum(e.values()) for e in extra.values())
    keys = sorted(
        {k for e in extra.values() for k in e}, key=lambda k: -max(e.get(k, 0.0) for e in extra.values())
    )
    shown = [k for k in keys if max(abs(e.get(k, 0.0)) for e in extra.values()) >= 0.01 * abs(largest)]
    print("extra instructions per response against the unguarded server, by where they ran (k = thousand):")
    print(f"  {'':32}" + "".join(f"{v:>14}" for v in extra))
    for k in shown:
        print(f"  {k[:32]:32}" + "".join(f"{e.get(k, 0.0) / 1e3:13.0f}k" for e in extra.values()))
    rest = {v: sum(x for k, x in e.items() if k not in shown) for v, e in extra.items()}
    print(f"  {'(the rest)':32}" + "".join(f"{rest[v] / 1e3:13.0f}k" for v in extra))
    print(f"  {'all':32}" + "".join(f"{sum(e.values()) / 1e3:13.0f}k" for e in extra.values()))


if __name__ == "__main__":
    raise SystemExit(main())
