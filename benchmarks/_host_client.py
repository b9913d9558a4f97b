"""The client of the host-level benchmark, in a process of its own (so it never shares the server's CPU time).

``python -m benchmarks._host_client URL SERVER_PID CONCURRENCY RESPONSES`` first runs ``CONCURRENCY``
untimed responses (connections opened, first-use costs paid), then ``RESPONSES`` streaming responses
with ``CONCURRENCY`` in flight at a time, then ``POST /_bench/flush``; it prints one JSON object:
wall seconds, per-response latencies (request sent to the stream's last byte), the server process's
CPU seconds over the timed part and the flush (``psutil``: user + system, every thread; each also
apart, so the kernel's share of a variant's extra CPU shows), the part of it the server spent in
the garbage collector and its context switches (``GET /_bench/gc`` before and after), and the SSE
events received (the warm-up's included, for the count against the database).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import httpx
import psutil  # type: ignore[import-untyped,unused-ignore]

#: One response's bound: a stuck server fails the run instead of hanging it.
PER_RESPONSE = 60.0


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

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


async def run(url: str, pid: int, concurrency: int, n: int) -> dict[str, Any]:
    server = psutil.Process(pid)
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=PER_RESPONSE) as http:
        warm = await drive(http, concurrency, concurrency, 0)
        gc0 = (await http.get("/_bench/gc")).json()
        cpu0 = server.cpu_times()
        t = time.perf_counter()
        timed = await drive(http, concurrency, n, concurrency)
        wall = time.perf_counter() - t
        async with asyncio.timeout(150):
            spooled = (await http.post("/_bench/flush", timeout=150)).json()["spooled"]
        cpu1 = server.cpu_times()
        gc1 = (await http.get("/_bench/gc")).json()
    return {
        "wall": wall,
        "latencies": [lat for lat, _ in timed],
        "cpu": (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system),
        "cpu_system": cpu1.system - cpu0.system,
        "events": sum(ev for _, ev in warm) + sum(ev for _, ev in timed),
        "events_per_response": sorted({ev for _, ev in timed}),
        "spooled": spooled,
        "gc": gc1["seconds"] - gc0["seconds"],
        "gc_full": gc1["collections"][2] - gc0["collections"][2],
        "switches": gc1["switches"] - gc0["switches"],
    }


def main(argv: list[str]) -> None:
    url, pid, concurrency, n = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    print(json.dumps(asyncio.run(run(url, pid, concurrency, n))))


if __name__ == "__main__":
    main(sys.argv[1:])
