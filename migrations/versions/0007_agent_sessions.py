"""The host's agent sessions in SQL.

``eventguard_agent_sessions``: one row per agent session (``AgentSession.to_dict()`` as ASCII JSON),
keyed by the SHA-256 of the platform user and of the exact session id, with a version for the
host's optimistic concurrency (see ``eventguard.agent_sessions``).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "eventguard_agent_sessions"


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("partition", sa.String(64), nullable=False),
        sa.Column("session_key", sa.String(64), nullable=False),
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("partition", "session_key", name="pk_eventguard_agent_sessions"),
    )
    op.create_index("ix_eventguard_agent_sessions_updated_at", TABLE, ["updated_at"])


def downgrade() -> None:
    op.drop_index("ix_eventguard_agent_sessions_updated_at", table_name=TABLE)
    op.drop_table(TABLE)
