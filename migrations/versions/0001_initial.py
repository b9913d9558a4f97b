"""Initial schema: responses, events, transitions, anomalies and the terminal-states view.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the values at this revision (never import them from the live package).
STATES = "'new', 'queued', 'in_progress', 'completed', 'incomplete', 'failed', 'cancelled', 'interrupted'"
TERMINAL = "'completed', 'incomplete', 'failed', 'cancelled'"
ENDED = "'completed', 'incomplete', 'failed', 'cancelled', 'interrupted'"

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Payload = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TS = sa.DateTime(timezone=True)


def _fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["response_id"],
        ["eventguard_responses.response_id"],
        name=f"fk_{table}_response_id",
        ondelete="CASCADE",
    )


def upgrade() -> None:
    op.create_table(
        "eventguard_responses",
        sa.Column("pk", BigId, autoincrement=True, nullable=False),
        sa.Column("response_id", sa.String(255), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("cause", sa.String(32)),
        sa.Column("attempt", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.Column("state_seq", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("created_at", TS),
        sa.Column("started_at", TS),
        sa.Column("finished_at", TS),
        sa.Column("duration_ms", sa.Float()),
        sa.Column("input_tokens", sa.BigInteger()),
        sa.Column("output_tokens", sa.BigInteger()),
        sa.Column("total_tokens", sa.BigInteger()),
        sa.Column("error_code", sa.String(255)),
        sa.Column("error_message", sa.Text()),
        sa.Column("error_type", sa.String(255)),
        sa.Column("conversation_id", sa.String(255)),
        sa.Column("chain_id", sa.String(255)),
        sa.Column("partition_key", sa.String(255)),
        sa.Column("agent_name", sa.String(255)),
        sa.Column("background", sa.Boolean()),
        sa.Column("stream", sa.Boolean()),
        sa.Column("store", sa.Boolean()),
        sa.Column("is_recovery", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("is_steered_turn", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("steering_cut_short", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("unverified", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("event_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("owner", sa.String(255)),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("version", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.CheckConstraint(f"status IN ({STATES})", name="ck_eventguard_responses_status"),
        sa.CheckConstraint(
            f"status NOT IN ({TERMINAL}) OR finished_at IS NOT NULL",
            name="ck_eventguard_responses_terminal_finished",
        ),
        sa.CheckConstraint("attempt >= 1", name="ck_eventguard_responses_attempt"),
        sa.PrimaryKeyConstraint("pk", name="pk_eventguard_responses"),
        sa.UniqueConstraint("response_id", name="uq_eventguard_responses_response_id"),
    )
    op.create_index(
        "ix_eventguard_responses_status_finished_at", "eventguard_responses", ["status", "finished_at"]
    )
    op.create_index("ix_eventguard_responses_finished_at", "eventguard_responses", ["finished_at"])
    op.create_index("ix_eventguard_responses_created_at", "eventguard_responses", ["created_at"])
    op.create_index("ix_eventguard_responses_conversation_id", "eventguard_responses", ["conversation_id"])

    op.create_table(
        "eventguard_events",
        sa.Column("response_id", sa.String(255), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(128)),
        sa.Column("payload", Payload, nullable=False),
        sa.Column("recorded_at", TS, nullable=False),
        _fk("eventguard_events"),
        sa.PrimaryKeyConstraint("response_id", "attempt", "seq", name="pk_eventguard_events"),
    )
    op.create_index("ix_eventguard_events_type", "eventguard_events", ["type"])

    op.create_table(
        "eventguard_transitions",
        sa.Column("response_id", sa.String(255), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("from_state", sa.String(16), nullable=False),
        sa.Column("to_state", sa.String(16), nullable=False),
        sa.Column("cause", sa.String(32)),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("at", TS, nullable=False),
        _fk("eventguard_transitions"),
        sa.PrimaryKeyConstraint("response_id", "attempt", "idx", name="pk_eventguard_transitions"),
    )
    op.create_index(
        "uq_eventguard_transitions_one_terminal",
        "eventguard_transitions",
        ["response_id"],
        unique=True,
        sqlite_where=sa.text(f"to_state IN ({TERMINAL})"),
        postgresql_where=sa.text(f"to_state IN ({TERMINAL})"),
    )

    op.create_table(
        "eventguard_anomalies",
        sa.Column("pk", BigId, autoincrement=True, nullable=False),
        sa.Column("response_id", sa.String(255), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(8), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("event_type", sa.String(128)),
        sa.Column("event_index", sa.Integer()),
        sa.Column("payload", Payload),
        _fk("eventguard_anomalies"),
        sa.PrimaryKeyConstraint("pk", name="pk_eventguard_anomalies"),
        sa.UniqueConstraint(
            "response_id",
            "attempt",
            "source",
            "idx",
            name="uq_eventguard_anomalies_response_id_attempt_source_idx",
        ),
    )
    op.create_index("ix_eventguard_anomalies_kind", "eventguard_anomalies", ["kind"])
    op.create_index("ix_eventguard_anomalies_at", "eventguard_anomalies", ["at"])

    op.execute(
        f"""
        CREATE VIEW eventguard_terminal_states AS
        SELECT pk, response_id, status, cause, attempt, created_at, started_at, finished_at, duration_ms,
               input_tokens, output_tokens, total_tokens, error_code, error_message, conversation_id,
               partition_key, agent_name, background, stream, store, is_recovery, is_steered_turn,
               steering_cut_short, unverified, event_count
        FROM eventguard_responses
        WHERE status IN ({ENDED})
        """
    )


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS eventguard_terminal_states")
    op.drop_table("eventguard_anomalies")
    op.drop_table("eventguard_transitions")
    op.drop_table("eventguard_events")
    op.drop_table("eventguard_responses")
