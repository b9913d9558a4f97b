"""The host's response store: envelopes, items, input/output links, history nodes, conversations.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the values at this revision (never import them from the live package).
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)
KEY = sa.String(64)
ID = sa.String(255)


def upgrade() -> None:
    op.create_table(
        "eventguard_provider_responses",
        sa.Column("pk", BigId, autoincrement=True, nullable=False),
        sa.Column("partition", KEY, nullable=False),
        sa.Column("response_key", KEY, nullable=False),
        sa.Column("response_id", ID, nullable=False),
        sa.Column("status", sa.String(32)),
        sa.Column("conversation_id", ID),
        sa.Column("body", sa.Text()),
        sa.Column("history_node", KEY),
        sa.Column("deleted", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("deleted_at", TS),
        sa.Column("version", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.PrimaryKeyConstraint("pk", name="pk_eventguard_provider_responses"),
        sa.UniqueConstraint(
            "partition", "response_key", name="uq_eventguard_provider_responses_partition_response_key"
        ),
    )
    op.create_index(
        "ix_eventguard_provider_responses_response_id", "eventguard_provider_responses", ["response_id"]
    )
    op.create_index(
        "ix_eventguard_provider_responses_updated_at", "eventguard_provider_responses", ["updated_at"]
    )
    op.create_table(
        "eventguard_provider_items",
        sa.Column("partition", KEY, nullable=False),
        sa.Column("item_key", KEY, nullable=False),
        sa.Column("item_id_shown", ID, nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("partition", "item_key", name="pk_eventguard_provider_items"),
    )
    op.create_index("ix_eventguard_provider_items_updated_at", "eventguard_provider_items", ["updated_at"])
    op.create_table(
        "eventguard_provider_links",
        sa.Column("response_pk", BigId, nullable=False),
        sa.Column("role", sa.String(8), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("item_key", KEY, nullable=False),
        sa.Column("item_id", sa.Text(), nullable=False),
        sa.CheckConstraint("role IN ('input', 'output')", name="ck_eventguard_provider_links_role"),
        sa.ForeignKeyConstraint(
            ["response_pk"],
            ["eventguard_provider_responses.pk"],
            name="fk_eventguard_provider_links_response_pk",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("response_pk", "role", "position", name="pk_eventguard_provider_links"),
    )
    op.create_index("ix_eventguard_provider_links_item_key", "eventguard_provider_links", ["item_key"])
    op.create_table(
        "eventguard_provider_history",
        sa.Column("node", KEY, nullable=False),
        sa.Column("parent", KEY),
        sa.Column("depth", sa.Integer(), nullable=False),
        sa.Column("item_id", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("node", name="pk_eventguard_provider_history"),
    )
    op.create_table(
        "eventguard_provider_conversations",
        sa.Column("seq", BigId, autoincrement=True, nullable=False),
        sa.Column("partition", KEY, nullable=False),
        sa.Column("conversation_key", KEY, nullable=False),
        sa.Column("response_key", KEY, nullable=False),
        sa.PrimaryKeyConstraint("seq", name="pk_eventguard_provider_conversations"),
        sa.UniqueConstraint(
            "partition",
            "conversation_key",
            "response_key",
            name="uq_eventguard_provider_conversations_member",
        ),
    )


def downgrade() -> None:
    op.drop_table("eventguard_provider_conversations")
    op.drop_table("eventguard_provider_history")
    op.drop_index("ix_eventguard_provider_links_item_key", table_name="eventguard_provider_links")
    op.drop_table("eventguard_provider_links")
    op.drop_index("ix_eventguard_provider_items_updated_at", table_name="eventguard_provider_items")
    op.drop_table("eventguard_provider_items")
    op.drop_index("ix_eventguard_provider_responses_updated_at", table_name="eventguard_provider_responses")
    op.drop_index("ix_eventguard_provider_responses_response_id", table_name="eventguard_provider_responses")
    op.drop_table("eventguard_provider_responses")
