"""Async SQLAlchemy engine creation and schema migration.

``create_engine(url)`` accepts ``sqlite:///path``/``postgresql://...`` style URLs
and picks the async driver (aiosqlite, asyncpg).  ``migrate(engine)`` runs the
Alembic migrations to head inside one connection (idempotent: safe from every
replica at start; PostgreSQL serialises concurrent DDL with an advisory lock).
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

MIGRATION_LOCK_ID = 7_411_052  # arbitrary constant for pg_advisory_xact_lock


def async_url(url: str) -> str:
    """Map a plain SQLAlchemy URL to its asyncio driver."""
    for plain, asyncd in (("sqlite://", "sqlite+aiosqlite://"), ("postgresql://", "postgresql+asyncpg://"),
                          ("postgres://", "postgresql+asyncpg://")):
        if url.startswith(plain):
            return asyncd + url[len(plain):]
    return url


def create_engine(url: str) -> AsyncEngine:
    url = async_url(url)
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("sqlite"):
        kwargs = {"connect_args": {"timeout": 30}}
    engine = create_async_engine(url, **kwargs)
    if url.startswith("sqlite"):
        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _rec: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")  # readers do not block the writer
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()
    return engine


def _upgrade(conn: Connection) -> None:
    from alembic import command
    from alembic.config import Config

    if conn.dialect.name == "postgresql":
        conn.execute(text(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_ID})"))
    cfg = Config()
    cfg.set_main_option("script_location", str(resources.files("broker.db") / "migrations"))
    cfg.attributes["connection"] = conn
    command.upgrade(cfg, "head")


async def migrate(engine: AsyncEngine) -> None:
    """Bring the schema to the newest migration."""
    async with engine.begin() as conn:
        await conn.run_sync(_upgrade)
