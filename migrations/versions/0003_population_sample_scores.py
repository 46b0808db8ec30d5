"""Every sample's reward and cost of each population member.

`population.sample_rewards` and `population.sample_costs` hold, for one member at one step, the
reward and the cost of each of its (prompt, sample) completions, prompts in order then
samples. Alignment runs record them: the Run page's Alignment tab histograms every sample of
a step, as the alignment reference's `helpfulness/dist` and `cost/dist` do, where the member
means alone would hide the spread within each member. Rows written before this revision
keep them NULL.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-27 18:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("population", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sample_rewards", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("sample_costs", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("population", schema=None) as batch_op:
        batch_op.drop_column("sample_costs")
        batch_op.drop_column("sample_rewards")
