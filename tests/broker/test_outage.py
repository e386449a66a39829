"""Redis goes away: requests get 503 and /readyz says so; the broker recovers when Redis returns."""

from __future__ import annotations

import asyncio

from broker.embedded import EmbeddedRedis, free_port
from tests.conftest import ADMIN, auth, setup_pool, user_token


async def test_redis_outage_and_recovery(aiohttp_client, settings_factory, clock, tmp_path) -> None:
    from broker.app import create_app

    port = free_port()
    redis = EmbeddedRedis(tmp_path / "r", persist=True, port=port)
    await redis.start()
    try:
        client = await aiohttp_client(create_app(settings_factory(redis_url=redis.url), clock=clock))
        await setup_pool(client, "p1", hosts=1)
        tok = await user_token(client, "alice")
        s = await (await client.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(tok))).json()

        await redis.stop()
        r = await client.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(tok))
        body = await r.json()
        assert r.status == 503 and body["code"] == "unavailable"
        ready = await client.get("/readyz")
        assert ready.status == 503 and (await ready.json())["checks"]["redis"].startswith("unavailable")
        assert (await client.get("/healthz")).status == 200  # alive, just not ready

        await redis.start()  # same port, same append-only file: live state comes back
        deadline = asyncio.get_running_loop().time() + 10
        while (await client.get("/readyz")).status != 200:
            assert asyncio.get_running_loop().time() < deadline, "broker did not recover"
            await asyncio.sleep(0.1)
        got = await (await client.get(f"/api/v1/sessions/{s['id']}", headers=auth(tok))).json()
        assert got["state"] == "starting" and got["host"] == "p1-h0"
        r = await client.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(tok))
        assert r.status == 200 and (await r.json())["id"] == s["id"]
        pool = await (await client.get("/api/v1/pools/p1", headers=auth(ADMIN))).json()
        assert pool["seats_used"] == 1
    finally:
        await redis.stop()
