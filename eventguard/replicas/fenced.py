"""The response store under leases: a write of a replica that lost its lease is refused.

:class:`FencedResponseProvider` is the :class:`~eventguard.SqlResponseProvider` with its two
fencing hooks filled in. Each runs inside the provider's own write transaction, so the envelope and
the lease commit together or not at all:

- ``update_response`` (and ``create_response``: 2.2.0b1's host writes a background run's only
  envelope at its end) of a response this replica leased goes on only while the lease row still has
  this replica as owner and the token it took (``UPDATE ... WHERE owner = :me AND fencing_token =
  :t``); a terminal envelope also ends the lease in that statement. Refused: the envelope is left as
  the new owner (or the reaper) wrote it, the refusal is an anomaly (``fenced_out``) on the
  response's lifecycle, and the host sees a storage error.
- ``delete_response`` goes on only when no other replica runs the response under a live lease.
- ``get_response`` of an in-flight envelope another live replica runs is that envelope with the
  events the sink stored since folded in (:mod:`eventguard.replicas.snapshot`): the host's GET
  fallback then answers the freshest verified state, not the ``response.created`` snapshot.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncConnection

from eventguard.envelopes import key as _key
from eventguard.envelopes import user_of as _user_of
from eventguard.provider import ProviderStorageError, SqlResponseProvider
from eventguard.replicas import leases as lease_sql
from eventguard.replicas import snapshot as snapshots
from eventguard.sql.engine import BorrowedEngine, borrow_engine

if TYPE_CHECKING:
    from eventguard.replicas.replica import Replica

log = logging.getLogger(__name__)

#: The host's terminal statuses: an envelope with one of them ends the lease.
TERMINAL = frozenset({"completed", "incomplete", "failed", "cancelled"})


class FencedOutError(ProviderStorageError):
    """This replica lost the lease of the response (paused, partitioned, reaped): its write was
    refused by the database, and recorded as an anomaly."""


class LeaseUnavailableError(ProviderStorageError):
    """The database did not answer the claim of a run's lease (an outage, a lost connection): the
    run fails inside its guard (recorded, and answered ``failed`` by the host), never silently."""


class InFlightElsewhereError(ProviderStorageError):
    """Another replica runs the response under a live lease: it cannot be deleted now."""


class FencedResponseProvider(SqlResponseProvider):
    """:class:`~eventguard.SqlResponseProvider` whose writes are fenced by a :class:`Replica`'s
    leases (same arguments; ``replica`` is set by the replica that owns it)."""

    replica: Replica | None = None

    def bound_idle_transactions(self, seconds: float) -> bool:
        """On the application's engine (borrowed): end the session of a transaction of the
        provider's that sits idle for longer than ``seconds`` (``SET LOCAL``, with its schema), by
        taking the borrowed engine with that setting too. False for any other engine (the
        replica's own pool gets the setting on each new connection)."""
        engine = self.engine
        if not isinstance(engine, BorrowedEngine):
            return False
        self._engine = borrow_engine(
            engine.lender,
            schema=self.schema,
            busy_timeout_ms=int(self._busy_timeout * 1000),
            statement_timeout=self._statement_timeout,
            idle_in_transaction_timeout=seconds,
        )
        return True

    async def get_response(self, response_id: str, *, context: Any = None) -> Any:
        found = await super().get_response(response_id, context=context)
        replica = self.replica
        if replica is None or not isinstance(found, dict) or found.get("status") not in snapshots.IN_FLIGHT:
            return found
        user = _user_of(context)
        if not await replica.running_elsewhere(response_id, user if isinstance(user, str) else None):
            return found  # ours (the host answers from its live record), or nobody's
        return await replica.folded(response_id, found)

    async def update_response(self, response: Any, *, context: Any = None) -> None:
        try:
            await super().update_response(response, context=context)
        except FencedOutError as exc:
            await self._note_fenced_out(response, exc)
            raise

    async def create_response(
        self, response: Any, input_items: Any, history_item_ids: Any, *, context: Any = None
    ) -> None:
        # 2.2.0b1's host writes a background run's only envelope at its end, with create_response.
        try:
            await super().create_response(response, input_items, history_item_ids, context=context)
        except FencedOutError as exc:
            await self._note_fenced_out(response, exc)
            raise

    async def _note_fenced_out(self, response: Any, exc: FencedOutError) -> None:
        """Record, as an anomaly of the response, a write the database refused by its fencing token."""
        replica = self.replica
        if replica is not None:
            response_id = response.get("id") if isinstance(response, dict) else None
            await replica.record_fenced_out(str(response_id), str(exc))

    async def _fence_update(
        self, conn: AsyncConnection, part: str, response_id: str, status: str | None
    ) -> None:
        replica = self.replica
        if replica is None:
            return
        key = _key(response_id)
        token = replica.tokens.get((part, key))
        if token is None:
            return  # not a lease of this replica (no lease at all: a store-only write)
        if status in TERMINAL:
            held = await lease_sql.end_fenced(conn, part, key, replica.identity, token, status)
        else:
            held = await lease_sql.touch_fenced(conn, part, key, replica.identity, token)
        if not held:
            replica.tokens.pop((part, key), None)
            raise FencedOutError(
                f"replica {replica.identity!a} no longer holds the lease of response {response_id!a} "
                f"(fencing token {token}): its {status} write was refused"
            )
        if status in TERMINAL:
            replica.tokens.pop((part, key), None)
            replica.ended.add((part, key))

    async def _fence_delete(self, conn: AsyncConnection, part: str, response_id: str) -> None:
        replica = self.replica
        if replica is None:
            return
        if not await lease_sql.mark_deleted(conn, part, _key(response_id), replica.identity):
            raise InFlightElsewhereError(f"response {response_id!a} is in flight on another replica")
