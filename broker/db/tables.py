"""SQL tables: session history, audit log, durable pool configs, utilization samples, autoscaling, rollouts.

SQL is the system of record for what happened (history, audit), for
configuration that must survive a Redis loss (pools), and for which sessions
were live (``live_sessions``, fed by the outbox) should Redis lose them.  Live state lives in
Redis (``broker.store``).  The schema is created and upgraded by Alembic
(``migrations/``); ``tests/broker/test_db.py`` checks the migration produces
exactly these tables.

Timestamps are epoch milliseconds (BIGINT) so SQLite and PostgreSQL agree.
"""

from __future__ import annotations

from sqlalchemy import JSON, BigInteger, Column, Float, Index, Integer, MetaData, String, Table

metadata = MetaData()


def _session_identity() -> list[Column[object]]:
    """The columns a session has from its creation and seating on (history and live rows share them)."""
    return [
        Column("id", String(64), primary_key=True),
        Column("pool", String(63), nullable=False),
        Column("user", String(128), nullable=False),
        Column("host", String(63)),
        Column("gpu", Integer),
        Column("kind", String(16)),
        Column("profile", JSON),
        Column("created_ms", BigInteger, nullable=False),
        Column("seated_ms", BigInteger),
    ]


sessions = Table(
    "sessions",
    metadata,
    *_session_identity(),
    Column("started_ms", BigInteger),
    Column("ended_ms", BigInteger),
    Column("end_reason", String(32)),
    Column("wait_s", Float),
    Column("gpu_seconds", Float),
    Column("host_version", String(64)),  # the host's version when the session was seated (canary rollout)
    Index("ix_sessions_pool_created", "pool", "created_ms"),
    Index("ix_sessions_user", "user"),
)

audit = Table(
    "audit",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("ts_ms", BigInteger, nullable=False),
    Column("actor", String(128), nullable=False),
    Column("role", String(16), nullable=False),
    Column("action", String(64), nullable=False),
    Column("target", String(128)),
    Column("detail", JSON),
    Column("dedup_key", String(128), unique=True),  # outbox records are written at most once
    Index("ix_audit_ts", "ts_ms"),
)

pools = Table(
    "pools",
    metadata,
    Column("name", String(63), primary_key=True),
    Column("config", JSON, nullable=False),
    Column("updated_ms", BigInteger, nullable=False),
)

pool_samples = Table(
    "pool_samples",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("ts_ms", BigInteger, nullable=False),
    Column("pool", String(63), nullable=False),
    Column("sessions", Integer, nullable=False),
    Column("seats_used", Integer, nullable=False),
    Column("seats_total", Integer, nullable=False),
    Column("queue_length", Integer, nullable=False),
    Column("hosts_up", Integer, nullable=False),
    Index("ix_pool_samples_pool_ts", "pool", "ts_ms"),
)

scaling_plans = Table(
    "scaling_plans",
    metadata,
    Column("pool", String(63), primary_key=True),
    Column("plan", JSON, nullable=False),  # ScalingPlan.to_dict()
    Column("updated_ms", BigInteger, nullable=False),
)

autoscale_decisions = Table(
    "autoscale_decisions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("ts_ms", BigInteger, nullable=False),
    Column("pool", String(63), nullable=False),
    Column("phase", String(16), nullable=False),
    Column("kind", String(32), nullable=False),  # start_hosts, drain, undrain, stop_host, ...
    Column("host", String(63)),
    Column("count", Integer),
    Column("reason", String(64), nullable=False),  # broker.autoscale.policy.Reason code
    Column("detail", JSON),  # {"detail": human text, "outcome": applied|lost_race|failed, ...}
    Index("ix_autoscale_decisions_pool_id", "pool", "id"),
)

recommendations = Table(
    "recommendations",
    metadata,
    Column("pool", String(63), primary_key=True),
    Column("ts_ms", BigInteger, nullable=False),
    Column("result", JSON, nullable=False),
)

rollouts = Table(
    "rollouts",
    metadata,
    Column("pool", String(63), primary_key=True),
    Column("policy", JSON, nullable=False),  # broker.rollout.policy.RolloutPolicy.to_dict()
    Column("state", String(16), nullable=False),  # active | rolled_back (a promotion deletes the row)
    Column("started_ms", BigInteger, nullable=False),  # sessions seated since then are judged
    Column("updated_ms", BigInteger, nullable=False),
    Column("last", JSON),  # the latest evaluation: verdict, reason, the health figures behind it
)

# Sessions not yet ended, as SQL last heard of them from the outbox (queued: no host yet; seated:
# host and GPU).  A row goes when the session's end reaches ``sessions``.  After Redis loses its
# live state this is what re-registering nodes' claims are checked against, and what is ended
# (state_lost) when nobody claims it.
live_sessions = Table(
    "live_sessions",
    metadata,
    *_session_identity(),
)

ALL_TABLES = ("sessions", "audit", "pools", "pool_samples", "scaling_plans", "autoscale_decisions",
              "recommendations", "rollouts", "live_sessions")
