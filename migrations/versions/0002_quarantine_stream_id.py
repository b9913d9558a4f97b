"""Quarantine table (what the sink could not store, with why) and the stream owning an attempt.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the values at this revision (never import them from the live package).
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    # A plain ADD COLUMN on both databases (nullable, no default): SQLite does it in place, so
    # the table is not rebuilt and its foreign keys and the view are left alone.
    op.add_column("eventguard_responses", sa.Column("stream_id", sa.String(64)))
    op.create_table(
        "eventguard_quarantine",
        sa.Column("pk", BigId, autoincrement=True, nullable=False),
        sa.Column("response_id", sa.Text()),
        sa.Column("attempt", sa.Integer()),
        sa.Column("stream_id", sa.String(64)),
        sa.Column("origin", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("record", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("pk", name="pk_eventguard_quarantine"),
    )
    op.create_index("ix_eventguard_quarantine_at", "eventguard_quarantine", ["at"])


def downgrade() -> None:
    op.drop_index("ix_eventguard_quarantine_at", table_name="eventguard_quarantine")
    op.drop_table("eventguard_quarantine")
    # ALTER TABLE ... DROP COLUMN in place (SQLite 3.35+): a batch rebuild would drop the table,
    # and with foreign keys on, that deletes every event through ON DELETE CASCADE.
    op.drop_column("eventguard_responses", "stream_id")
