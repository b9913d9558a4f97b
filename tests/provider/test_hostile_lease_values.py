"""Hostile values in the replicas' lease rows (migration 0005), counted: response ids and user keys,
the headers a relayed cancel carries, the ids the reaper ends; and what a refused POST leaves behind.

On SQLite and PostgreSQL, through a :class:`Replica` over a :class:`FencedResponseProvider` (the same
objects ``GuardedResponses(replicas=...)`` builds) and, for a POST the host refuses, the real
``ResponsesHostServer`` in-process. For each value: the lease row gives back exactly what went in
(the id, the owner, the headers), fencing still holds, and the reaper names and ends exactly that
response; or a typed error. ``EVENTGUARD_HOSTILE_REPORT`` (a file) collects the tallies.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from azure.ai.agentserver.responses import PlatformContext

from eventguard import ResponseStore
from eventguard.foundry import GuardedResponsesHostServer
from eventguard.provider import _key, _partition
from eventguard.replicas import ReplicaOptions
from eventguard.replicas import leases as lease_sql
from eventguard.replicas.fenced import FencedResponseProvider
from eventguard.replicas.replica import Replica, reap
from eventguard.testing import ScriptedChatClient, chat_agent
from tests._hostile import LOOKALIKES, STRINGS, Tally, record

from .conftest import Database

T = 120.0
VALUES: dict[str, str] = {**STRINGS, **LOOKALIKES}


@asynccontextmanager
async def replicas(db: Database, *names: str, **options: Any) -> AsyncIterator[list[Replica]]:
    """Replicas (not started: no loops; each call is made by the test) on one database."""
    made: list[Replica] = []
    try:
        for name in names:
            provider = FencedResponseProvider(db.url, schema=db.schema)
            await provider.start()
            made.append(Replica(ReplicaOptions(identity=name, lease=3600.0, **options), provider))
        yield made
    finally:
        for replica in made:
            await replica.provider.aclose()


def envelope(rid: str, status: str = "in_progress") -> dict[str, Any]:
    return {"id": rid, "object": "response", "status": status, "output": []}


async def lease(replica: Replica, rid: str, user: str | None) -> lease_sql.Lease | None:
    async with replica._tx() as conn:
        return await lease_sql.lease_of(conn, _partition(PlatformContext(user_id_key=user)), _key(rid))


async def _claimed_fenced_and_ended(a: Replica, b: Replica, rid: str, user: str | None) -> list[str]:
    """Claim ``rid`` on ``a``; what differs from the rules (empty: every step exact)."""
    wrong: list[str] = []
    ctx = PlatformContext(user_id_key=user)
    if not await a.claim_id(rid, user):
        return ["a fresh id was not claimed"]
    if await b.claim_id(rid, user):
        wrong.append("a second replica claimed a live id")
    got = await lease(a, rid, user)
    if got is None or (got.response_id, got.owner, got.state) != (rid, a.identity, "running"):
        wrong.append(f"the lease row reads back as {got!a:.160}")
    if not await b.running_elsewhere(rid, user) or await a.running_elsewhere(rid, user):
        wrong.append("running_elsewhere does not see the owner")
    await a.provider.create_response(envelope(rid), None, None, context=ctx)
    await a.provider.update_response(envelope(rid, "completed"), context=ctx)  # ends the lease, fenced
    got = await lease(a, rid, user)
    if got is None or got.state != "ended" or got.fencing_token != 1:
        wrong.append(f"the terminal write did not end the lease: {got!a:.160}")
    if (await a.provider.get_response(rid, context=ctx))["status"] != "completed":
        wrong.append("the envelope did not read back")
    return wrong


@pytest.mark.parametrize("slot", ["response_id", "user_key"])
async def test_each_hostile_id_and_user_round_trips_through_its_lease_and_fencing_holds(
    sql_database: Database, slot: str
) -> None:
    tally = Tally()
    async with asyncio.timeout(T), replicas(sql_database, "replica-a", "replica-b") as (a, b):
        for n, (kind, value) in enumerate(VALUES.items()):
            rid = value + f"#l{n}" if slot == "response_id" else f"caresp_l{n}"
            user = value if slot == "user_key" else None
            wrong = await _claimed_fenced_and_ended(a, b, rid, user)
            tally.bad(kind, "; ".join(wrong)) if wrong else tally.exact()
    line = record(tally, f"leases {sql_database.kind} {slot}")
    assert tally.wrong == [], line
    assert tally.went_in == tally.came_back_exact == len(VALUES), line


#: Header values a relayed cancel keeps: what HTTP can carry (latin-1), hostile.
HEADER_VALUES: dict[str, str] = {
    kind: value
    for kind, value in {**VALUES, "crlf": "a\r\nx-injected: 1"}.items()
    if all(ord(c) < 256 for c in value)
}


async def test_each_hostile_cancel_header_is_kept_exactly_and_delivered_once_to_the_owner(
    sql_database: Database,
) -> None:
    tally = Tally()
    delivered: list[dict[str, Any]] = []

    async def owners_host(scope: dict[str, Any], receive: Any, send: Any) -> None:
        delivered.append(scope)  # what the owner's host would be asked: the path and the headers

    async with asyncio.timeout(T), replicas(sql_database, "owner", "relay", cancel_wait=0.05) as (a, b):
        a._app = owners_host
        for n, (kind, value) in enumerate(HEADER_VALUES.items()):
            rid = f"caresp_h{n}"
            sent = {"x-agent-user-id": "u" + value, "authorization": "Bearer " + value, "x-other": value}
            kept = {k: v for k, v in sent.items() if k != "x-other"}
            user = sent["x-agent-user-id"]
            assert await a.claim_id(rid, user)
            await b.relay_cancel(rid, user, sent)
            async with a._tx() as conn:
                taken = await lease_sql.take_cancels(conn, a.identity)
                again = await lease_sql.take_cancels(conn, a.identity)
            if [(t.response_id, t.cancel_headers) for t in taken] != [(rid, kept)] or again:
                tally.bad(kind, f"taken {taken!a:.160}, again {again!a:.80}")
                continue
            delivered.clear()
            await a._deliver(rid, kept)
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in delivered[0]["headers"]}
            if delivered[0]["path"] != f"/responses/{rid}/cancel" or any(
                headers[k] != v for k, v in kept.items()
            ):
                tally.bad(kind, f"delivered {delivered[0]!a:.200}")
                continue
            tally.exact()
    line = record(tally, f"leases {sql_database.kind} cancel headers")
    assert tally.wrong == [], line
    assert tally.went_in == tally.came_back_exact == len(HEADER_VALUES), line


async def test_the_reaper_ends_exactly_the_responses_of_hostile_expired_leases(
    sql_database: Database,
) -> None:
    tally = Tally()
    async with asyncio.timeout(T), replicas(sql_database, "dead-replica") as (dead,):
        ids = {kind: value + f"#r{n}" for n, (kind, value) in enumerate(VALUES.items())}
        for rid in ids.values():
            async with dead._tx() as conn:
                token = await lease_sql.claim(
                    conn, partition=_partition(None), key=_key(rid), response_id=rid, owner=dead.identity,
                    lease=-1.0, takeover=False,
                )  # fmt: skip
            assert token == 1
            await dead.provider.create_response(envelope(rid), None, None)
        reaped = await reap(dead.provider.engine, reaper="hostile-reaper")
        async with ResponseStore(sql_database.url, schema=sql_database.schema) as store:
            for kind, rid in ids.items():
                stored = await dead.provider.get_response(rid)
                row = await store.get(rid)
                if reaped.count(rid) != 1:
                    tally.bad(kind, f"reaped {reaped.count(rid)} times")
                elif stored["status"] != "failed" or stored["id"] != rid:
                    tally.bad(kind, f"the envelope reads {stored!a:.120}")
                elif row is None or (row.status, row.cause) != ("failed", "owner_lost"):
                    tally.bad(kind, f"the lifecycle row reads {row!a:.120}")
                else:
                    tally.exact()
        assert sorted(reaped) == sorted(ids.values())  # nothing else, and nothing twice
        assert await reap(dead.provider.engine) == []
    line = record(tally, f"leases {sql_database.kind} reaped ids")
    assert tally.wrong == [], line
    assert tally.went_in == tally.came_back_exact == len(VALUES), line


# -- a POST the host refuses ------------------------------------------------------------------------


#: Ids in ``x-agent-response-id`` the host refuses: 400 (not its format) or its own 500 (its task id
#: contract, ``[a-zA-Z0-9_-]``, checked after the request was accepted).
REFUSED_IDS: dict[str, str] = {
    "too_short": "caresp_short",
    "no_prefix": "x" * 50,
    "one_megabyte": "caresp_" + "m" * (1 << 20),
    **{kind: "caresp_" + (v + "0" * 50)[:50] for kind, v in VALUES.items() if len(v) < 50 and v.isascii()},
}


async def test_a_post_the_host_refuses_leaves_no_running_lease(sql_database: Database) -> None:
    agent, _probe = chat_agent(ScriptedChatClient(("done",)))
    server = GuardedResponsesHostServer(
        agent,
        database=sql_database.url,
        schema=sql_database.schema,
        replicas=ReplicaOptions(identity="refusing-replica", lease=3600.0),
        configure_observability=None,
    )
    transport = httpx.ASGITransport(app=server, raise_app_exceptions=False)
    tally = Tally()
    storage = server.eventguard_storage
    assert storage is not None and storage.replica is not None
    async with (
        asyncio.timeout(T),
        server.router.lifespan_context(server),
        httpx.AsyncClient(transport=transport, base_url="http://host", timeout=T) as client,
    ):
        for kind, rid in REFUSED_IDS.items():
            answer = await client.post(
                "/responses", json={"model": "m", "input": "hi"}, headers={"x-agent-response-id": rid}
            )
            if answer.status_code == 200:
                tally.bad(kind, "accepted")
                continue
            left = await lease(storage.replica, rid, None)
            if left is not None and left.state == "running":
                tally.bad(kind, f"HTTP {answer.status_code}, lease left running")
            else:
                tally.refused(f"http_{answer.status_code}")
    line = record(tally, f"leases {sql_database.kind} refused POSTs")
    assert tally.wrong == [], line
