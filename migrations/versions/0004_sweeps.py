"""Sweeps: hyperparameter searches whose trials are runs.

`sweeps` holds one row per sweep: its name (unique), status (active, finished, cancelled),
search method, the search itself (`spec`, JSON) and the run configuration it varies
(`base_config`, JSON). `runs.sweep_id` names the sweep a run is a trial of (SET NULL if the
sweep goes: the run stays an ordinary run) and `runs.sweep_trial` the trial's number; the
pair is unique, so a trial is never queued twice, even by two schedulers racing. Runs
before this revision belong to no sweep.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-28 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("method", sa.String(length=16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("base_config", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(length=200), nullable=True),
        sa.CheckConstraint(
            "status IN ('active', 'finished', 'cancelled')", name=op.f("ck_sweeps_status")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweeps")),
        sa.UniqueConstraint("name", name=op.f("uq_sweeps_name")),
    )
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.create_index("ix_sweeps_created_at", ["created_at"], unique=False)
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sweep_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("sweep_trial", sa.Integer(), nullable=True))
        batch_op.create_foreign_key(
            op.f("fk_runs_sweep_id_sweeps"), "sweeps", ["sweep_id"], ["id"], ondelete="SET NULL"
        )
        batch_op.create_unique_constraint(
            op.f("uq_runs_sweep_id_sweep_trial"), ["sweep_id", "sweep_trial"]
        )


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("uq_runs_sweep_id_sweep_trial"), type_="unique")
        batch_op.drop_constraint(op.f("fk_runs_sweep_id_sweeps"), type_="foreignkey")
        batch_op.drop_column("sweep_trial")
        batch_op.drop_column("sweep_id")
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.drop_index("ix_sweeps_created_at")
    op.drop_table("sweeps")
