"""(7) End to end: what eventguard costs a real ``ResponsesHostServer`` serving real clients.

Seven servers, each in its own process (``benchmarks._host_server``), all up for the whole part: the
host unguarded, a second unguarded server of the same code (the twin), guarded without a sink,
guarded + SQLite sink, guarded + PostgreSQL sink, and the two sinks with ``database=`` (the host's
response store and agent sessions in the same SQL database, its state folder unused: all of
eventguard). They serve
the host's own handler over a model-free chat agent (28 SSE events per response) through uvicorn on
loopback. A separate client process (``benchmarks._host_client``, httpx) streams the responses at
concurrency 1 and 16 and reads each server's CPU time (its process CPU-time clock: nanoseconds,
every thread).

Rounds are interleaved, and so is each round: one client process per round and concurrency serves
every variant its responses in slices (:data:`SLICE`: 5 at concurrency 1, 32 at 16), the variants
taking turns slice by slice, so that machine noise over seconds falls on every variant alike; the
order rotates from round to round. Each server's CPU is its own over the whole round (what a sink
does after a response ended included). Measured one variant after another instead (40 responses
each, psutil's CPU ticks; until 2026-12-07), two runs of four rounds on one machine read the twin's
CPU at concurrency 1 as 0.94x and 1.01x the unguarded server's and the SQLite sink's as 1.01x and
1.11x; in turns, three runs on the same machine read them as 0.99-1.00x and 1.13-1.19x. Before each
round every host's state folder (``AGENTSERVER_STATE_ROOT``: its stored responses and sessions) is
emptied through the server's ``/_bench/reset`` route and garbage collected. The SQL databases are
not emptied: the sinks' rows and the SQL store's responses pile up over the rounds, as in a server
that runs for a while (each database is new when the part starts). Each figure is a ratio to the
unguarded server in the same round; the table shows the median over the rounds, the note its spread.

"Lost" is the events the clients received minus the events that reached the database. With the
PostgreSQL sink, the CPU time of the database backends serving the server's connections is reported
too (found in ``pg_stat_activity`` by the server's client ports): it is not in the server's own.

The twin is the benchmark's own resolution (an A/A comparison): it runs exactly what the unguarded
server runs, so every distance of its ratios from 1.0x is the machine's noise, not a cost. Its rows
carry the targets' directions, so ``--runs K`` keeps its worst run as it does for the targeted
variants, but no target: a variant's ratio is told from noise only where it lies beyond the twin's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import httpx
import psutil  # type: ignore[import-untyped,unused-ignore]

from ._common import PG_DSN, Row, Sizes, median
from ._sinks import pg_count, pg_schema, pg_unreachable, sqlite_count

NAME = "host"
ITEM = "7 host"
LABEL = {
    "unguarded": "unguarded server",
    "unguarded-twin": "a second unguarded server (A/A: the benchmark's resolution)",
    "guarded": "guarded, no sink",
    "sqlite": "guarded + SQLite sink",
    "postgres": "guarded + PostgreSQL sink",
    "sqlite-store": "guarded, database= on SQLite (sink + SQL response store)",
    "postgres-store": "guarded, database= on PostgreSQL (sink + SQL response store)",
}
#: Variants held to the issue's targets (the guard alone and the database= servers are reported).
TARGETED = ("sqlite", "postgres")
#: The A/A variant: the targets' directions (its worst run is kept), no target.
TWIN = "unguarded-twin"
#: Variants whose events are counted against their database.
RECORDING = ("sqlite", "postgres", "sqlite-store", "postgres-store")
CONCURRENCY = (1, 16)
#: The children run ``-m benchmarks...`` from the project root, whatever the caller's directory.
ROOT = Path(__file__).resolve().parents[1]
START = 120.0  # seconds a server may take to import the host and listen


@dataclass
class Server:
    """One running server process and where its database lives."""

    variant: str
    proc: asyncio.subprocess.Process
    url: str
    pid: int
    state_root: Path
    sqlite: Path | None = None
    pg_schema: str | None = None

    async def stored(self) -> int | None:
        """Events in this server's database now (``None``: it has none)."""
        if self.sqlite is not None:
            return await asyncio.to_thread(sqlite_count, self.sqlite)
        if self.pg_schema is not None:
            return await pg_count(self.pg_schema)
        return None


def on_postgres(variant: str) -> bool:
    return variant.startswith("postgres")


async def start_server(variant: str, folder: Path, schema: str | None) -> Server:
    """Start one server process and wait for the URL it announces (``schema``: its PostgreSQL
    schema, for a PostgreSQL variant)."""
    state = folder / "state"
    state.mkdir(parents=True)
    args = [variant, "--spool", str(folder / "spool.jsonl")]
    sqlite = folder / "bench.db" if variant.startswith("sqlite") else None
    if sqlite is not None:
        args += ["--sqlite", str(sqlite)]
    if schema is not None:
        args += ["--pg-schema", schema]
    env = {**os.environ, "AGENTSERVER_STATE_ROOT": str(state)}
    with open(folder / "stderr.txt", "wb") as err:  # noqa: ASYNC230 - opened once, before the child
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "benchmarks._host_server",
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
            env=env,
            cwd=ROOT,
        )
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(START):
            line = await proc.stdout.readline()
    except TimeoutError:
        proc.kill()
        raise
    if not line:
        await proc.wait()
        tail = (folder / "stderr.txt").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"the {variant} server exited ({proc.returncode}) before serving:\n{tail}")
    hello = json.loads(line)
    return Server(variant, proc, hello["url"], hello["pid"], state, sqlite, schema)


async def stop_server(server: Server) -> None:
    """Close its stdin (it shuts down gracefully: the lifespan closes the sink); kill it if it hangs."""
    proc = server.proc
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        async with asyncio.timeout(60):
            await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()


@contextlib.asynccontextmanager
async def servers(variants: list[str]) -> AsyncIterator[dict[str, Server]]:
    """Every variant's server, started side by side, stopped at the end."""
    async with contextlib.AsyncExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="eg-host-")))
        # A schema per PostgreSQL server: each one's events are counted in its own.
        schemas = {v: await stack.enter_async_context(pg_schema()) for v in variants if on_postgres(v)}
        started = await asyncio.gather(
            *(start_server(v, root / v, schemas.get(v)) for v in variants), return_exceptions=True
        )
        running = [s for s in started if isinstance(s, Server)]
        try:
            for s in started:
                if isinstance(s, BaseException):
                    raise s
            yield {s.variant: s for s in running}
        finally:
            await asyncio.gather(*(stop_server(s) for s in running))


async def pg_backends(server_pid: int) -> dict[int, float]:
    """CPU seconds so far of each PostgreSQL backend serving one of ``server_pid``'s connections."""
    proc = psutil.Process(server_pid)
    connections = getattr(proc, "net_connections", None) or proc.connections  # psutil < 6: connections
    ports = [c.laddr.port for c in connections(kind="tcp") if c.raddr and c.raddr.port == 5432]
    if not ports:
        return {}
    conn = await asyncpg.connect(PG_DSN)
    try:
        rows = await conn.fetch("SELECT pid FROM pg_stat_activity WHERE client_port = ANY($1::int[])", ports)
    finally:
        await conn.close()
    cpu: dict[int, float] = {}
    for row in rows:
        try:
            t = psutil.Process(row["pid"]).cpu_times()
        except psutil.Error:  # the backend ended in between: its time is gone with it
            continue
        cpu[row["pid"]] = t.user + t.system
    return cpu


#: Responses per slice (see ``benchmarks._host_client``): the servers take turns this often.
SLICE = {1: 5, 16: 32}


async def measure_round(servers: list[Server], concurrency: int, n: int) -> dict[str, dict[str, Any]]:
    """One round of ``servers`` (in this order) at ``concurrency``: reset each host's state, run the
    client once over them all (``n`` responses each, the servers taking turns slice by slice),
    count what reached each database; each server's figures by variant."""
    for server in servers:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            (await http.post("/_bench/reset")).raise_for_status()
    before = {s.variant: await s.stored() for s in servers}
    pg_before = {s.variant: await pg_backends(s.pid) for s in servers if on_postgres(s.variant)}
    spec = {
        "servers": [{"variant": s.variant, "url": s.url, "pid": s.pid} for s in servers],
        "concurrency": concurrency,
        "responses": n,
        "slice": SLICE.get(concurrency, 2 * concurrency),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "benchmarks._host_client",
        json.dumps(spec),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    async with asyncio.timeout(600 * len(servers)):
        out, err = await proc.communicate()
    if proc.returncode != 0:
        names = ", ".join(s.variant for s in servers)
        raise RuntimeError(f"the client against {names} failed:\n{err.decode()[-2000:]}")
    results: dict[str, dict[str, Any]] = json.loads(out.decode().strip().splitlines()[-1])
    for server in servers:
        result = results[server.variant]
        after = await server.stored()
        was = before[server.variant]
        result["stored"] = None if was is None or after is None else after - was
        if on_postgres(server.variant):
            pg_after = await pg_backends(server.pid)
            # A backend that appeared during the round spent all its time on it.
            start = pg_before[server.variant]
            result["pg_cpu"] = sum(t - start.get(pid, 0.0) for pid, t in pg_after.items())
    return results


async def measure(server: Server, concurrency: int, n: int) -> dict[str, Any]:
    """``server`` alone for one round (what a profiler attached to it sees)."""
    return (await measure_round([server], concurrency, n))[server.variant]


def p(latencies: list[float], q: int) -> float:
    """The ``q``-th percentile (inclusive method: defined for any sample of two or more)."""
    if len(latencies) < 2:
        return latencies[0]
    return statistics.quantiles(latencies, n=100, method="inclusive")[q - 1]


def figures(r: dict[str, Any], n: int) -> dict[str, float]:
    """The four figures of one measurement."""
    return {
        "rps": n / r["wall"],
        "cpu": r["cpu"] / n * 1000,  # ms per response
        "p50": p(r["latencies"], 50) * 1000,
        "p99": p(r["latencies"], 99) * 1000,
    }


FIGURES = (
    # key, what, unit, direction, target
    ("rps", "responses/s", "/s", ">=", 0.95),
    ("cpu", "server CPU per response", "ms", "<=", 1.10),
    ("p50", "p50 per response", "ms", "", None),
    ("p99", "p99 per response", "ms", "<=", 1.2),
)


def spread(xs: list[float]) -> str:
    return f"{min(xs):.2f}-{max(xs):.2f}x" if xs else "-"


def gc_row(concurrency: int, n: int, variant: str, runs: list[dict[str, Any]]) -> Row:
    """Reported: the server's time in the garbage collector per response, and its share of the
    server's CPU time (where part of a variant's extra CPU goes: the heap it keeps alive is
    traversed by every full collection)."""
    per = [r["gc"] / n * 1000 for r in runs]
    share = [r["gc"] / r["cpu"] * 100 for r in runs if r["cpu"] > 0]
    full = [int(r["gc_full"]) for r in runs]
    return Row(
        ITEM,
        f"c={concurrency}, {LABEL[variant]}: garbage collection per response",
        median(per),
        "ms",
        note=f"{median(share):.1f} % of the server CPU (spread {min(share):.1f}-{max(share):.1f} %); "
        f"full collections per round {min(full)}-{max(full)}; spread {min(per):.3g}-{max(per):.3g} ms",
    )


def kernel_row(concurrency: int, n: int, variant: str, runs: list[dict[str, Any]]) -> Row:
    """Reported: the server's CPU per response in the kernel (system time) and its context switches
    per response (every thread: a wait on a socket, a lock or a queue, a thread woken). Where a
    variant's extra CPU goes when it is not in its own instructions: system calls and thread
    hand-offs, which an instruction count does not see."""
    system = [r["cpu_system"] / n * 1000 for r in runs]
    share = [r["cpu_system"] / r["cpu"] * 100 for r in runs if r["cpu"] > 0]
    switches = [r["switches"] / n for r in runs]
    return Row(
        ITEM,
        f"c={concurrency}, {LABEL[variant]}: kernel CPU per response",
        median(system),
        "ms",
        note=f"{median(share):.0f} % of the server CPU (spread {min(share):.0f}-{max(share):.0f} %); "
        f"{median(switches):.1f} context switches per response (spread {min(switches):.1f}-"
        f"{max(switches):.1f}); kernel CPU spread {min(system):.3g}-{max(system):.3g} ms",
    )


def rows_for(
    concurrency: int, n: int, runs: dict[str, list[dict[str, Any]]], variants: list[str]
) -> list[Row]:
    """The table rows of one concurrency: per variant, each figure as the median per-round ratio."""
    base = [figures(r, n) for r in runs["unguarded"]]
    rounds = len(base)
    rows = [
        Row(
            ITEM,
            f"c={concurrency}, unguarded server: {what}",
            median([b[key] for b in base]),
            unit,
            note=f"{rounds} rounds x {n} responses; spread {min(b[key] for b in base):.3g}-"
            f"{max(b[key] for b in base):.3g} {unit}",
        )
        for key, what, unit, _d, _t in FIGURES
        if key in ("rps", "cpu")
    ]
    rows += [gc_row(concurrency, n, v, runs[v]) for v in variants]
    rows += [kernel_row(concurrency, n, v, runs[v]) for v in variants]
    for v in variants:
        if v == "unguarded":
            continue
        mine = [figures(r, n) for r in runs[v]]
        for key, what, unit, direction, target in FIGURES:
            ratios = [m[key] / b[key] for m, b in zip(mine, base, strict=True)]
            targeted = v in TARGETED and bool(direction)
            rows.append(
                Row(
                    ITEM,
                    f"c={concurrency}, {LABEL[v]}: {what}",
                    median([m[key] for m in mine]),
                    unit,
                    "unguarded, same rounds",
                    median([b[key] for b in base]),
                    direction if targeted or v == TWIN else "",
                    target if targeted else None,
                    paired=median(ratios),
                    note=f"median of {rounds} per-round ratios; spread {spread(ratios)}",
                )
            )
        if v in RECORDING:
            received = sum(int(r["events"]) for r in runs[v])
            stored = sum(int(r["stored"]) for r in runs[v])
            spooled = max(int(r["spooled"]) for r in runs[v])
            sizes = sorted({e for r in runs[v] for e in r["events_per_response"]})
            if on_postgres(v):
                per = [r["pg_cpu"] / (n + concurrency) * 1000 for r in runs[v]]
                rows.append(
                    Row(
                        ITEM,
                        f"c={concurrency}, {LABEL[v]}: PostgreSQL backends' CPU per response",
                        median(per),
                        "ms",
                        note=f"not in the server CPU above; warm-ups included; spread {min(per):.3g}-"
                        f"{max(per):.3g} ms over {rounds} rounds",
                    )
                )
            rows.append(
                Row(
                    ITEM,
                    f"c={concurrency}, {LABEL[v]}: events received but not in the database",
                    float(max(received - stored, 0)),
                    "events",
                    direction="<=",
                    target=0.0,
                    absolute=True,
                    note=f"{received:,} received, {stored:,} stored over {rounds} rounds "
                    f"({sizes} events per response); {spooled} batches spooled",
                )
            )
    return rows


async def run(sizes: Sizes) -> list[Row]:
    pg_why = await pg_unreachable()
    variants = ["unguarded", TWIN, "guarded", "sqlite", "sqlite-store"] + (
        [] if pg_why else ["postgres", "postgres-store"]
    )
    per_c = {1: sizes.host_responses_c1, 16: sizes.host_responses_c16}
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {c: {v: [] for v in variants} for c in CONCURRENCY}
    async with servers(variants) as running:
        for rnd in range(sizes.host_rounds):
            k = rnd % len(variants)
            order = variants[k:] + variants[:k]
            for c in CONCURRENCY:
                results = await measure_round([running[v] for v in order], c, per_c[c])
                for v in order:
                    runs[c][v].append(results[v])
            print(f"    host round {rnd + 1}/{sizes.host_rounds}", file=sys.stderr, flush=True)
    rows: list[Row] = []
    for c in CONCURRENCY:
        rows += rows_for(c, per_c[c], runs[c], variants)
    if pg_why:
        rows += [Row(ITEM, LABEL[v], None, "", skipped=pg_why) for v in ("postgres", "postgres-store")]
    return rows
