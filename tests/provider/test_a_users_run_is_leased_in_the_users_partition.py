"""A run of a user (``x-agent-user-id``) is leased in the partition the host stores it in.

The host gives its handler a ``ResponseContext``, whose user is ``platform_context.user_id_key``
(it has no ``user_id_key`` of its own, 2.2.0b1 and 2.4.0b1), and its store the ``PlatformContext``
itself. Both must name one partition (``eventguard.envelopes.partition``): before, the lease of every
user's run was taken in ``anonymous``, so the host's terminal write (in the user's partition) found no
token, went unfenced, and did not end the lease; with a client-chosen id (``claim_id``, from the
request's header) the run had two leases, the right one and an anonymous one.

Real host contexts, a real ``FencedResponseProvider`` on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from azure.ai.agentserver.responses import PlatformContext
from azure.ai.agentserver.responses._response_context import ResponseContext
from azure.ai.agentserver.responses.models.runtime import ResponseModeFlags
from sqlalchemy import select

from eventguard.envelopes import key as row_key
from eventguard.envelopes import partition
from eventguard.replicas import ReplicaOptions
from eventguard.replicas.fenced import FencedResponseProvider
from eventguard.replicas.replica import Replica
from eventguard.replicas.table import leases
from eventguard.sql.tables import provider_responses

from .conftest import Database

USER = "alice"


def _context(response_id: str) -> ResponseContext:
    flags = ResponseModeFlags(stream=False, store=True, background=True)
    return ResponseContext(
        response_id=response_id, mode_flags=flags, platform_context=PlatformContext(user_id_key=USER)
    )


def _envelope(response_id: str, status: str) -> dict[str, Any]:
    return {"id": response_id, "object": "response", "status": status, "output": []}


def test_the_handlers_context_and_the_stores_context_name_one_partition() -> None:
    context = _context("resp_one_partition")
    assert partition(context) == partition(context.platform_context) == row_key(USER)


@pytest.mark.parametrize("client_chosen_id", [False, True], ids=["host_id", "client_id"])
async def test_a_users_run_has_one_lease_in_its_partition_ended_by_its_fenced_terminal(
    sql_database: Database, client_chosen_id: bool
) -> None:
    assert sql_database.url is not None
    provider = FencedResponseProvider(sql_database.url, schema=sql_database.schema)
    replica = Replica(ReplicaOptions(identity="owner", lease=30.0), provider)
    rid = f"resp_user_{'client' if client_chosen_id else 'host'}"
    context = _context(rid)
    stored_in = context.platform_context  # what the host passes to its store, both ends
    where = (row_key(USER), row_key(rid))
    async with asyncio.timeout(60):
        await provider.start()
        try:
            if client_chosen_id:  # the middleware, from the request's x-agent-user-id
                assert await replica.claim_id(rid, USER)
            await replica.claim_run(rid, context)
            assert set(replica.tokens) == {where}
            token = replica.tokens[where]
            await provider.create_response(_envelope(rid, "in_progress"), [], [], context=stored_in)
            await provider.update_response(_envelope(rid, "completed"), context=stored_in)
            # The fenced terminal ended the lease itself, under the token (settle has nothing left).
            assert replica.tokens == {} and where in replica.ended
            async with provider.engine.begin() as conn:
                rows = (
                    await conn.execute(
                        select(
                            leases.c.partition, leases.c.state, leases.c.ended_status, leases.c.fencing_token
                        ).where(leases.c.response_key == row_key(rid))
                    )
                ).all()
                stored = (
                    await conn.execute(
                        select(provider_responses.c.partition).where(
                            provider_responses.c.response_key == row_key(rid)
                        )
                    )
                ).all()
            assert [tuple(r) for r in rows] == [(row_key(USER), "ended", "completed", token)]
            assert [r[0] for r in stored] == [row_key(USER)]
            assert await provider.get_response(rid, context=stored_in) is not None
        finally:
            await provider.aclose()
