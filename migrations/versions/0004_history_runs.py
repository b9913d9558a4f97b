"""History nodes grouped in runs (read by index ranges, not node by node) and keyed items.

``eventguard_provider_history`` gains ``run`` (the first node of the stretch of nodes the node
belongs to, each the child of the one before: see ``eventguard.sql.tables``) with a unique index
on ``(run, depth)``, and ``item_key`` (the SHA-256 of the exact item id) with an index, so a
history is read with one range per run and retention asks its questions in SQL. Existing nodes
are assigned to runs as the provider would have assigned them: by depth, a node joins its parent's
run while the parent is that run's last node, else starts its own.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

import hashlib
import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the values at this revision (never import them from the live package).
KEY = sa.String(64)
TABLE = "eventguard_provider_history"
#: Marks an item id stored JSON-encoded (eventguard.provider's encoding at 0003).
ENCODED = "~"
#: Rows updated per statement while filling the new columns.
BATCH = 1000


def _exact_id(stored: str) -> str:
    return str(json.loads(stored[len(ENCODED) :])) if stored.startswith(ENCODED) else stored


def _key(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


def _fill() -> None:
    """Give every stored node its run and item key (the provider's own rule, in depth order)."""
    bind = op.get_bind()
    history = sa.table(
        TABLE,
        sa.column("node", KEY),
        sa.column("parent", KEY),
        sa.column("depth", sa.Integer()),
        sa.column("item_id", sa.Text()),
        sa.column("run", KEY),
        sa.column("item_key", KEY),
    )
    rows = bind.execute(
        sa.select(history.c.node, history.c.parent, history.c.depth, history.c.item_id).order_by(
            history.c.depth, history.c.node
        )
    )
    run_of: dict[str, str] = {}
    last: dict[str, int] = {}  # a run's deepest node so far
    pending: list[dict[str, object]] = []
    update = (
        sa.update(history)
        .where(history.c.node == sa.bindparam("b_node"))
        .values(run=sa.bindparam("b_run"), item_key=sa.bindparam("b_item_key"))
    )
    for node, parent, depth, item_id in rows.all():
        run = node
        if parent is not None and parent in run_of:
            theirs = run_of[parent]
            if last[theirs] == depth - 1:  # the parent ends its run: the child continues it
                run = theirs
        run_of[node] = run
        last[run] = depth
        pending.append({"b_node": node, "b_run": run, "b_item_key": _key(_exact_id(item_id))})
        if len(pending) >= BATCH:
            bind.execute(update, pending)
            pending = []
    if pending:
        bind.execute(update, pending)


def upgrade() -> None:
    with op.batch_alter_table(TABLE) as batch:
        batch.add_column(sa.Column("run", KEY))
        batch.add_column(sa.Column("item_key", KEY))
    _fill()
    # SQLite rebuilds the table here (nothing refers to it by foreign key: safe).
    with op.batch_alter_table(TABLE) as batch:
        batch.alter_column("run", existing_type=KEY, nullable=False)
        batch.alter_column("item_key", existing_type=KEY, nullable=False)
    op.create_index("ix_eventguard_provider_history_run_depth", TABLE, ["run", "depth"], unique=True)
    op.create_index("ix_eventguard_provider_history_item_key", TABLE, ["item_key"])


def downgrade() -> None:
    op.drop_index("ix_eventguard_provider_history_item_key", table_name=TABLE)
    op.drop_index("ix_eventguard_provider_history_run_depth", table_name=TABLE)
    with op.batch_alter_table(TABLE) as batch:
        batch.drop_column("item_key")
        batch.drop_column("run")
