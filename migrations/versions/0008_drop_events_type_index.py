"""The events table loses its index on ``type``.

No query of eventguard's filters events by type alone (a history is read by its key, ``verify`` by
the key too), and the index cost every write: each event row went into a third b-tree, and a short
response's transaction touched one leaf page of it per distinct event type (a 28-event response:
about a third of the pages its commit wrote to the WAL). On the SQLite writer thread, 500 sequential
28-event responses of a real host: the statements' CPU 719 -> 547 µs per response, the commit's
median 169 -> 120 µs, and a WAL checkpoint every ~31 commits -> every ~50 (issue 13).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "eventguard_events"
INDEX = "ix_eventguard_events_type"


def upgrade() -> None:
    op.drop_index(INDEX, table_name=TABLE)


def downgrade() -> None:
    op.create_index(INDEX, TABLE, ["type"])
