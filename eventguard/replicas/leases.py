"""The lease statements: every decision here is the database's (unique key, conditional UPDATE).

Times are the database's clock in epoch seconds (:func:`db_now`), so replicas whose clocks differ
agree on whether a lease has expired.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Float, and_, case, exists, literal_column, or_, select, update
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.ext.asyncio import AsyncConnection

from eventguard.replicas.table import leases
from eventguard.sql.tables import provider_responses

L = leases.c


def _now(conn: AsyncConnection) -> ColumnElement[float]:
    """The database's clock, in seconds since the epoch (PostgreSQL ``now()``)."""
    if conn.dialect.name == "sqlite":
        return literal_column("((julianday('now') - 2440587.5) * 86400.0)", Float)
    return literal_column("extract(epoch from now())::float8", Float)


def _insert(conn: AsyncConnection):  # type: ignore[no-untyped-def]
    return (sqlite_dialect if conn.dialect.name == "sqlite" else pg_dialect).insert(leases)


#: The columns every read of a lease starts with (see :func:`_lease`).
_IDENTITY = (L.partition, L.response_key, L.response_id, L.owner, L.fencing_token, L.state)


@dataclass(frozen=True)
class Lease:
    """One lease row as read."""

    partition: str
    response_key: str
    response_id: str
    owner: str
    fencing_token: int
    state: str
    expired: bool
    cancel_headers: dict[str, str] | None
    #: The run's mode from its handler's context; None until the handler runs (migration 0006).
    background: bool | None = None
    #: When the owner took the relayed cancel (the database's clock); None until it did.
    cancel_delivered: float | None = None


async def claim(
    conn: AsyncConnection,
    *,
    partition: str,
    key: str,
    response_id: str,
    owner: str,
    lease: float,
    takeover: bool,
    background: bool | None = None,
) -> int | None:
    """Take the lease of a response id; its fencing token, or None when another holds it.

    Fresh id: the lease is ours (token 1). A deleted response: taken again (token + 1). With
    ``takeover`` (the host starting a run here: a recovered one takes over) a lease already ours is
    kept (same token) and an expired or interrupted one is taken (token + 1). Anything else (a
    second POST of the id, on any replica; a live owner; a stored response) is refused. Without
    ``takeover`` a live envelope in the response store with no lease (stored before leases
    existed) refuses the id as well. ``background``: the run's mode, when its handler's context is
    known (a claim for a POST is made before it is).
    """
    now = _now(conn)
    values = {
        "partition": partition,
        "response_key": key,
        "response_id": json.dumps(response_id, ensure_ascii=True),
        "owner": owner,
        "fencing_token": 1,
        "state": "running",
        "lease_expires": now + lease,
        "background": background,
    }
    ins = _insert(conn)
    ours = and_(L.state == "running", L.owner == ins.excluded.owner)
    allowed: ColumnElement[bool] = L.state == "deleted"
    if takeover:
        allowed = or_(
            allowed, ours, L.state == "interrupted", and_(L.state == "running", L.lease_expires < now)
        )
    stmt = ins.values(**values).on_conflict_do_update(
        index_elements=[L.partition, L.response_key],
        set_={
            "owner": ins.excluded.owner,
            "response_id": ins.excluded.response_id,
            "state": "running",
            "lease_expires": ins.excluded.lease_expires,
            "fencing_token": _case_keep(ours, L.fencing_token),
            "cancel_requested": None,
            "cancel_headers": None,
            "cancel_delivered": None,
            "ended_status": None,
            "ended_by": None,
            "ended_at": None,
            "background": ins.excluded.background,
        },
        where=allowed,
    )
    if not takeover:
        r = provider_responses.c
        stored = exists().where(r.partition == partition, r.response_key == key, r.deleted.is_(False))
        live = await conn.execute(select(stored))
        if live.scalar() and (await lease_of(conn, partition, key)) is None:
            return None
    row = (await conn.execute(stmt.returning(L.fencing_token, L.owner))).first()
    if row is None or row.owner != owner:
        return None
    return int(row.fencing_token)


def _case_keep(ours: ColumnElement[bool], token: ColumnElement[int]) -> ColumnElement[int]:
    return case((ours, token), else_=token + 1)


async def note_background(
    conn: AsyncConnection, partition: str, key: str, owner: str, token: int, background: bool | None
) -> None:
    """Write the run's mode on a lease ``owner`` holds with ``token`` (claimed before its handler ran)."""
    await conn.execute(
        update(leases)
        .where(L.partition == partition, L.response_key == key, L.owner == owner, L.fencing_token == token)
        .values(background=background)
    )


async def heartbeat(conn: AsyncConnection, owner: str, lease: float) -> int:
    """Renew every running lease of ``owner`` (one statement); how many it renewed."""
    result = await conn.execute(
        update(leases).where(L.owner == owner, L.state == "running").values(lease_expires=_now(conn) + lease)
    )
    return int(result.rowcount)


def _held(partition: str, key: str, owner: str, token: int) -> tuple[ColumnElement[bool], ...]:
    """The lease of one response as ``owner`` holds it under ``token``: what every fenced write checks."""
    return (
        L.partition == partition,
        L.response_key == key,
        L.owner == owner,
        L.fencing_token == token,
        L.state == "running",
    )


async def renew_fenced(
    conn: AsyncConnection, partition: str, key: str, owner: str, token: int, lease: float
) -> bool:
    """Renew one running lease of ``owner``, only under ``token`` (as the heartbeat renews them all);
    False: it is no longer this owner's (reaped, taken over, ended)."""
    result = await conn.execute(
        update(leases).where(*_held(partition, key, owner, token)).values(lease_expires=_now(conn) + lease)
    )
    return bool(result.rowcount == 1)


async def touch_fenced(conn: AsyncConnection, partition: str, key: str, owner: str, token: int) -> bool:
    """Whether ``owner`` still holds the lease with ``token`` (a write under it may go on)."""
    row = await conn.execute(select(L.fencing_token).where(*_held(partition, key, owner, token)))
    return row.first() is not None


async def end_fenced(
    conn: AsyncConnection, partition: str, key: str, owner: str, token: int, status: str
) -> bool:
    """End a lease with its terminal status, only under ``token``; False: refused (fenced out)."""
    result = await conn.execute(
        update(leases)
        .where(*_held(partition, key, owner, token))
        .values(state="ended", ended_status=status[:16], ended_by=owner, ended_at=_now(conn))
    )
    return bool(result.rowcount == 1)


async def release(conn: AsyncConnection, partition: str, key: str, owner: str, token: int) -> bool:
    """Give up a lease under ``token`` for a response nothing stored (a POST the host refused, a
    ``store=false`` run): the id may be created again, as on one server, where the host keeps no
    trace of either. Marked ``deleted``, not removed, so the next claim's token is higher still."""
    r = provider_responses.c
    # Never for a response that is stored after all (a handler the host ran after a 500, say): that
    # lease is ended, so the id stays taken, as a stored response's is.
    stored = exists().where(r.partition == partition, r.response_key == key, r.deleted.is_(False))
    held = _held(partition, key, owner, token)
    result = await conn.execute(update(leases).where(*held, ~stored).values(state="deleted"))
    if result.rowcount == 1:
        return True
    return await end_fenced(conn, partition, key, owner, token, "ended")


async def mark_deleted(conn: AsyncConnection, partition: str, key: str, owner: str) -> bool:
    """Mark a lease deleted, unless another replica still runs the response under a live lease.
    True when the delete may go on (no lease, or one that is not running elsewhere)."""
    now = _now(conn)
    running_elsewhere = and_(L.state == "running", L.owner != owner, L.lease_expires >= now)
    result = await conn.execute(
        update(leases)
        .where(L.partition == partition, L.response_key == key, ~running_elsewhere)
        .values(state="deleted")
    )
    if result.rowcount == 1:
        return True
    return await lease_of(conn, partition, key) is None


async def lease_of(conn: AsyncConnection, partition: str, key: str) -> Lease | None:
    now = _now(conn)
    row = (
        await conn.execute(
            select(
                *_IDENTITY,
                (L.lease_expires < now).label("expired"),
                L.cancel_headers,
                L.background,
                L.cancel_delivered,
            ).where(L.partition == partition, L.response_key == key)
        )
    ).first()
    return None if row is None else _lease(row)


def _lease(row: object) -> Lease:
    headers = getattr(row, "cancel_headers", None)
    return Lease(
        partition=row.partition,  # type: ignore[attr-defined]
        response_key=row.response_key,  # type: ignore[attr-defined]
        response_id=json.loads(row.response_id),  # type: ignore[attr-defined]
        owner=row.owner,  # type: ignore[attr-defined]
        fencing_token=int(row.fencing_token),  # type: ignore[attr-defined]
        state=row.state,  # type: ignore[attr-defined]
        expired=bool(getattr(row, "expired", False)),
        cancel_headers=None if headers is None else json.loads(headers),
        background=getattr(row, "background", None),
        cancel_delivered=getattr(row, "cancel_delivered", None),
    )


async def request_cancel(
    conn: AsyncConnection, partition: str, key: str, headers: dict[str, str]
) -> str | None:
    """Record a cancel for a running response; the owner to tell, or None when it is not running."""
    row = (
        await conn.execute(
            update(leases)
            .where(L.partition == partition, L.response_key == key, L.state == "running")
            .values(cancel_requested=_now(conn), cancel_headers=json.dumps(headers), cancel_delivered=None)
            .returning(L.owner)
        )
    ).first()
    return None if row is None else str(row.owner)


async def take_cancels(conn: AsyncConnection, owner: str) -> list[Lease]:
    """The cancels relayed to ``owner`` not yet delivered, marked delivered (each once)."""
    rows = (
        await conn.execute(
            update(leases)
            .where(
                L.owner == owner,
                L.state == "running",
                L.cancel_requested.is_not(None),
                L.cancel_delivered.is_(None),
            )
            .values(cancel_delivered=_now(conn))
            .returning(
                *_IDENTITY,
                L.cancel_headers,
            )
        )
    ).all()
    return [_lease(row) for row in rows]


async def expired(conn: AsyncConnection, limit: int) -> list[Lease]:
    """Running leases past their expiry (candidates for the reaper)."""
    now = _now(conn)
    rows = (
        await conn.execute(
            select(L.partition, L.response_key, L.response_id, L.owner, L.fencing_token, L.state)
            .where(L.state == "running", L.lease_expires < now)
            .limit(limit)
        )
    ).all()
    return [_lease(row) for row in rows]


async def take_expired(
    conn: AsyncConnection, lease: Lease, reaper: str, state: str, status: str
) -> int | None:
    """Take an expired lease for the reaper (token + 1), exactly once across replicas; its new token."""
    now = _now(conn)
    row = (
        await conn.execute(
            update(leases)
            .where(
                L.partition == lease.partition,
                L.response_key == lease.response_key,
                L.fencing_token == lease.fencing_token,
                L.state == "running",
                L.lease_expires < now,
            )
            .values(
                owner=reaper,
                fencing_token=L.fencing_token + 1,
                state=state,
                ended_status=status,
                ended_by=reaper,
                ended_at=now,
            )
            .returning(L.fencing_token)
        )
    ).first()
    return None if row is None else int(row.fencing_token)
