"""Autoscaling: scaling plans, the autoscaler's decision log, pool-sizing recommendations.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "scaling_plans",
        sa.Column("pool", sa.String(63), primary_key=True),
        sa.Column("plan", sa.JSON, nullable=False),
        sa.Column("updated_ms", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "autoscale_decisions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("ts_ms", sa.BigInteger, nullable=False),
        sa.Column("pool", sa.String(63), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("host", sa.String(63)),
        sa.Column("count", sa.Integer),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("detail", sa.JSON),
    )
    op.create_index("ix_autoscale_decisions_pool_id", "autoscale_decisions", ["pool", "id"])
    op.create_table(
        "recommendations",
        sa.Column("pool", sa.String(63), primary_key=True),
        sa.Column("ts_ms", sa.BigInteger, nullable=False),
        sa.Column("result", sa.JSON, nullable=False),
    )


def downgrade() -> None:
    op.drop_index("ix_autoscale_decisions_pool_id", table_name="autoscale_decisions")
    for name in ("recommendations", "autoscale_decisions", "scaling_plans"):
        op.drop_table(name)
