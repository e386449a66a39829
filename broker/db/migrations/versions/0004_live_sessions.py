"""Live sessions in SQL: what SQL knows of each session not yet ended (fed by the outbox).

Redis can lose its live state (restarted empty, a failover that lost writes); this table is how
the broker still knows which sessions were queued or seated, so it can check the claims of nodes
that re-register with their sessions and end the rest with a recorded reason.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "live_sessions",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("pool", sa.String(63), nullable=False),
        sa.Column("user", sa.String(128), nullable=False),
        sa.Column("host", sa.String(63)),
        sa.Column("gpu", sa.Integer),
        sa.Column("kind", sa.String(16)),
        sa.Column("profile", sa.JSON),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
        sa.Column("seated_ms", sa.BigInteger),
    )


def downgrade() -> None:
    op.drop_table("live_sessions")
