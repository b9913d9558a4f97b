"""The schema as SQLAlchemy Core tables: what the sink writes and the store reads.

The Alembic migrations in ``migrations/versions`` create exactly this (a test compares them),
but they spell it out themselves: a migration is frozen history and must not change when this
module does.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

#: Table names carry a prefix so the tables can live in an application's own database.
PREFIX = "eventguard_"
#: Alembic's bookkeeping table, prefixed too, so it never collides with the application's.
VERSION_TABLE = f"{PREFIX}alembic_version"
#: The view of ended responses (one row each) for plain SQL.
TERMINAL_VIEW = f"{PREFIX}terminal_states"

# The state names as stored. They mirror eventguard.lifecycle.State (a test checks it); the
# database constraints below are written against these strings.
STATES = ("new", "queued", "in_progress", "completed", "incomplete", "failed", "cancelled", "interrupted")
TERMINAL = ("completed", "incomplete", "failed", "cancelled")
ENDED = (*TERMINAL, "interrupted")


def sql_list(values: tuple[str, ...]) -> str:
    """A literal IN-list for DDL (constraints, partial indexes, the view): fixed strings only."""
    return ", ".join(f"'{v}'" for v in values)


# Integer on SQLite so the primary key is the rowid alias (autoincrementing); BIGINT elsewhere.
BigId = BigInteger().with_variant(Integer(), "sqlite")
# JSONB on PostgreSQL (indexable, compact); TEXT holding JSON on SQLite.
Payload = JSON().with_variant(JSONB(), "postgresql")
TS = DateTime(timezone=True)
ID = String(255)
#: The longest event type the type column holds; a longer one is stored cut, with an anomaly.
TYPE_LENGTH = 128
#: A stream's id (a uuid hex, from the recorder).
STREAM_ID_LENGTH = 64

#: Every eventguard table, public as ``eventguard.metadata``: for an application's Alembic (see
#: ``eventguard.include_object``) or its own queries. eventguard migrates these tables itself.
metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s",
        "pk": "pk_%(table_name)s",
    }
)

responses = Table(
    f"{PREFIX}responses",
    metadata,
    # The monotonic key: cursor paging in the store walks it.
    Column("pk", BigId, primary_key=True, autoincrement=True),
    Column("response_id", ID, nullable=False, unique=True),
    Column("status", String(16), nullable=False),
    Column("cause", String(32)),
    Column("attempt", Integer, nullable=False, server_default=text("1")),
    # How far the writing attempt's lifecycle had got (number of transitions) when this row was
    # written: a replayed spool never moves a row back to an older state.
    Column("state_seq", Integer, nullable=False, server_default=text("0")),
    Column("created_at", TS),
    Column("started_at", TS),
    Column("finished_at", TS),
    Column("duration_ms", Float),
    Column("input_tokens", BigInteger),
    Column("output_tokens", BigInteger),
    Column("total_tokens", BigInteger),
    Column("error_code", String(255)),
    Column("error_message", Text),
    Column("error_type", String(255)),
    Column("conversation_id", ID),
    Column("chain_id", ID),
    Column("partition_key", ID),
    Column("agent_name", ID),
    Column("background", Boolean),
    Column("stream", Boolean),
    Column("store", Boolean),
    Column("is_recovery", Boolean, nullable=False, server_default=text("false")),
    Column("is_steered_turn", Boolean, nullable=False, server_default=text("false")),
    Column("steering_cut_short", Boolean, nullable=False, server_default=text("false")),
    Column("unverified", Boolean, nullable=False, server_default=text("false")),
    Column("event_count", Integer, nullable=False, server_default=text("0")),
    # Which sink instance last wrote the row, and when: `recover` finds rows nobody owns any more.
    Column("owner", String(255)),
    # The guarded stream that owns the current attempt (the first whose row write landed): a
    # second stream with the same response id and attempt is refused as a whole (sink.apply).
    Column("stream_id", String(STREAM_ID_LENGTH)),
    Column("updated_at", TS, nullable=False),
    # Bumped on every update: optimistic concurrency for anyone who reads, then writes.
    Column("version", Integer, nullable=False, server_default=text("1")),
    CheckConstraint(f"status IN ({sql_list(STATES)})", name="status"),
    # A terminal row has an end time: the conditional update below writes both at once.
    CheckConstraint(
        f"status NOT IN ({sql_list(TERMINAL)}) OR finished_at IS NOT NULL", name="terminal_finished"
    ),
    CheckConstraint("attempt >= 1", name="attempt"),
    Index(None, "status", "finished_at"),
    Index(None, "finished_at"),
    Index(None, "created_at"),
    Index(None, "conversation_id"),
)


events = Table(
    f"{PREFIX}events",
    metadata,
    Column("response_id", ID, ForeignKey(responses.c.response_id, ondelete="CASCADE"), nullable=False),
    Column("attempt", Integer, nullable=False),
    # The guard's index of the event within the attempt: gaps mean the filter dropped events.
    Column("seq", Integer, nullable=False),
    Column("type", String(TYPE_LENGTH)),
    Column("payload", Payload, nullable=False),
    Column("recorded_at", TS, nullable=False),
    # Writing the same event twice (a retry, a spool replay) hits this key and does nothing.
    PrimaryKeyConstraint("response_id", "attempt", "seq"),
    # No index on type (dropped in migration 0008): no query filters by it, and every event row
    # paid for it on every write.
)

transitions = Table(
    f"{PREFIX}transitions",
    metadata,
    Column("response_id", ID, ForeignKey(responses.c.response_id, ondelete="CASCADE"), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("idx", Integer, nullable=False),
    Column("from_state", String(16), nullable=False),
    Column("to_state", String(16), nullable=False),
    Column("cause", String(32)),
    Column("reason", Text, nullable=False),
    Column("at", TS, nullable=False),
    PrimaryKeyConstraint("response_id", "attempt", "idx"),
    # The database's own guarantee: at most one terminal transition per response, whichever
    # writer (replica, retry, recovery) tries to add a second.
    Index(
        "uq_eventguard_transitions_one_terminal",
        "response_id",
        unique=True,
        sqlite_where=text(f"to_state IN ({sql_list(TERMINAL)})"),
        postgresql_where=text(f"to_state IN ({sql_list(TERMINAL)})"),
    ),
)

anomalies = Table(
    f"{PREFIX}anomalies",
    metadata,
    Column("pk", BigId, primary_key=True, autoincrement=True),
    Column("response_id", ID, ForeignKey(responses.c.response_id, ondelete="CASCADE"), nullable=False),
    Column("attempt", Integer, nullable=False),
    # "guard": found by the state machine; "sink": found while storing (refused terminal,
    # truncated or unserialisable payload). Each source numbers its own anomalies.
    Column("source", String(8), nullable=False),
    Column("idx", Integer, nullable=False),
    Column("kind", String(64), nullable=False),
    Column("reason", Text, nullable=False),
    Column("at", TS, nullable=False),
    Column("event_type", String(128)),
    Column("event_index", Integer),
    Column("payload", Payload),
    UniqueConstraint("response_id", "attempt", "source", "idx"),
    Index(None, "kind"),
    Index(None, "at"),
)

#: What the sink could not store, with why: the database refused it (``write``), a spool entry
#: could not be read (``spool``), or a second stream carried a response id and attempt another
#: stream holds (``duplicate``). ``record`` is the refused content as ASCII JSON text, so it is
#: always storable (a NUL or a lone surrogate is an escape there); ``response_id`` is as given,
#: made storable the same way. No index on it: an id of any length must go in.
QUARANTINE_ORIGINS = ("write", "spool", "duplicate")
quarantine = Table(
    f"{PREFIX}quarantine",
    metadata,
    Column("pk", BigId, primary_key=True, autoincrement=True),
    Column("response_id", Text),
    Column("attempt", Integer),
    Column("stream_id", String(STREAM_ID_LENGTH)),
    Column("origin", String(16), nullable=False),
    Column("reason", Text, nullable=False),
    Column("at", TS, nullable=False),
    Column("record", Text, nullable=False),
    Index(None, "at"),
)

VIEW_SQL = f"""
CREATE VIEW {TERMINAL_VIEW} AS
SELECT pk, response_id, status, cause, attempt, created_at, started_at, finished_at, duration_ms,
       input_tokens, output_tokens, total_tokens, error_code, error_message, conversation_id,
       partition_key, agent_name, background, stream, store, is_recovery, is_steered_turn,
       steering_cut_short, unverified, event_count
FROM {PREFIX}responses
WHERE status IN ({sql_list(ENDED)})
"""


# -- the host's response store (eventguard.provider) -----------------------------------------------
#
# What ``ResponsesHostServer`` reads back through its ``response_store``: envelopes, items, which
# items a response took as input and produced as output, conversation membership, and the
# history item ids each response was created with. Every id the host hands over may hold any
# string (NUL, lone surrogates, a megabyte), so rows are keyed by the SHA-256 of the exact id
# (``*_key``, 64 hex digits): fixed width, indexable, collision-free in practice. The exact values
# live in ``body`` / ``item_id`` as ASCII text (see ``eventguard.provider``); ``response_id`` and
# ``item_id_shown`` are the sink's storable form of the id (``storable.identifier``), for people
# and for joins with ``eventguard_responses``.

#: A partition or id key: the SHA-256 hex digest of the exact string (or "anonymous").
KEY = String(64)

provider_responses = Table(
    f"{PREFIX}provider_responses",
    metadata,
    # Creation order (a re-created response keeps its row and so its place).
    Column("pk", BigId, primary_key=True, autoincrement=True),
    # ``context.user_id_key``: "anonymous" for None, else the SHA-256 of the key ("" is a key).
    Column("partition", KEY, nullable=False),
    Column("response_key", KEY, nullable=False),
    Column("response_id", ID, nullable=False),
    # The envelope's own ``status``, copied out for `verify` and retention (the body has it too).
    Column("status", String(32)),
    Column("conversation_id", ID),
    # The envelope as ASCII JSON text, exactly as given (NULL once deleted).
    Column("body", Text),
    # The last node of the history item ids the response was created with (NULL: none); nodes
    # are shared, so a long previous_response_id chain stores each history id once.
    Column("history_node", KEY),
    Column("deleted", Boolean, nullable=False, server_default=text("false")),
    Column("created_at", TS, nullable=False),
    Column("updated_at", TS, nullable=False),
    Column("deleted_at", TS),
    # Bumped on every write: optimistic concurrency for whoever reads, then writes (replicas).
    Column("version", Integer, nullable=False, server_default=text("1")),
    UniqueConstraint("partition", "response_key"),
    Index(None, "response_id"),
    Index(None, "updated_at"),
)

provider_items = Table(
    f"{PREFIX}provider_items",
    metadata,
    Column("partition", KEY, nullable=False),
    Column("item_key", KEY, nullable=False),
    Column("item_id_shown", ID, nullable=False),
    # The item as ASCII JSON text; the last write of an id wins, as in the host's own stores.
    Column("body", Text, nullable=False),
    Column("updated_at", TS, nullable=False),
    PrimaryKeyConstraint("partition", "item_key"),
    Index(None, "updated_at"),
)

#: Which items a response took as input and produced as output, in order (duplicates kept).
PROVIDER_ROLES = ("input", "output")
provider_links = Table(
    f"{PREFIX}provider_links",
    metadata,
    Column("response_pk", BigId, ForeignKey(provider_responses.c.pk, ondelete="CASCADE"), nullable=False),
    Column("role", String(8), nullable=False),
    Column("position", Integer, nullable=False),
    Column("item_key", KEY, nullable=False),
    # The exact id (see eventguard.provider's encoding): an id may name an item never stored.
    Column("item_id", Text, nullable=False),
    PrimaryKeyConstraint("response_pk", "role", "position"),
    CheckConstraint(f"role IN ({sql_list(PROVIDER_ROLES)})", name="role"),
    Index(None, "item_key"),
)

#: History item ids as a shared, content-addressed list: a node is (its parent, one id), keyed by
#: the SHA-256 of the whole list up to it, so two responses whose histories share a prefix share
#: its nodes, and turn n of a chain adds only the ids turn n-1 added (O(n) rows, not O(n^2)).
#:
#: Nodes are grouped in runs (migration 0004): a run is a stretch of nodes each the child of the
#: one before, named by its first node, whose ``parent`` is where the run branches off another.
#: A child joins its parent's run while the parent is the run's last node; a second child of one
#: node (a branch) starts a run of its own. So a history is read by ranges, ``(run, depth <= d)``
#: for the run it ends in and each run it branched from, not node by node: a 1,000-turn chain is
#: one run, one index range.
provider_history = Table(
    f"{PREFIX}provider_history",
    metadata,
    Column("node", KEY, primary_key=True),
    Column("parent", KEY),
    Column("depth", Integer, nullable=False),
    Column("item_id", Text, nullable=False),
    # The run's first node (see above): one node per (run, depth).
    Column("run", KEY, nullable=False),
    # The SHA-256 of the exact id (as provider_items.item_key): what retention asks in SQL.
    Column("item_key", KEY, nullable=False),
    Index(None, "run", "depth", unique=True),
    Index(None, "item_key"),
)

provider_conversations = Table(
    f"{PREFIX}provider_conversations",
    metadata,
    # Membership order: a response joins a conversation once, at its first creation.
    Column("seq", BigId, primary_key=True, autoincrement=True),
    Column("partition", KEY, nullable=False),
    Column("conversation_key", KEY, nullable=False),
    Column("response_key", KEY, nullable=False),
    UniqueConstraint(
        "partition", "conversation_key", "response_key", name="uq_eventguard_provider_conversations_member"
    ),
)


# -- eventguard.replicas (migration 0005): one row per response id and partition a replica ran -----
leases = Table(
    f"{PREFIX}leases",
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
    # Migration 0006: the run's mode, from its handler's context (NULL until the handler runs).
    Column("background", Boolean),
    PrimaryKeyConstraint("partition", "response_key", name="pk_eventguard_leases"),
    Index("ix_eventguard_leases_owner_state", "owner", "state"),
    Index("ix_eventguard_leases_state_expires", "state", "lease_expires"),
)


# -- eventguard.agent_sessions (migration 0007): the host's agent sessions ---------------------------
#: One row per agent session the host keeps (``AgentSession.to_dict()``), so a chat agent's sessions
#: survive losing the host's state folder. Keyed as the response store keys ids: ``partition`` is the
#: SHA-256 of the platform's ``user_id`` (or "anonymous"), ``session_key`` the SHA-256 of the exact
#: session id; ``session_id`` is the exact id (as ``provider_links.item_id``), ``value`` the session
#: as ASCII JSON text. ``version`` is bumped on every write: a store writes only over the version it
#: read (the host's "another request advanced this agent session").
agent_sessions = Table(
    f"{PREFIX}agent_sessions",
    metadata,
    Column("partition", KEY, nullable=False),
    Column("session_key", KEY, nullable=False),
    Column("session_id", Text, nullable=False),
    Column("value", Text, nullable=False),
    Column("version", Integer, nullable=False),
    Column("updated_at", TS, nullable=False),
    PrimaryKeyConstraint("partition", "session_key", name="pk_eventguard_agent_sessions"),
    Index(None, "updated_at"),
)
