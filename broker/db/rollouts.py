"""SQL for canary rollouts: each pool's rollout policy and state, and the session outcomes it is judged on.

The ``rollouts`` row is the system of record (Redis holds only the seating split, rebuilt from
this row by the rollout loop after a Redis loss).  Outcomes come from the ``sessions`` history,
whose ``host_version`` the seating Lua step records from the host at bind time.

Concurrency: one AsyncEngine per process; each call takes its own connection; the rollout loop
of one replica at a time (a per-pool leader lock) writes state, admins write policies.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from broker.db import tables as t


class RolloutRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def save(self, pool: str, policy: dict[str, Any], state: str, started_ms: int, now_ms: int) -> bool:
        """Create or replace a pool's rollout (a new judging window from ``started_ms``); True if created."""
        values = {"policy": policy, "state": state, "started_ms": started_ms, "updated_ms": now_ms, "last": None}
        async with self.engine.begin() as conn:
            res = await conn.execute(update(t.rollouts).where(t.rollouts.c.pool == pool).values(**values))
            if res.rowcount == 0:
                await conn.execute(insert(t.rollouts).values(pool=pool, **values))
                return True
        return False

    async def get(self, pool: str) -> dict[str, Any] | None:
        async with self.engine.connect() as conn:
            r = (await conn.execute(select(t.rollouts).where(t.rollouts.c.pool == pool))).mappings().first()
        return dict(r) if r else None

    async def all(self) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            rows = (await conn.execute(select(t.rollouts).order_by(t.rollouts.c.pool))).mappings().all()
        return [dict(r) for r in rows]

    async def update(self, pool: str, now_ms: int, *, state: str | None = None,
                     last: dict[str, Any] | None = None) -> bool:
        values: dict[str, Any] = {"updated_ms": now_ms}
        if state is not None:
            values["state"] = state
        if last is not None:
            values["last"] = last
        async with self.engine.begin() as conn:
            res = await conn.execute(update(t.rollouts).where(t.rollouts.c.pool == pool).values(**values))
        return bool(res.rowcount)

    async def delete(self, pool: str) -> bool:
        async with self.engine.begin() as conn:
            res = await conn.execute(delete(t.rollouts).where(t.rollouts.c.pool == pool))
        return bool(res.rowcount)

    async def outcomes(self, pool: str, since_ms: int) -> list[dict[str, Any]]:
        """Ended sessions of ``pool`` seated at or after ``since_ms``: host_version, seated/started/ended, reason."""
        c = t.sessions.c
        q = (select(c.host_version, c.seated_ms, c.started_ms, c.ended_ms, c.end_reason)
             .where(c.pool == pool, c.seated_ms >= since_ms))
        async with self.engine.connect() as conn:
            return [dict(r) for r in (await conn.execute(q)).mappings().all()]
