"""Initial schema: sessions history, audit, pools, pool utilization samples.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("pool", sa.String(63), nullable=False),
        sa.Column("user", sa.String(128), nullable=False),
        sa.Column("host", sa.String(63)),
        sa.Column("gpu", sa.Integer),
        sa.Column("kind", sa.String(16)),
        sa.Column("profile", sa.JSON),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
        sa.Column("seated_ms", sa.BigInteger),
        sa.Column("started_ms", sa.BigInteger),
        sa.Column("ended_ms", sa.BigInteger),
        sa.Column("end_reason", sa.String(32)),
        sa.Column("wait_s", sa.Float),
        sa.Column("gpu_seconds", sa.Float),
    )
    op.create_index("ix_sessions_pool_created", "sessions", ["pool", "created_ms"])
    op.create_index("ix_sessions_user", "sessions", ["user"])
    op.create_table(
        "audit",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("ts_ms", sa.BigInteger, nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(128)),
        sa.Column("detail", sa.JSON),
        sa.Column("dedup_key", sa.String(128), unique=True),
    )
    op.create_index("ix_audit_ts", "audit", ["ts_ms"])
    op.create_table(
        "pools",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("updated_ms", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "pool_samples",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("ts_ms", sa.BigInteger, nullable=False),
        sa.Column("pool", sa.String(63), nullable=False),
        sa.Column("sessions", sa.Integer, nullable=False),
        sa.Column("seats_used", sa.Integer, nullable=False),
        sa.Column("seats_total", sa.Integer, nullable=False),
        sa.Column("queue_length", sa.Integer, nullable=False),
        sa.Column("hosts_up", sa.Integer, nullable=False),
    )
    op.create_index("ix_pool_samples_pool_ts", "pool_samples", ["pool", "ts_ms"])


def downgrade() -> None:
    for name in ("pool_samples", "pools", "audit", "sessions"):
        op.drop_table(name)
