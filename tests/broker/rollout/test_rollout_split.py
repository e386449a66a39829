"""The seating split of a canary rollout in the live store (real Redis, the Lua steps).

While a pool has a rollout, ``avail:c`` and ``avail:s`` must partition its placement index by
host version after every step, with the index's own scores; without one they must not exist.
Seatings prefer the candidate exactly as ``prefers_candidate`` says, fall back to the other
class when the preferred one is full, and never over-seat.
"""

from __future__ import annotations

import random

import pytest
import redis.asyncio as aioredis

from broker.models import Gpu, PoolConfig
from broker.protocol import HostState
from broker.rollout.policy import prefers_candidate
from broker.store.live import LiveStore
from tests.broker.test_indexes import check

TTL_MS = 60_000


async def check_split(store: LiveStore, pool: str) -> None:
    avail = dict(await store.redis.zrange(store.keys.pool_avail(pool), 0, -1, withscores=True))
    cand = dict(await store.redis.zrange(store.keys.pool_avail_class(pool, "c"), 0, -1, withscores=True))
    stable = dict(await store.redis.zrange(store.keys.pool_avail_class(pool, "s"), 0, -1, withscores=True))
    split = await store.rollout_split(pool)
    if split is None:
        assert cand == {} and stable == {}
        return
    assert set(cand).isdisjoint(stable)
    assert {**cand, **stable} == avail
    for h in cand:
        assert (await store.redis.hget(store.keys.host(h.decode()), "version")).decode() == split["version"]
    for h in stable:
        assert (await store.redis.hget(store.keys.host(h.decode()), "version") or b"").decode() != split["version"]


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_class_indexes_partition_the_placement_index_after_random_operations(redis_url: str, prefix: str,
                                                                                  seed: int) -> None:
    rng = random.Random(seed)
    r = aioredis.Redis.from_url(redis_url)
    store = LiveStore(r, prefix)
    cfg = PoolConfig(name="p", strategy=rng.choice(["breadth-first", "depth-first"]), max_sessions_per_gpu=2,
                     vram_per_session_mb=4096, max_queue=50, max_sessions_per_user=2)
    now = 1_000_000
    await store.put_pool(cfg, now)
    try:
        for step in range(160):
            now += rng.randint(1, 3000)
            op = rng.random()
            host_ids = await store.host_ids("p")
            live = await store.get_sessions(await store.live_session_ids())
            if op < 0.15 or not host_ids:
                gpus = [Gpu(i, 16384) for i in range(rng.randint(1, 2))]
                await store.register_host(f"h{rng.randint(0, 7)}", "p", "a:1", gpus, now, TTL_MS,
                                          rng.choice(["1.0", "1.1", ""]))
            elif op < 0.45:
                await store.create_session(f"s{step}", f"u{step}", "p", {}, now)
            elif op < 0.6 and live:
                await store.end_session(rng.choice(live)["id"], rng.choice(["user", "start_failed"]), now)
            elif op < 0.7:
                await store.set_host_state(rng.choice(host_ids), rng.choice([HostState.UP, HostState.DRAINING]), now)
            elif op < 0.75:
                hid = rng.choice(host_ids)
                await r.delete(store.keys.host_lease(hid))
                await store.host_down(hid, now)
            elif op < 0.78:
                await store.remove_host(rng.choice(host_ids), True, "admin", now)
            elif op < 0.9:
                version = rng.choice(["", "1.1", "1.0"])
                assert await store.set_rollout("p", version, rng.randint(0, 100)) == "ok"
            else:
                cfg = PoolConfig(**{**cfg.to_dict(), "max_sessions_per_gpu": rng.randint(1, 3),
                                    "strategy": rng.choice(["breadth-first", "depth-first"])})
                await store.put_pool(cfg, now)
            await check(store, cfg)  # the placement index and counters stay exact
            await check_split(store, "p")
        await store.reindex_pool("p", now)
        await check_split(store, "p")
    finally:
        await r.aclose()


async def test_seatings_follow_the_share_fall_back_when_full_and_never_over_seat(redis_url: str, prefix: str) -> None:
    r = aioredis.Redis.from_url(redis_url)
    store = LiveStore(r, prefix)
    now = 1_000_000
    await store.put_pool(PoolConfig(name="p", max_sessions_per_gpu=5, vram_per_session_mb=1024, max_queue=100), now)
    try:
        for h, version, gpus in (("c0", "2.0", 1), ("c1", "2.0", 1), ("s0", "1.0", 2), ("s1", "1.0", 2)):
            await store.register_host(h, "p", "a:1", [Gpu(i, 24576) for i in range(gpus)], now, TTL_MS, version)
        assert await store.set_rollout("p", "2.0", 25) == "ok"
        hosts: list[str] = []
        for i in range(16):  # 10 candidate seats, 20 stable ones
            res = await store.create_session(f"s{i}", f"u{i}", "p", {}, now)
            assert not isinstance(res, str) and res.status == "seated" and res.session is not None
            hosts.append(res.session["host"])
            assert res.session["host_version"] == ("2.0" if res.session["host"].startswith("c") else "1.0")
        want = [prefers_candidate(n, 25) for n in range(1, 17)]
        assert [h.startswith("c") for h in hosts] == want and sum(want) == 4
        assert (await store.rollout_split("p")) == {"version": "2.0", "share_pct": 25, "seatings": 16}

        # the candidate share at 100 %: the candidate's 6 free seats fill, then the stable hosts take the rest
        assert await store.set_rollout("p", "2.0", 100) == "ok"
        for i in range(16, 24):
            res = await store.create_session(f"s{i}", f"u{i}", "p", {}, now)
            assert not isinstance(res, str) and res.session is not None
            hosts.append(res.session["host"])
        assert [h[0] for h in hosts[16:]] == ["c"] * 6 + ["s"] * 2
        hosts_now = await store.get_hosts(await store.host_ids("p"))
        loads = {h["id"]: sum(g["used"] for g in h["gpus"]) for h in hosts_now}
        assert loads == {"c0": 5, "c1": 5, "s0": 7, "s1": 7}
        assert all(g["used"] <= 5 for h in hosts_now for g in h["gpus"])  # never over a GPU's seats
        await check_split(store, "p")
        # stopping the rollout removes the split; seatings use the whole index again
        assert await store.set_rollout("p", "", 0) == "ok"
        assert await store.rollout_split("p") is None
        await check_split(store, "p")
    finally:
        await r.aclose()
