"""A sweep's tags.

`sweeps.tags` (a JSON list of strings) holds the labels a person gave the sweep (`eslab sweep
--tag`, the New run page's tags); each of its runs is tagged with them besides `sweep:NAME`,
so the runs of a sweep are found by the same tags as a run submitted alone. The column is
NOT NULL with the server default '[]', so sweeps before this revision have no tags and no
reader needs to tell NULL from an empty list; adding a NOT NULL column with a default is an
ALTER TABLE ... ADD COLUMN on both SQLite and PostgreSQL.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-28 03:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.add_column(sa.Column("tags", sa.JSON(), nullable=False, server_default="[]"))


def downgrade() -> None:
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.drop_column("tags")
