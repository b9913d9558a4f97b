"""Load run of several replicas (a documented command, not CI): issue 16's figures.

    PYTHONPATH=$PWD python -m tests.reliability.replicas [--responses 500] [--replicas 3]

Three replica processes (``tests/upstream/_replica_child.py``) on one PostgreSQL database (a fresh
schema of ``h_r16``); ``--responses`` background responses posted to replicas at random; a tenth are
``hang`` runs cancelled through a *different* replica than the one running them; a third of the
GETs go to a different replica; a third of the responses carry a platform user
(``x-agent-user-id``, on every request about them), so their envelopes and leases live in that
user's partition. Then every response must have ended (none ``in_progress``), every
replica's ``GET`` must equal the stored status, and every event the guards counted must be stored.
Prints one JSON line of figures; exits 1 when any check fails.

    PYTHONPATH=$PWD python -m tests.reliability.replicas --kills 20

Failover instead: two survivors and, 20 times, a victim replica given 4 responses (slow or hanging)
and SIGKILLed at a random point (0-2 s); after its lease every one of its responses must be ended
exactly once (one terminal transition, the lease taken once: token 2, by a survivor), and every event
stored before the kill must still be there. Also checked after the load run: every lease is in the
partition of the envelope it guards (``leases_outside_their_partition``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
import uuid
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import httpx
from azure.ai.agentserver.responses._id_generator import IdGenerator

from tests.upstream.test_provider_e2e import Database, Lifetime, lifetime

DSN = "postgresql://postgres@127.0.0.1:5432/h_r16"
URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/h_r16"


async def _start(
    stack: AsyncExitStack, db: Database, root: Path, prefix: str, n: int, lease: float
) -> list[Lifetime]:
    """``n`` replica processes: the first alone (it creates the schema), then the others at once."""

    def child(i: int) -> Any:
        state = root / f"{prefix}{i}"
        state.mkdir()
        module = "tests.upstream._replica_child"
        return lifetime(db, state, "uvicorn", "chat", module=module, args=(str(lease),))

    first = await stack.enter_async_context(child(0))
    rest = await asyncio.gather(*(stack.enter_async_context(child(i)) for i in range(1, n)))
    return [first, *rest]


async def run(n: int, replicas: int, lease: float) -> dict[str, Any]:
    conn = await asyncpg.connect(DSN)
    schema = f"eg_load_{uuid.uuid4().hex[:10]}"
    await conn.execute(f'CREATE SCHEMA "{schema}"')
    await conn.execute(f'SET search_path TO "{schema}"')
    db = Database(URL, schema)
    pool = await asyncpg.create_pool(DSN, min_size=1, max_size=8, server_settings={"search_path": schema})
    rng = random.Random(16)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            async with AsyncExitStack() as stack:
                servers = await _start(stack, db, Path(tmp), "r", replicas, lease)
                bases = [s.base_url for s in servers]
                http = await stack.enter_async_context(httpx.AsyncClient(timeout=60))
                limit = asyncio.Semaphore(32)
                cancels = {"asked": 0, "cancelled": 0}
                missed: list[dict[str, Any]] = []
                other_gets = 0
                users: dict[str, dict[str, str]] = {}
                started = time.perf_counter()

                async def one(i: int) -> tuple[str, str]:
                    nonlocal other_gets
                    async with limit:
                        home = rng.randrange(replicas)
                        rid = IdGenerator.new_response_id()
                        hang = i % 10 == 0
                        user = {"x-agent-user-id": f"user-{i % 7}"} if i % 3 == 1 else {}
                        users[rid] = user
                        body = {"model": "m", "input": "hang" if hang else f"quick {i}", "background": True}
                        headers = {"x-agent-response-id": rid, **user}
                        created = await http.post(f"{bases[home]}/responses", json=body, headers=headers)
                        created.raise_for_status()
                        if hang:
                            away = (home + 1 + rng.randrange(replicas - 1)) % replicas
                            lease_sql = "SELECT 1 FROM eventguard_leases WHERE response_id = $1"
                            while not await pool.fetchval(lease_sql, json.dumps(rid)):  # noqa: ASYNC110
                                await asyncio.sleep(0.05)
                            cancels["asked"] += 1
                            answer = await http.post(f"{bases[away]}/responses/{rid}/cancel", headers=user)
                            if answer.status_code == 200 and answer.json()["status"] == "cancelled":
                                cancels["cancelled"] += 1
                            else:  # what a cancel that did not cancel answered, for the report
                                missed.append({"code": answer.status_code, "body": answer.text[:300]})
                        while True:
                            where = rng.randrange(replicas) if rng.random() < 1 / 3 else home
                            other_gets += where != home
                            got = await http.get(f"{bases[where]}/responses/{rid}", headers=user)
                            status = got.json()["status"]
                            if status not in ("queued", "in_progress"):
                                return rid, status
                            await asyncio.sleep(0.05)

                ended = await asyncio.gather(*(one(i) for i in range(n)))
                elapsed = time.perf_counter() - started
                await asyncio.sleep(1.0)  # the sinks' last flush
                disagree = 0
                for rid, _status in ended:
                    asked = [await http.get(f"{b}/responses/{rid}", headers=users[rid]) for b in bases]
                    got = {a.json()["status"] for a in asked}
                    stored = await conn.fetchval(
                        "SELECT status FROM eventguard_provider_responses WHERE response_id = $1", rid
                    )
                    disagree += got != {stored}
                stuck = await conn.fetchval(
                    "SELECT count(*) FROM eventguard_responses WHERE status NOT IN"
                    " ('completed', 'incomplete', 'failed', 'cancelled', 'interrupted')"
                )
                lost = await conn.fetchval(
                    "SELECT coalesce(sum(r.event_count - (SELECT count(*) FROM eventguard_events e"
                    " WHERE e.response_id = r.response_id)), 0) FROM eventguard_responses r"
                )
                running_sql = "SELECT count(*) FROM eventguard_leases WHERE state = 'running'"
                running = await conn.fetchval(running_sql)
                # A lease guards the envelope with its partition and key: one outside it fences nothing.
                outside = await conn.fetchval(
                    "SELECT count(*) FROM eventguard_leases l WHERE NOT EXISTS (SELECT 1 FROM"
                    " eventguard_provider_responses p WHERE p.partition = l.partition"
                    " AND p.response_key = l.response_key)"
                )
                keyed = sum(1 for u in users.values() if u)
                statuses: dict[str, int] = {}
                for _rid, status in ended:
                    statuses[status] = statuses.get(status, 0) + 1
        return {
            "responses": n, "replicas": replicas, "seconds": round(elapsed, 1),
            "per_second": round(n / elapsed, 1), "statuses": statuses, "cancels_relayed": cancels,
            "cancels_missed": missed,
            "gets_on_another_replica": other_gets, "replicas_disagreeing": disagree,
            "lifecycles_not_ended": stuck, "events_lost": int(lost), "leases_still_running": running,
            "responses_with_a_user": keyed, "leases_outside_their_partition": outside,
        }  # fmt: skip
    finally:
        await pool.close()
        await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await conn.close()


async def kills(rounds: int, lease: float) -> dict[str, Any]:
    conn = await asyncpg.connect(DSN)
    schema = f"eg_kill_{uuid.uuid4().hex[:10]}"
    await conn.execute(f'CREATE SCHEMA "{schema}"')
    await conn.execute(f'SET search_path TO "{schema}"')
    db = Database(URL, schema)
    rng = random.Random(20)
    module = "tests.upstream._replica_child"
    figures = {"rounds": rounds, "responses": 0, "ended_once": 0, "not_ended": 0, "ended_twice": 0,
               "events_before_kill": 0, "events_lost": 0, "reaped_by_survivors": 0}  # fmt: skip
    try:
        with tempfile.TemporaryDirectory() as tmp:
            async with AsyncExitStack() as stack:
                survivors = await _start(stack, db, Path(tmp), "s", 2, lease)
                names = {s.printed("IDENTITY ")[0][9:] for s in survivors}
                http = await stack.enter_async_context(httpx.AsyncClient(timeout=60))
                for k in range(rounds):
                    state = Path(tmp) / f"v{k}"
                    state.mkdir()
                    ids = [IdGenerator.new_response_id() for _ in range(4)]
                    doomed = lifetime(db, state, "uvicorn", "chat", module=module, args=(str(lease),))
                    async with doomed as victim:
                        for j, rid in enumerate(ids):
                            body = {"model": "m", "input": "slow" if j % 2 else "hang", "background": True}
                            await http.post(f"{victim.base_url}/responses", json=body,
                                            headers={"x-agent-response-id": rid})  # fmt: skip
                        await asyncio.sleep(rng.uniform(0, 2.0))
                        before = await conn.fetch(
                            "SELECT response_id, count(*) AS n FROM eventguard_events"
                            " WHERE response_id = any($1::text[]) GROUP BY response_id",
                            ids,
                        )
                        victim.process.kill()
                    async with asyncio.timeout(60):
                        while await conn.fetchval(  # noqa: ASYNC110
                            "SELECT count(*) FROM eventguard_leases WHERE state = 'running'"
                        ):
                            await asyncio.sleep(0.1)
                    figures["responses"] += len(ids)
                    for rid in ids:
                        terminals = await conn.fetchval(
                            "SELECT count(*) FROM eventguard_transitions WHERE response_id = $1"
                            " AND to_state IN ('completed', 'incomplete', 'failed', 'cancelled')",
                            rid,
                        )
                        figures["ended_once"] += terminals == 1
                        figures["ended_twice"] += terminals > 1
                        figures["not_ended"] += terminals == 0
                        lease_row = await conn.fetchrow(
                            "SELECT ended_by, fencing_token FROM eventguard_leases WHERE response_id = $1",
                            json.dumps(rid),
                        )
                        if lease_row is not None and lease_row["ended_by"] in names:
                            figures["reaped_by_survivors"] += 1
                    for row in before:
                        figures["events_before_kill"] += row["n"]
                        now = await conn.fetchval(
                            "SELECT count(*) FROM eventguard_events WHERE response_id = $1",
                            row["response_id"],
                        )
                        figures["events_lost"] += max(row["n"] - now, 0)
        return figures
    finally:
        await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--responses", type=int, default=500)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--lease", type=float, default=5.0)
    parser.add_argument("--kills", type=int, default=0, help="the failover run instead: this many kills")
    args = parser.parse_args()
    if args.kills:
        found = asyncio.run(asyncio.wait_for(kills(args.kills, min(args.lease, 1.5)), 1800))
        print(json.dumps(found))
        sys.exit(0 if found["ended_once"] == found["responses"] and found["events_lost"] == 0 else 1)
    figures = asyncio.run(asyncio.wait_for(run(args.responses, args.replicas, args.lease), 1800))
    print(json.dumps(figures))
    ok = (
        figures["replicas_disagreeing"] == figures["lifecycles_not_ended"] == figures["events_lost"] == 0
        and figures["cancels_relayed"]["cancelled"] == figures["cancels_relayed"]["asked"]
        and figures["leases_still_running"] == figures["leases_outside_their_partition"] == 0
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
