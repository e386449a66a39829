"""Two broker processes on one Redis: concurrent requests never over-seat, queue in order, drain cleanly."""

from __future__ import annotations

import asyncio
import random

import aiohttp
import pytest
import redis.asyncio as aioredis

from tests.conftest import ADMIN, NODE, SECRET, auth, gpu
from tests.procs import broker_process

USERS = 240
SEATS = 8  # 2 hosts x 2 GPUs x 2 seats


@pytest.mark.e2e
async def test_two_replicas_hundreds_of_concurrent_requests(redis_url, prefix, tmp_path) -> None:
    env = {"BROKER_REDIS_URL": redis_url, "BROKER_REDIS_PREFIX": prefix, "BROKER_ADMIN_TOKEN": ADMIN,
           "BROKER_NODE_TOKEN": NODE, "BROKER_SECRET": SECRET, "BROKER_DATA_DIR": str(tmp_path / "d"),
           "BROKER_DATABASE_URL": f"sqlite:///{tmp_path / 'race.db'}", "BROKER_REAPER_INTERVAL_S": "3600",
           "BROKER_LOG_LEVEL": "warning"}
    async with broker_process(env, str(tmp_path / "a.log")) as a, broker_process(env, str(tmp_path / "b.log")) as b:
        async with aiohttp.ClientSession() as http:
            r = await http.put(f"{a.url}/api/v1/pools/race", json={
                "max_sessions_per_gpu": 2, "vram_per_session_mb": 4096, "max_queue": USERS}, headers=auth(ADMIN))
            assert r.status == 201
            for h in range(2):
                r = await http.post(f"{b.url}/api/v1/hosts", json={
                    "id": f"race-h{h}", "pool": "race", "address": f"10.1.0.{h}:1", "gpus": [gpu(0), gpu(1)]},
                    headers=auth(NODE))
                assert r.status == 201
            tokens = []
            for i in range(USERS):
                r = await http.post(f"{a.url}/api/v1/tokens", json={"user": f"user{i}"}, headers=auth(ADMIN))
                tokens.append((await r.json())["token"])
            rng = random.Random(3)

            async def request(i: int) -> dict:
                base = rng.choice([a.url, b.url])
                async with http.post(f"{base}/api/v1/sessions", json={"pool": "race"},
                                     headers=auth(tokens[i])) as resp:
                    assert resp.status == 201, await resp.text()
                    return await resp.json()

            views = await asyncio.gather(*[request(i) for i in range(USERS)])
            seated = [v for v in views if v["state"] == "starting"]
            queued = [v for v in views if v["state"] == "queued"]
            assert len(seated) == SEATS and len(queued) == USERS - SEATS
            # zero over-seating: every GPU has exactly its 2 seats used
            r = await http.get(f"{a.url}/api/v1/hosts?pool=race", headers=auth(ADMIN))
            hosts = (await r.json())["hosts"]
            assert sorted(g["used"] for h in hosts for g in h["gpus"]) == [2, 2, 2, 2]
            assert len({v["id"] for v in views}) == USERS
            # queue positions are exactly 1..N, one each
            positions = sorted(v["queue_position"] for v in queued)
            assert positions == list(range(1, len(queued) + 1))

            rc = aioredis.Redis.from_url(redis_url)
            queue_order = [x.decode() for x in await rc.lrange(f"{prefix}:pool:race:queue", 0, -1)]
            by_id = {v["id"]: tokens[int(v["user"][4:])] for v in views}
            # end the seated sessions through alternating replicas: the queue head gets each seat, in order
            for i, v in enumerate(seated):
                base = (a.url, b.url)[i % 2]
                r = await http.delete(f"{base}/api/v1/sessions/{v['id']}", headers=auth(by_id[v["id"]]))
                assert r.status == 200
            now_seated = [x.decode() for h in ("race-h0", "race-h1")
                          for x in await rc.smembers(f"{prefix}:host:{h}:sessions")]
            assert sorted(now_seated) == sorted(queue_order[:SEATS])
            # cancel everything; no seat, queue entry or live record is left
            ends = await asyncio.gather(*[http.delete(f"{a.url}/api/v1/sessions/{sid}", headers=auth(by_id[sid]))
                                          for sid in by_id])
            assert [r.status for r in ends] == [200] * USERS, [await r.text() for r in ends if r.status != 200][:3]
            assert await rc.llen(f"{prefix}:pool:race:queue") == 0
            assert await rc.scard(f"{prefix}:live") == 0
            for h in ("race-h0", "race-h1"):
                counts = await rc.hmget(f"{prefix}:host:{h}", "u:0", "u:1")
                assert [int(c) for c in counts] == [0, 0]
            await rc.aclose()
            r = await http.get(f"{b.url}/api/v1/pools/race", headers=auth(ADMIN))
            pool = await r.json()
            assert (pool["seats_used"], pool["seats_free"], pool["queue_length"]) == (0, SEATS, 0)
