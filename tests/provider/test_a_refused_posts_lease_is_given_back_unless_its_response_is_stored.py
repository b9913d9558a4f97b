"""A lease claimed for a POST the host refused is given back (the id may be posted again, as on
one server), but never once the response's envelope is stored after all (a handler the host ran
before answering an error): that lease is ended, so the id stays taken on every replica.
Real ``FencedResponseProvider`` and ``Replica`` on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import select

from eventguard.envelopes import key as row_key
from eventguard.envelopes import partition
from eventguard.replicas import ReplicaOptions
from eventguard.replicas.fenced import FencedResponseProvider
from eventguard.replicas.replica import Replica
from eventguard.replicas.table import leases

from .conftest import Database


def _envelope(response_id: str) -> dict[str, Any]:
    return {"id": response_id, "object": "response", "status": "failed", "output": []}


@pytest.mark.parametrize("stored", [False, True], ids=["nothing_stored", "stored_after_all"])
async def test_a_refused_posts_lease_is_given_back_only_when_nothing_is_stored(
    sql_database: Database, stored: bool
) -> None:
    assert sql_database.url is not None
    provider = FencedResponseProvider(sql_database.url, schema=sql_database.schema)
    replica = Replica(ReplicaOptions(identity="a", lease=30.0), provider)
    other = Replica(ReplicaOptions(identity="b", lease=30.0), provider)
    rid = "caresp_refused_post"
    async with asyncio.timeout(60):
        await provider.start()
        try:
            assert await replica.claim_id(rid, None)
            if stored:
                await provider.create_response(_envelope(rid), [], [])
            await replica.release_unrun(rid, None)
            async with provider.engine.begin() as conn:
                state = (
                    await conn.execute(
                        select(leases.c.state).where(
                            leases.c.partition == partition(None), leases.c.response_key == row_key(rid)
                        )
                    )
                ).scalar_one()
            assert state == ("ended" if stored else "deleted")
            assert replica.tokens == {}
            assert await other.claim_id(rid, None) is (not stored)
        finally:
            await provider.aclose()
