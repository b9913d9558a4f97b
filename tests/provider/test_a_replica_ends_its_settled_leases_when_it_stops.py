"""At exit, a replica ends the leases of the runs that ended here instead of leaving them ``running``.

``Replica.stop`` gives the settlements still running (``settle_later``, one per handler that ended)
a bounded chance to finish, looking at the store at once; a lease whose stored envelope is already
terminal is then ended under its token. One still in flight is left for another replica's reaper,
said so in a log line. Before, the settlements were cancelled with the event loop: the lease stayed
``running`` up to six leases (renewed by nobody, until it expired), and a reaper then ended a response
that had completed as ``failed``, cause ``owner_lost``.

The stored terminal here is written without this replica's token (a store-only write, as another
process or ``eventguard`` itself would make): the write that does not end the lease on its own.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from azure.ai.agentserver.responses._response_context import ResponseContext
from azure.ai.agentserver.responses.models.runtime import ResponseModeFlags

from eventguard.envelopes import key as row_key
from eventguard.envelopes import partition
from eventguard.provider import SqlResponseProvider
from eventguard.replicas import ReplicaOptions
from eventguard.replicas import leases as lease_sql
from eventguard.replicas.fenced import FencedResponseProvider
from eventguard.replicas.replica import STOP_SETTLE_WAIT, Replica

from .conftest import Database

LEASE = 2.0


def _context(response_id: str) -> ResponseContext:
    flags = ResponseModeFlags(stream=False, store=True, background=True)
    return ResponseContext(response_id=response_id, mode_flags=flags)


def _envelope(response_id: str, status: str) -> dict[str, Any]:
    return {"id": response_id, "object": "response", "status": status, "output": []}


def _of_a_replica(task: asyncio.Task[Any]) -> bool:
    return task is not asyncio.current_task() and task.get_coro().__qualname__.startswith("Replica.")


async def _exit_the_loop() -> None:
    """What the end of ``asyncio.run`` (uvicorn's loop) does to the tasks still running."""
    left = [t for t in asyncio.all_tasks() if _of_a_replica(t)]
    for task in left:
        task.cancel()
    await asyncio.gather(*left, return_exceptions=True)


@pytest.mark.parametrize("status", ["completed", "in_progress"])
async def test_stop_ends_the_lease_of_a_run_whose_terminal_is_stored_and_leaves_the_others(
    sql_database: Database, status: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert sql_database.url is not None
    provider = FencedResponseProvider(sql_database.url, schema=sql_database.schema)
    writer = SqlResponseProvider(sql_database.url, schema=sql_database.schema)  # no token: store only
    replica = Replica(ReplicaOptions(identity="owner", lease=LEASE), provider)
    rid = f"resp_stopped_{status}"
    context = _context(rid)
    where = (partition(context), row_key(rid))
    async with asyncio.timeout(60):
        await provider.start()
        await writer.start()
        try:
            await replica.claim_run(rid, context)
            token = replica.tokens[where]
            await writer.create_response(_envelope(rid, status), [], [])
            replica.settle_later(rid, context)  # the handler ended just before shutdown
            await asyncio.sleep(0.1)
            loop = asyncio.get_running_loop()
            started = loop.time()
            with caplog.at_level(logging.WARNING, logger="eventguard.replicas.replica"):
                await replica.stop()
            took = loop.time() - started
            await _exit_the_loop()
            async with provider.engine.begin() as conn:
                lease = await lease_sql.lease_of(conn, *where)
            assert lease is not None and lease.fencing_token == token
            assert took < STOP_SETTLE_WAIT + 1.0, took
            if status == "completed":
                assert lease.state == "ended", lease
                assert replica.tokens == {}
            else:  # in flight: the reaper's, after the lease
                assert lease.state == "running", lease
                assert any("left for another replica's reaper" in r.getMessage() for r in caplog.records)
        finally:
            await writer.aclose()
            await provider.aclose()
