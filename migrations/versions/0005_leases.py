"""Leases of several replicas: owner, lease expiry, fencing token, relayed cancels.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "eventguard_leases",
        sa.Column("partition", sa.String(64), nullable=False),
        sa.Column("response_key", sa.String(64), nullable=False),
        sa.Column("response_id", sa.Text(), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("fencing_token", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("lease_expires", sa.Float(), nullable=False),
        sa.Column("cancel_requested", sa.Float()),
        sa.Column("cancel_headers", sa.Text()),
        sa.Column("cancel_delivered", sa.Float()),
        sa.Column("ended_status", sa.String(16)),
        sa.Column("ended_by", sa.String(255)),
        sa.Column("ended_at", sa.Float()),
        sa.PrimaryKeyConstraint("partition", "response_key", name="pk_eventguard_leases"),
    )
    op.create_index("ix_eventguard_leases_owner_state", "eventguard_leases", ["owner", "state"])
    op.create_index("ix_eventguard_leases_state_expires", "eventguard_leases", ["state", "lease_expires"])


def downgrade() -> None:
    op.drop_index("ix_eventguard_leases_state_expires", table_name="eventguard_leases")
    op.drop_index("ix_eventguard_leases_owner_state", table_name="eventguard_leases")
    op.drop_table("eventguard_leases")
