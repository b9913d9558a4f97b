"""Child process of the crash-recovery test: streams guarded responses into SQLite until killed.

Usage: python -m tests.reliability._crash_child DB_URL SPOOL SEED
Prints ``READY`` once the sink is up, then ``F <response_id> <n>`` each time the first ``n`` events
of a response are known durable (``sink.flush()`` returned and nothing was spooled).
"""

from __future__ import annotations

import asyncio
import random
import sys
from collections.abc import AsyncIterator
from typing import Any

from eventguard import SqlSink, guard


def script(rid: str, n: int, final: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {"id": rid, "status": "in_progress"}},
        {"type": "response.in_progress", "response": {"id": rid, "status": "in_progress"}},
    ]
    events += [{"type": "response.output_text.delta", "delta": f"{rid}-{i}-" + "x" * 200} for i in range(n)]
    etype = "response.completed" if final == "completed" else "response.failed"
    resp: dict[str, Any] = {"id": rid, "status": final}
    if final == "failed":
        resp["error"] = {"code": "server_error", "message": "boom"}
    events.append({"type": etype, "response": resp})
    return events


async def stream(events: list[dict[str, Any]], rng: random.Random) -> AsyncIterator[dict[str, Any]]:
    for ev in events:
        await asyncio.sleep(rng.random() * 0.004)
        yield ev


async def one(sink: SqlSink, rid: str, rng: random.Random) -> None:
    events = script(rid, rng.randint(5, 40), rng.choice(["completed", "completed", "failed"]))
    n = 0
    async with asyncio.timeout(60):
        async with guard(stream(events, rng), asyncio.Event(), sink=sink) as g:
            async for _ in g:
                n += 1
                if n % 7 == 0:
                    spooled = sink.stats.batches_spooled
                    await sink.flush()
                    if sink.stats.batches_spooled == spooled:
                        print(f"F {rid} {n}", flush=True)


async def main(url: str, spool: str, seed: int) -> None:
    rng = random.Random(seed)
    async with SqlSink(url, spool_path=spool, flush_interval=0.005) as sink:
        print("READY", flush=True)
        k = 0
        while True:
            batch = [one(sink, f"resp_{seed}_{k + j}", rng) for j in range(6)]
            k += 6
            async with asyncio.timeout(120):
                await asyncio.gather(*batch)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
