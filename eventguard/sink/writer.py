"""Applies batches to the database in one transaction: the only code that writes sink rows.

Every statement is idempotent: keyed inserts use ON CONFLICT DO NOTHING, and the row update is
conditional (never from a terminal state, never backwards), checked by its row count. A status
change the database refuses becomes a :class:`Refusal` and an anomaly row, never a silent no-op.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Insert, Table, and_, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from eventguard.lifecycle import AnomalyKind
from eventguard.sink.batch import Batch
from eventguard.sink.serialise import encode_value
from eventguard.sink.tables import TERMINAL, anomalies, events, responses, transitions


@dataclass(frozen=True, slots=True)
class Refusal:
    """A status the database would not take, because the row already holds a terminal."""

    response_id: str
    attempt: int
    wanted: str
    stored: str
    stored_by: str | None

    @property
    def reason(self) -> str:
        by = f" (written by {self.stored_by})" if self.stored_by else ""
        return f"refused {self.wanted!r} for attempt {self.attempt}: the row is already {self.stored!r}{by}"


def _insert(conn: AsyncConnection, table: Table) -> Insert:
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    return sqlite.insert(table).on_conflict_do_nothing()


_UPDATABLE = [c.name for c in responses.columns if c.name not in ("pk", "response_id", "version")]


async def write(conn: AsyncConnection, batches: Sequence[Batch]) -> list[Refusal]:
    """Write ``batches`` inside the caller's transaction; return the refusals found."""
    refusals: list[Refusal] = []
    extra_anomalies: list[dict[str, Any]] = []
    kept_transitions: list[dict[str, Any]] = []
    for batch in batches:
        refusal = await _write_row(conn, batch)
        if refusal is None:
            kept_transitions.extend(batch.transitions)
            continue
        refusals.append(refusal)
        # A refused terminal transition is not history: it goes into the anomaly instead.
        refused = [t for t in batch.transitions if t["to_state"] in TERMINAL]
        kept_transitions.extend(t for t in batch.transitions if t["to_state"] not in TERMINAL)
        if batch.refusal_idx is not None:
            extra_anomalies.append(_refusal_anomaly(batch, refusal, refused))
    # Children after their rows (foreign keys); one executemany per table for the whole cycle.
    await _insert_many(conn, events, [e for b in batches for e in b.events])
    await _insert_many(conn, transitions, kept_transitions)
    await _insert_many(conn, anomalies, [a for b in batches for a in b.anomalies] + extra_anomalies)
    return refusals


async def _insert_many(conn: AsyncConnection, table: Table, rows: list[dict[str, Any]]) -> None:
    if rows:
        await conn.execute(_insert(conn, table), rows)


async def _write_row(conn: AsyncConnection, batch: Batch) -> Refusal | None:
    row = batch.row
    created = await conn.execute(_insert(conn, responses).values(response_id=batch.response_id, **row))
    if created.rowcount == 1:
        return None
    r = responses.c
    moves_forward = or_(
        # Another writer's state is not comparable with ours: only the terminal guard applies.
        r.owner.is_distinct_from(batch.owner),
        r.attempt < batch.attempt,
        and_(r.attempt == batch.attempt, r.state_seq <= row["state_seq"]),
    )
    stmt = (
        update(responses)
        .where(r.response_id == batch.response_id, r.status.not_in(TERMINAL), moves_forward)
        .values(version=r.version + 1, **{k: row[k] for k in _UPDATABLE})
    )
    if (await conn.execute(stmt)).rowcount == 1:
        return None
    found = (
        await conn.execute(
            select(r.status, r.owner, r.attempt, r.state_seq).where(r.response_id == batch.response_id)
        )
    ).one()
    if found.status not in TERMINAL:
        return None  # an older write replayed after a newer one: nothing to do
    ours = (batch.attempt, row["state_seq"])
    if found.owner == batch.owner and (found.attempt, found.state_seq) >= ours:
        return None  # this very write, replayed (spool, retry)
    return Refusal(batch.response_id, batch.attempt, row["status"], found.status, found.owner)


def _refusal_anomaly(batch: Batch, refusal: Refusal, refused: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "response_id": batch.response_id,
        "attempt": batch.attempt,
        "source": "sink",
        "idx": batch.refusal_idx,
        "kind": AnomalyKind.SINK_REFUSED.value,
        "reason": refusal.reason,
        "at": datetime.now(UTC),
        "event_type": None,
        "event_index": None,
        "payload": encode_value(refused) if refused else None,
    }
