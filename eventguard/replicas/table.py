"""The lease table (migration 0005): one row per response id and partition that a replica ran."""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Float, Index, MetaData, PrimaryKeyConstraint, String, Table, Text

#: The lease states: ``running`` (an owner holds it), ``ended`` (a terminal was written by the
#: holder of the token, or by the reaper), ``interrupted`` (reaped, left for the owner's restart),
#: ``deleted`` (the response was deleted: the id may be created again).
STATES = ("running", "ended", "interrupted", "deleted")

metadata = MetaData()

leases = Table(
    "eventguard_leases",
    metadata,
    Column("partition", String(64), nullable=False),
    Column("response_key", String(64), nullable=False),
    # The exact id, JSON-encoded (any string the host accepts round-trips).
    Column("response_id", Text, nullable=False),
    Column("owner", String(255), nullable=False),
    # Bumped on every takeover: a write carrying an older token is refused by the database.
    Column("fencing_token", BigInteger, nullable=False),
    Column("state", String(16), nullable=False),
    # Seconds since the epoch, by the database's clock (never a replica's).
    Column("lease_expires", Float, nullable=False),
    Column("cancel_requested", Float),
    Column("cancel_headers", Text),
    Column("cancel_delivered", Float),
    Column("ended_status", String(16)),
    Column("ended_by", String(255)),
    Column("ended_at", Float),
    PrimaryKeyConstraint("partition", "response_key", name="pk_eventguard_leases"),
    Index("ix_eventguard_leases_owner_state", "owner", "state"),
    Index("ix_eventguard_leases_state_expires", "state", "lease_expires"),
)
