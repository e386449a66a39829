"""SQL repository: history, audit, durable pool configs and utilization samples.

Writes are idempotent where they come from the Redis outbox (a record may be
delivered twice if a replica dies between writing and acknowledging): session
rows are keyed by session id and audit rows by a ``dedup_key``.

Concurrency: one AsyncEngine per process; each call takes its own connection.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, func, insert, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from broker.db import tables as t


def session_row(s: dict[str, Any]) -> dict[str, Any]:
    """A history row from an ended session record (as the Lua outbox emits it)."""
    def num(key: str) -> int:
        return int(float(s.get(key) or 0))

    created, seated, ended = num("created_ms"), num("seated_ms"), num("ended_ms")
    profile = s.get("profile")
    if isinstance(profile, str) and profile:
        profile = json.loads(profile)
    gpu = s.get("gpu")
    return {
        "id": s["id"], "pool": s["pool"], "user": s["user"], "host": s.get("host") or None,
        "gpu": int(gpu) if gpu not in (None, "") else None, "kind": s.get("kind"), "profile": profile or None,
        "created_ms": created, "seated_ms": seated or None, "started_ms": num("started_ms") or None,
        "ended_ms": ended or None, "end_reason": s.get("end_reason") or None,
        "wait_s": ((seated or ended) - created) / 1000.0 if (seated or ended) else None,
        "gpu_seconds": (ended - seated) / 1000.0 if seated and ended else 0.0,
        "host_version": (s.get("host_version") or None) if seated else None,
    }


def live_row(s: dict[str, Any]) -> dict[str, Any]:
    """A ``live_sessions`` row from a queued or start outbox record."""
    def num(key: str) -> int:
        return int(float(s.get(key) or 0))

    profile = s.get("profile")
    if isinstance(profile, str) and profile:
        profile = json.loads(profile)
    gpu = s.get("gpu")
    return {"id": s["id"], "pool": s["pool"], "user": s["user"], "host": s.get("host") or None,
            "gpu": int(gpu) if gpu not in (None, "") else None, "kind": s.get("kind") or None,
            "profile": profile or None, "created_ms": num("created_ms"), "seated_ms": num("seated_ms") or None}


async def _apply_live(conn: Any, live: dict[str, dict[str, Any]], ended: set[str]) -> None:
    """Write ``live_sessions`` rows (a seated row replaces a queued one; a queued one never replaces
    anything) and drop the rows of sessions that ended, here or in an earlier batch."""
    c = t.live_sessions.c
    if live:
        ids = list(live)
        have = {r[0] for r in (await conn.execute(select(c.id).where(c.id.in_(ids)))).all()}
        done = {r[0] for r in (await conn.execute(select(t.sessions.c.id).where(t.sessions.c.id.in_(ids)))).all()}
        seated = [i for i in ids if live[i]["host"] and i in have and i not in done]
        if seated:
            await conn.execute(delete(t.live_sessions).where(c.id.in_(seated)))
        fresh = [live[i] for i in ids if i not in done and (i not in have or i in seated)]
        if fresh:
            await conn.execute(insert(t.live_sessions), fresh)
    if ended:
        await conn.execute(delete(t.live_sessions).where(c.id.in_(list(ended))))


def _upserts(mod: Any) -> tuple[Any, Any]:
    """(history rows upserted on the id, audit rows skipped when their dedup key exists) for a dialect's
    ``insert``; executed with a list of row dicts (executemany)."""
    stmt = mod(t.sessions)
    sessions = stmt.on_conflict_do_update(index_elements=["id"], set_={
        c.name: stmt.excluded[c.name] for c in t.sessions.c if c.name != "id"})
    return sessions, mod(t.audit).on_conflict_do_nothing(index_elements=["dedup_key"])


# immutable statements, one pair per dialect with ON CONFLICT (others write row by row)
_UPSERTS: dict[str, tuple[Any, Any]] = {"sqlite": _upserts(sqlite_insert), "postgresql": _upserts(pg_insert)}


class Repository:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def ping(self) -> bool:
        async with self.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
        return True

    # ---- audit ---------------------------------------------------------------------
    async def audit(self, ts_ms: int, actor: str, role: str, action: str, target: str | None,
                    detail: dict[str, Any] | None = None, dedup_key: str | None = None) -> bool:
        """Append an audit row; False when ``dedup_key`` was already written."""
        try:
            async with self.engine.begin() as conn:
                await conn.execute(insert(t.audit).values(
                    ts_ms=ts_ms, actor=actor, role=role, action=action, target=target,
                    detail=detail or {}, dedup_key=dedup_key))
            return True
        except IntegrityError:
            return False

    async def audit_log(self, limit: int = 100, before_id: int | None = None,
                        action: str | None = None) -> list[dict[str, Any]]:
        q = select(t.audit).order_by(t.audit.c.id.desc()).limit(limit)
        if before_id is not None:
            q = q.where(t.audit.c.id < before_id)
        if action:
            q = q.where(t.audit.c.action == action)
        async with self.engine.connect() as conn:
            rows = (await conn.execute(q)).mappings().all()
        return [{k: v for k, v in r.items() if k != "dedup_key"} for r in rows]

    # ---- session history -------------------------------------------------------------
    async def record_start(self, s: dict[str, Any], ts_ms: int) -> None:
        """Audit a session seat (start) from an outbox record; idempotent."""
        await self.audit(ts_ms, s["user"], "user", "session.start", s["id"],
                         {"pool": s["pool"], "host": s.get("host"), "gpu": s.get("gpu")},
                         dedup_key=f"start:{s['id']}")

    async def record_end(self, s: dict[str, Any], ts_ms: int) -> None:
        """Write the history row and audit the end; idempotent on the session id."""
        row = session_row(s)
        try:
            async with self.engine.begin() as conn:
                await conn.execute(insert(t.sessions).values(**row))
        except IntegrityError:
            async with self.engine.begin() as conn:
                await conn.execute(update(t.sessions).where(t.sessions.c.id == row["id"]).values(**row))
        await self.audit(ts_ms, s["user"], "user", "session.end", s["id"],
                         {"pool": s["pool"], "host": s.get("host"), "reason": row["end_reason"],
                          "gpu_seconds": row["gpu_seconds"]}, dedup_key=f"end:{s['id']}")

    async def record_batch(self, items: Sequence[tuple[str, dict[str, Any], int]]) -> None:
        """Write many outbox records (kind, session, ts_ms) in one transaction; idempotent.

        Kinds: ``queued`` (a session waits: a ``live_sessions`` row), ``start`` (seated: the row gets
        its host, plus an audit row), ``end`` (a ``sessions`` history row, an audit row, the live row
        goes).  Session rows upsert on the id; audit rows are skipped when their dedup key exists; a
        record replayed after its session's end never brings the live row back.
        """
        if not items:
            return
        audits: list[dict[str, Any]] = []
        rows: dict[str, dict[str, Any]] = {}
        live: dict[str, dict[str, Any]] = {}
        for kind, s, _ts in items:
            if kind in ("queued", "start") and (kind == "start" or s["id"] not in live):
                live[s["id"]] = live_row(s)
        live_only = [(k, s, ts) for k, s, ts in items if k != "queued"]
        if not live_only:
            async with self.engine.begin() as conn:
                await _apply_live(conn, live, set())
            return
        items = live_only
        for kind, s, ts in items:
            if kind == "start":
                audits.append({"ts_ms": ts, "actor": s["user"], "role": "user", "action": "session.start",
                               "target": s["id"], "detail": {"pool": s["pool"], "host": s.get("host"),
                                                             "gpu": s.get("gpu")}, "dedup_key": f"start:{s['id']}"})
            else:
                row = session_row(s)
                rows[row["id"]] = row
                audits.append({"ts_ms": ts, "actor": s["user"], "role": "user", "action": "session.end",
                               "target": s["id"], "detail": {"pool": s["pool"], "host": s.get("host"),
                                                             "reason": row["end_reason"],
                                                             "gpu_seconds": row["gpu_seconds"]},
                               "dedup_key": f"end:{s['id']}"})
        async with self.engine.begin() as conn:
            dialect = conn.dialect.name
            if dialect in _UPSERTS:
                # executemany of one statement built once: SQLAlchemy compiles it once per column set
                # (its cache), where a multi-row VALUES statement was compiled afresh on the event loop
                # for every batch (profiled: most of the outbox's cost, docs/benchmarks.md)
                upsert_sessions, insert_audits = _UPSERTS[dialect]
                if rows:
                    await conn.execute(upsert_sessions, list(rows.values()))
                await conn.execute(insert_audits, audits)
                await _apply_live(conn, live, set(rows))
                return
        for kind, s, ts in items:  # other dialects: row by row
            await (self.record_start(s, ts) if kind == "start" else self.record_end(s, ts))
        async with self.engine.begin() as conn:
            await _apply_live(conn, live, set(rows))

    # ---- live sessions (what SQL knows is not ended; see tables.live_sessions) ----------
    async def live_rows(self, ids: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        """``live_sessions`` rows by id (all of them when ``ids`` is None)."""
        q = select(t.live_sessions)
        if ids is not None:
            if not ids:
                return {}
            q = q.where(t.live_sessions.c.id.in_(list(ids)))
        async with self.engine.connect() as conn:
            return {r["id"]: dict(r) for r in (await conn.execute(q)).mappings().all()}

    async def ended_ids(self, ids: Sequence[str]) -> set[str]:
        """Which of ``ids`` have a history row (ended)."""
        if not ids:
            return set()
        async with self.engine.connect() as conn:
            res = await conn.execute(select(t.sessions.c.id).where(t.sessions.c.id.in_(list(ids))))
            return {r[0] for r in res.all()}

    async def end_lost(self, rows: Sequence[dict[str, Any]], now_ms: int, reason: str) -> int:
        """End in SQL sessions whose live state is gone (history row with ``reason``, audit, live row
        dropped); one transaction; returns how many were ended (a session already in history is not)."""
        if not rows:
            return 0
        done = await self.ended_ids([r["id"] for r in rows])
        todo = [r for r in rows if r["id"] not in done]
        async with self.engine.begin() as conn:
            for r in todo:
                s = {**r, "ended_ms": now_ms, "end_reason": reason}
                await conn.execute(insert(t.sessions).values(**session_row(s)))
                await conn.execute(insert(t.audit).values(
                    ts_ms=now_ms, actor=r["user"], role="user", action="session.end", target=r["id"],
                    detail={"pool": r["pool"], "host": r.get("host"), "reason": reason, "gpu_seconds": 0.0},
                    dedup_key=f"end:{r['id']}"))
            await conn.execute(delete(t.live_sessions).where(t.live_sessions.c.id.in_([r["id"] for r in rows])))
        return len(todo)

    async def session_history(self, pool: str | None = None, user: str | None = None,
                              limit: int = 100) -> list[dict[str, Any]]:
        q = select(t.sessions).order_by(t.sessions.c.created_ms.desc()).limit(limit)
        if pool:
            q = q.where(t.sessions.c.pool == pool)
        if user:
            q = q.where(t.sessions.c.user == user)
        async with self.engine.connect() as conn:
            return [dict(r) for r in (await conn.execute(q)).mappings().all()]

    async def get_history(self, session_id: str) -> dict[str, Any] | None:
        async with self.engine.connect() as conn:
            r = (await conn.execute(select(t.sessions).where(t.sessions.c.id == session_id))).mappings().first()
        return dict(r) if r else None

    async def count_sessions(self, pool: str | None = None) -> int:
        q = select(func.count()).select_from(t.sessions)
        if pool:
            q = q.where(t.sessions.c.pool == pool)
        async with self.engine.connect() as conn:
            return int((await conn.execute(q)).scalar_one())

    # ---- pools (durable copy) ----------------------------------------------------------
    async def save_pool(self, name: str, config: dict[str, Any], ts_ms: int) -> None:
        async with self.engine.begin() as conn:
            res = await conn.execute(update(t.pools).where(t.pools.c.name == name)
                                     .values(config=config, updated_ms=ts_ms))
            if res.rowcount == 0:
                await conn.execute(insert(t.pools).values(name=name, config=config, updated_ms=ts_ms))

    async def delete_pool(self, name: str) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(delete(t.pools).where(t.pools.c.name == name))

    async def load_pools(self) -> list[dict[str, Any]]:
        async with self.engine.connect() as conn:
            rows = (await conn.execute(select(t.pools).order_by(t.pools.c.name))).mappings().all()
        return [{"name": r["name"], **r["config"]} for r in rows]

    # ---- utilization samples --------------------------------------------------------------
    async def add_samples(self, rows: Sequence[dict[str, Any]]) -> None:
        if rows:
            async with self.engine.begin() as conn:
                await conn.execute(insert(t.pool_samples), list(rows))

    async def samples(self, pool: str, since_ms: int, until_ms: int | None = None) -> list[dict[str, Any]]:
        q = select(t.pool_samples).where(t.pool_samples.c.pool == pool, t.pool_samples.c.ts_ms >= since_ms)
        if until_ms is not None:
            q = q.where(t.pool_samples.c.ts_ms <= until_ms)
        async with self.engine.connect() as conn:
            rows = (await conn.execute(q.order_by(t.pool_samples.c.ts_ms))).mappings().all()
        return [{k: v for k, v in r.items() if k != "id"} for r in rows]

    # ---- autoscaling: plans, decision log, recommendations ------------------------------
    async def save_plan(self, pool: str, plan: dict[str, Any], ts_ms: int) -> bool:
        """Create or replace a pool's scaling plan; True when it was created."""
        async with self.engine.begin() as conn:
            res = await conn.execute(update(t.scaling_plans).where(t.scaling_plans.c.pool == pool)
                                     .values(plan=plan, updated_ms=ts_ms))
            if res.rowcount == 0:
                await conn.execute(insert(t.scaling_plans).values(pool=pool, plan=plan, updated_ms=ts_ms))
                return True
        return False

    async def get_plan(self, pool: str) -> dict[str, Any] | None:
        """``{"pool", "plan", "updated_ms"}`` or None when the pool has no plan."""
        async with self.engine.connect() as conn:
            r = (await conn.execute(select(t.scaling_plans).where(t.scaling_plans.c.pool == pool))).mappings().first()
        return dict(r) if r else None

    async def list_plans(self) -> dict[str, dict[str, Any]]:
        """Every stored plan body by pool name."""
        async with self.engine.connect() as conn:
            rows = (await conn.execute(select(t.scaling_plans).order_by(t.scaling_plans.c.pool))).mappings().all()
        return {r["pool"]: r["plan"] for r in rows}

    async def delete_plan(self, pool: str) -> bool:
        async with self.engine.begin() as conn:
            res = await conn.execute(delete(t.scaling_plans).where(t.scaling_plans.c.pool == pool))
        return bool(res.rowcount)

    async def add_decisions(self, rows: Sequence[dict[str, Any]]) -> None:
        """Append autoscaler decision rows (ts_ms, pool, phase, kind, host, count, reason, detail)."""
        if rows:
            async with self.engine.begin() as conn:
                await conn.execute(insert(t.autoscale_decisions), list(rows))

    async def decisions(self, pool: str, limit: int = 50) -> list[dict[str, Any]]:
        """A pool's autoscaler decisions, newest first."""
        q = (select(t.autoscale_decisions).where(t.autoscale_decisions.c.pool == pool)
             .order_by(t.autoscale_decisions.c.id.desc()).limit(limit))
        async with self.engine.connect() as conn:
            return [dict(r) for r in (await conn.execute(q)).mappings().all()]

    async def save_recommendation(self, pool: str, result: dict[str, Any], ts_ms: int) -> None:
        async with self.engine.begin() as conn:
            res = await conn.execute(update(t.recommendations).where(t.recommendations.c.pool == pool)
                                     .values(result=result, ts_ms=ts_ms))
            if res.rowcount == 0:
                await conn.execute(insert(t.recommendations).values(pool=pool, result=result, ts_ms=ts_ms))

    async def get_recommendation(self, pool: str) -> dict[str, Any] | None:
        """``{"pool", "ts_ms", "result"}`` or None."""
        async with self.engine.connect() as conn:
            r = (await conn.execute(select(t.recommendations).where(t.recommendations.c.pool == pool))
                 ).mappings().first()
        return dict(r) if r else None

    async def pool_demand(self, pool: str, since_ms: int, until_ms: int) -> list[tuple[int, int | None, int | None]]:
        """(created_ms, seated_ms, ended_ms) of the pool's ended sessions requested in [since, until)."""
        c = t.sessions.c
        q = (select(c.created_ms, c.seated_ms, c.ended_ms)
             .where(c.pool == pool, c.created_ms >= since_ms, c.created_ms < until_ms).order_by(c.created_ms))
        async with self.engine.connect() as conn:
            return [(int(r[0]), r[1], r[2]) for r in (await conn.execute(q)).all()]
