"""SQL layer on SQLite and PostgreSQL: migrations, idempotent outbox writes, audit, samples, full flow."""

from __future__ import annotations

from sqlalchemy import inspect

from broker.db import tables
from broker.db.engine import create_engine, migrate
from broker.db.repository import Repository, session_row
from tests.conftest import ADMIN, auth, setup_pool, user_token

ENDED = {"id": "s1", "pool": "p", "user": "u", "host": "h", "gpu": "0", "kind": "desktop",
         "profile": '{"width": 1280}', "created_ms": "1000", "seated_ms": "3000", "started_ms": "3500",
         "ended_ms": "63000", "end_reason": "idle_timeout"}


def test_session_row_derives_wait_and_gpu_seconds() -> None:
    row = session_row(ENDED)
    assert (row["wait_s"], row["gpu_seconds"], row["gpu"], row["profile"]) == (2.0, 60.0, 0, {"width": 1280})
    never_seated = session_row({**ENDED, "seated_ms": "0", "host": "", "gpu": "", "ended_ms": "31000"})
    assert (never_seated["gpu_seconds"], never_seated["wait_s"], never_seated["host"]) == (0.0, 30.0, None)


async def test_migration_and_idempotent_writes(any_db_url: str) -> None:
    engine = create_engine(any_db_url)
    try:
        await migrate(engine)
        await migrate(engine)  # a second replica starting: no-op
        async with engine.connect() as conn:
            names = await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
        assert set(tables.ALL_TABLES) <= names
        repo = Repository(engine)
        await repo.record_end(ENDED, 63000)
        await repo.record_end(ENDED, 63000)  # delivered twice by the outbox: still one row, one audit entry
        assert await repo.count_sessions() == 1
        assert [e["action"] for e in await repo.audit_log()] == ["session.end"]
        hist = await repo.get_history("s1")
        assert hist is not None and hist["gpu_seconds"] == 60.0 and hist["end_reason"] == "idle_timeout"
        started = {**ENDED, "id": "s2", "ended_ms": "0", "end_reason": ""}
        batch = [("start", started, 5000), ("end", {**started, "ended_ms": "9000", "end_reason": "user"}, 9000)]
        await repo.record_batch(batch)
        await repo.record_batch(batch)  # redelivered after a crash: nothing doubles
        assert await repo.count_sessions() == 2
        assert sorted(e["action"] for e in await repo.audit_log()) == ["session.end", "session.end", "session.start"]
        assert (await repo.get_history("s2"))["gpu_seconds"] == 6.0
        await repo.save_pool("p", {"max_queue": 5}, 1)
        await repo.save_pool("p", {"max_queue": 6}, 2)
        assert await repo.load_pools() == [{"name": "p", "max_queue": 6}]
        await repo.add_samples([{"ts_ms": t, "pool": "p", "sessions": t, "seats_used": t, "seats_total": 8,
                                 "queue_length": 0, "hosts_up": 2} for t in (10, 20, 30)])
        assert [s["ts_ms"] for s in await repo.samples("p", 15)] == [20, 30]
    finally:
        await engine.dispose()


async def test_full_flow_on_each_database(aiohttp_client, settings_factory, clock, any_db_url) -> None:
    from broker.app import create_app
    from broker.keys_app import BROKER

    client = await aiohttp_client(create_app(settings_factory(database_url=any_db_url), clock=clock))
    await setup_pool(client, "p1", hosts=1)
    tok = await user_token(client, "alice")
    s = await (await client.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(tok))).json()
    clock.advance(90_000)
    await client.delete(f"/api/v1/sessions/{s['id']}", headers=auth(tok))
    await client.app[BROKER].drain_outbox()
    rows = (await (await client.get("/api/v1/sessions/history", headers=auth(ADMIN))).json())["sessions"]
    assert [(r["id"], r["gpu_seconds"], r["end_reason"]) for r in rows] == [(s["id"], 90.0, "user")]
    # the pool definition is durable in SQL: a wiped Redis gets it back at start
    await client.app[BROKER].live.redis.delete(client.app[BROKER].live.keys.pool("p1"),
                                               client.app[BROKER].live.keys.pools)
    assert await client.app[BROKER].restore_pools() == 1
    assert (await client.get("/api/v1/pools/p1", headers=auth(ADMIN))).status == 200
