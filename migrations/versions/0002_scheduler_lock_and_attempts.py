"""The scheduler's lock and run attempts.

`scheduler_lock` holds one row per lock name with an owner and a lease that expires, so one
scheduler runs per database and a crashed one is replaced after its lease runs out.
`runs.attempt` counts the attempts of a run: a resumed run keeps its id and uuid but needs a
new Ray submission id (Ray refuses a reused one), `uuid` for attempt 1, `uuid-N` after.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-26 03:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "scheduler_lock",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_scheduler_lock")),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("attempt", sa.Integer(), nullable=False, server_default=sa.text("1"))
        )


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("attempt")
    op.drop_table("scheduler_lock")
