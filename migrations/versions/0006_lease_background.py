"""A lease says whether its run is a background one.

``eventguard_leases`` gains ``background``: the run's mode as its handler's context gave it, written
when the replica running it claims (or confirms) the lease, before its first event. Another replica
answers a GET of an in-flight response by it: a foreground response is the owner's alone (404
elsewhere, as on the owner), a background one is served from the store. NULL for a lease taken before
its handler ran, or by a replica without this column.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "eventguard_leases"


def upgrade() -> None:
    with op.batch_alter_table(TABLE) as batch:
        batch.add_column(sa.Column("background", sa.Boolean()))


def downgrade() -> None:
    with op.batch_alter_table(TABLE) as batch:
        batch.drop_column("background")
