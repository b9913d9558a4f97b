"""After a run's handler ends, its replica keeps the lease (renewed under its token) until the host's
terminal write, even when that write comes later than one lease (seen under heavy load); the wait
is bounded (``settle_wait``), and a response with nothing in flight in the store ends it as before.
Before, ``Replica.settle`` ended the lease one lease after the handler, never renewing meanwhile, so
the late terminal found the lease ended (and written unfenced).

Whether the host stores the response decides what "nothing stored" means (the host's own
``ResponseContext`` of each end, ``mode_flags.store``): stored, it is a terminal still to come (the
host writes the envelope of a run that ended before its ``response.created`` once, at the end), so the
lease is kept for it; ``store=false``, the host writes nothing, so the lease ends at once.
Before, "never stored" ended the wait after one lease, and a later terminal was written unfenced."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from azure.ai.agentserver.responses._response_context import ResponseContext
from azure.ai.agentserver.responses.models.runtime import ResponseModeFlags
from sqlalchemy import select

from eventguard.envelopes import key as row_key
from eventguard.envelopes import partition
from eventguard.replicas import ReplicaOptions
from eventguard.replicas import leases as lease_sql
from eventguard.replicas.fenced import TERMINAL, FencedResponseProvider
from eventguard.replicas.replica import Replica
from eventguard.replicas.table import leases

from .conftest import Database

LEASE = 1.0
#: The host's terminal write lands this long after the handler's end: well past one lease.
LATE = 3.5 * LEASE


class LateTerminal(FencedResponseProvider):
    """The host's store under heavy load: a terminal write (``update_response``, or the
    ``create_response`` of an envelope written only at the end) starts ``LATE`` seconds late."""

    async def update_response(self, response: Any, *, context: Any = None) -> None:
        if isinstance(response, dict) and response.get("status") in TERMINAL:
            await asyncio.sleep(LATE)
        await super().update_response(response, context=context)

    async def create_response(
        self, response: Any, input_items: Any, history_item_ids: Any, *, context: Any = None
    ) -> None:
        if isinstance(response, dict) and response.get("status") in TERMINAL:
            await asyncio.sleep(LATE)
        await super().create_response(response, input_items, history_item_ids, context=context)


def _host_context(response_id: str, *, store: bool) -> ResponseContext:
    """The context the host (this environment's end) gives a background run's handler."""
    flags = ResponseModeFlags(stream=False, store=store, background=True)
    return ResponseContext(response_id=response_id, mode_flags=flags)


def _context(response_id: str) -> SimpleNamespace:
    return SimpleNamespace(
        response_id=response_id, user_id_key=None, mode_flags=SimpleNamespace(background=True)
    )


def _envelope(response_id: str, status: str) -> dict[str, Any]:
    return {"id": response_id, "object": "response", "status": status, "output": []}


async def _lease_row(provider: FencedResponseProvider, response_id: str) -> tuple[Any, ...]:
    """(state, fencing token, expired, ended status) of the response's lease row."""
    part, key = partition(_context(response_id)), row_key(response_id)
    L = leases.c
    async with provider.engine.begin() as conn:
        lease = await lease_sql.lease_of(conn, part, key)
        ended = select(L.ended_status).where(L.partition == part, L.response_key == key)
        status = (await conn.execute(ended)).scalar_one()
    assert lease is not None
    return lease.state, lease.fencing_token, lease.expired, status


async def test_the_lease_stays_the_runs_until_a_terminal_write_later_than_one_lease(
    sql_database: Database,
) -> None:
    assert sql_database.url is not None
    provider = LateTerminal(sql_database.url, schema=sql_database.schema)
    # Not started: no heartbeat and no reaper, as when both are late under load; settle alone renews.
    replica = Replica(ReplicaOptions(identity="owner", lease=LEASE), provider)
    rid = "resp_late_terminal"
    async with asyncio.timeout(60):
        await provider.start()
        try:
            await replica.claim_run(rid, _context(rid))
            token = replica.tokens[(partition(_context(rid)), row_key(rid))]
            await provider.create_response(_envelope(rid, "in_progress"), [], [])
            loop = asyncio.get_running_loop()
            started = loop.time()
            settling = asyncio.create_task(replica.settle(rid, _context(rid)))  # the handler ended
            writing = asyncio.create_task(provider.update_response(_envelope(rid, "completed")))
            seen = []
            while loop.time() < started + LATE - 0.5:  # up to just before the host's write
                seen.append(await _lease_row(provider, rid))
                await asyncio.sleep(0.1)
            assert len(seen) > 10 and set(seen) == {("running", token, False, None)}, seen
            await writing  # the terminal, under the run's token
            async with asyncio.timeout(5):
                await settling
            state, held, _expired, ended_status = await _lease_row(provider, rid)
            assert (state, held, ended_status) == ("ended", token, "completed")  # by the terminal write
            assert (await provider.get_response(rid))["status"] == "completed"
            assert replica.fenced_out == []
        finally:
            await provider.aclose()


async def test_a_stored_response_written_only_at_its_end_keeps_its_lease_for_that_write(
    sql_database: Database,
) -> None:
    """Nothing in the store after the handler, the host storing it: its one write (the terminal
    ``create_response``) is still to come, later than one lease; it lands under the run's token."""
    assert sql_database.url is not None
    provider = LateTerminal(sql_database.url, schema=sql_database.schema)
    replica = Replica(ReplicaOptions(identity="owner", lease=LEASE), provider)
    rid = "resp_stored_at_its_end"
    context = _host_context(rid, store=True)
    async with asyncio.timeout(60):
        await provider.start()
        try:
            await replica.claim_run(rid, context)
            token = replica.tokens[(partition(context), row_key(rid))]
            loop = asyncio.get_running_loop()
            started = loop.time()
            settling = asyncio.create_task(replica.settle(rid, context))  # the handler ended
            writing = asyncio.create_task(provider.create_response(_envelope(rid, "completed"), [], []))
            seen = []
            while loop.time() < started + LATE - 0.5:  # up to just before the host's write
                seen.append(await _lease_row(provider, rid))
                await asyncio.sleep(0.1)
            assert len(seen) > 10 and set(seen) == {("running", token, False, None)}, seen
            await writing
            async with asyncio.timeout(5):
                await settling
            state, held, _expired, ended_status = await _lease_row(provider, rid)
            assert (state, held, ended_status) == ("ended", token, "completed")  # by the terminal write
            assert replica.fenced_out == [] and replica.tokens == {}
        finally:
            await provider.aclose()


@pytest.mark.parametrize(
    ("stored", "store"),
    [(True, True), (False, True), (False, False)],
    ids=["in_flight_never_ended", "never_stored", "store_false"],
)
async def test_without_a_terminal_settle_ends_the_lease_within_its_bound(
    sql_database: Database, stored: bool, store: bool
) -> None:
    """Still in flight in the store, or nothing stored of a response the host stores: the lease is
    kept up to ``settle_wait``, then ended; ``store=false``: given back at once (nothing will be
    written, and the id may be posted again)."""
    assert sql_database.url is not None
    provider = FencedResponseProvider(sql_database.url, schema=sql_database.schema)
    bound = 2.5 * LEASE
    replica = Replica(ReplicaOptions(identity="owner", lease=LEASE, settle_wait=bound), provider)
    rid = "resp_no_terminal"
    context = _host_context(rid, store=store)
    async with asyncio.timeout(60):
        await provider.start()
        try:
            await replica.claim_run(rid, context)
            token = replica.tokens[(partition(context), row_key(rid))]
            if stored:
                await provider.create_response(_envelope(rid, "in_progress"), [], [])
            loop = asyncio.get_running_loop()
            started = loop.time()
            async with asyncio.timeout(bound + 10):
                await replica.settle(rid, context)
            took = loop.time() - started
            state, held, _expired, ended_status = await _lease_row(provider, rid)
            # store=false: given back, as nothing was stored (one server takes the id again).
            expected = ("ended", token, "ended") if store else ("deleted", token, None)
            assert (state, held, ended_status) == expected
            assert replica.tokens == {}
            if store:
                assert took >= bound - 0.01, took
            else:
                assert took < LEASE / 2, took
        finally:
            await provider.aclose()


@pytest.mark.parametrize("wait", [-1.0, float("nan"), float("-inf")])
def test_a_settle_wait_that_bounds_nothing_is_a_value_error(wait: float) -> None:
    with pytest.raises(ValueError, match="settle_wait"):
        ReplicaOptions(settle_wait=wait)
    assert (
        ReplicaOptions(lease=2.0).settle_within == 12.0 and ReplicaOptions(settle_wait=0).settle_within == 0
    )
