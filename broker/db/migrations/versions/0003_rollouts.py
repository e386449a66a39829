"""Canary rollouts: a pool's rollout policy and state, and the host version each session ran on.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("sessions", sa.Column("host_version", sa.String(64)))
    op.create_table(
        "rollouts",
        sa.Column("pool", sa.String(63), primary_key=True),
        sa.Column("policy", sa.JSON, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("started_ms", sa.BigInteger, nullable=False),
        sa.Column("updated_ms", sa.BigInteger, nullable=False),
        sa.Column("last", sa.JSON),
    )


def downgrade() -> None:
    op.drop_table("rollouts")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("host_version")
