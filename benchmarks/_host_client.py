"""The client of the host-level benchmark, in a process of its own (so it never shares the servers' CPU time).

``python -m benchmarks._host_client SPEC`` (SPEC: a JSON object, see :func:`main`) drives one round
of every server it names at one concurrency. First each server gets ``concurrency`` untimed
responses (connections opened, first-use costs paid). Then each server serves ``responses``
streaming responses, ``concurrency`` in flight at a time, in slices of ``slice`` responses: the
servers take turns slice by slice, the order reversed every other slice, so that whatever the
machine does over seconds (another tenant, a frequency change) falls on every server alike, not on
whichever one was being measured then. Then each server's ``POST /_bench/flush``.

Each server's CPU time is read when the round starts (after the warm-ups) and once every flush has
answered: its process CPU-time clock (``clock_getcpuclockid``: nanoseconds, every thread, those
that ended too), or ``psutil``'s user + system time (10 ms ticks) where there is no such clock.
So it counts all of the server's work for the round, what a sink does after a response ended
included, and the little an idle server does while the others serve (uvicorn's timers), alike for
every server. The user/system split comes from ``psutil`` (ticks, over the whole round).

It prints one JSON object, by variant: wall seconds of its slices, per-response latencies (request
sent to the stream's last byte), the server's CPU seconds over the round and the system part of
them, the part it spent in the garbage collector and its context switches (``GET /_bench/gc``
before and after), and the SSE events received (the warm-up's included, for the count against
the database).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil  # type: ignore[import-untyped,unused-ignore]

#: One response's bound: a stuck server fails the run instead of hanging it.
PER_RESPONSE = 60.0


def cpu_clock(pid: int) -> int | None:
    """The CPU-time clock of process ``pid`` (``clock_getcpuclockid``), None where there is none."""
    try:
        getcpuclockid = ctypes.CDLL(None).clock_getcpuclockid
    except (OSError, AttributeError):  # no C library to ask, or no such function in it
        return None
    clock = ctypes.c_int(0)  # clockid_t
    if getcpuclockid(ctypes.c_int(pid), ctypes.byref(clock)) != 0:
        return None
    try:
        time.clock_gettime(clock.value)
    except OSError:
        return None
    return clock.value


@dataclass
class Served:
    """One server of the round: how to reach it, and what it did."""

    variant: str
    http: httpx.AsyncClient
    process: Any  # psutil.Process
    clock: int | None
    wall: float = 0.0
    latencies: list[float] = field(default_factory=list)
    events: int = 0
    sizes: set[int] = field(default_factory=set)

    def cpu(self) -> float:
        """The server's CPU seconds so far: its CPU-time clock, else psutil's (ticks)."""
        if self.clock is not None:
            return time.clock_gettime(self.clock)
        t = self.process.cpu_times()
        return float(t.user + t.system)

    def system(self) -> float:
        return float(self.process.cpu_times().system)


async def one(http: httpx.AsyncClient, i: int) -> tuple[float, int]:
    """One streaming response: (seconds to its last byte, SSE events received)."""
    body = {"model": "scripted", "input": f"go {i}", "stream": True}
    t = time.perf_counter()
    events = 0
    async with asyncio.timeout(PER_RESPONSE):
        async with http.stream("POST", "/responses", json=body) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if line.startswith("data:"):
                    events += 1
    return time.perf_counter() - t, events


async def drive(http: httpx.AsyncClient, concurrency: int, n: int, first: int) -> list[tuple[float, int]]:
    """``n`` responses, ``concurrency`` at a time (a fixed pool of workers, as that many users)."""
    out: list[tuple[float, int]] = []
    todo = iter(range(first, first + n))

    async def worker() -> None:
        for i in todo:
            out.append(await one(http, i))

    await asyncio.gather(*(worker() for _ in range(min(concurrency, n))))
    return out


def slices(n: int, size: int) -> list[int]:
    """``n`` responses in slices of ``size`` (the last one shorter)."""
    return [min(size, n - start) for start in range(0, n, size)]


async def run(servers: list[dict[str, Any]], concurrency: int, n: int, size: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    served = [
        Served(
            s["variant"],
            httpx.AsyncClient(base_url=s["url"], limits=limits, timeout=PER_RESPONSE),
            psutil.Process(s["pid"]),
            cpu_clock(s["pid"]),
        )
        for s in servers
    ]
    try:
        for s in served:
            s.events += sum(ev for _, ev in await drive(s.http, concurrency, concurrency, 0))
        gc0 = [(await s.http.get("/_bench/gc")).json() for s in served]
        cpu0 = [s.cpu() for s in served]
        system0 = [s.system() for s in served]
        first = concurrency
        for k, count in enumerate(slices(n, size)):
            for s in served if k % 2 == 0 else reversed(served):
                t = time.perf_counter()
                timed = await drive(s.http, concurrency, count, first)
                s.wall += time.perf_counter() - t
                s.latencies += [lat for lat, _ in timed]
                s.events += sum(ev for _, ev in timed)
                s.sizes.update(ev for _, ev in timed)
            first += count
        spooled = []
        for s in served:
            async with asyncio.timeout(150):
                spooled.append((await s.http.post("/_bench/flush", timeout=150)).json()["spooled"])
        cpu1 = [s.cpu() for s in served]
        system1 = [s.system() for s in served]
        gc1 = [(await s.http.get("/_bench/gc")).json() for s in served]
    finally:
        for s in served:
            await s.http.aclose()
    return {
        s.variant: {
            "wall": s.wall,
            "latencies": s.latencies,
            "cpu": cpu1[i] - cpu0[i],
            "cpu_system": system1[i] - system0[i],
            "cpu_clock": s.clock is not None,
            "events": s.events,
            "events_per_response": sorted(s.sizes),
            "spooled": spooled[i],
            "gc": gc1[i]["seconds"] - gc0[i]["seconds"],
            "gc_full": gc1[i]["collections"][2] - gc0[i]["collections"][2],
            "switches": gc1[i]["switches"] - gc0[i]["switches"],
        }
        for i, s in enumerate(served)
    }


def main(argv: list[str]) -> None:
    """``SPEC``: ``{"servers": [{"variant", "url", "pid"}, ...] (in this round's order),
    "concurrency": C, "responses": N, "slice": K}``."""
    spec = json.loads(argv[0])
    result = asyncio.run(run(spec["servers"], spec["concurrency"], spec["responses"], spec["slice"]))
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
