"""The live store's indexes: placement index, pool counters and deadlines stay equal to a recount.

Random operations (register, seat, report, end, drain, lose, remove a host, change the pool)
run through the Lua steps; after each one the counters a pool summary reads and the placement
index must equal what a full scan of the records says, the way the broker computed them before
it kept indexes.  The deadlines the Lua steps write must equal ``broker.lifecycle``'s, and a
seating or a heartbeat must cost the same number of Redis commands at 10 hosts and at 200.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import redis.asyncio as aioredis

from broker.embedded import EmbeddedRedis
from broker.lifecycle import SessionClock, Timeouts, max_duration_end_ms, next_due_ms, reap
from broker.models import Gpu, PoolConfig
from broker.placement import HostLoad
from broker.protocol import HostState, SessionState
from broker.store.keys import STAGED_STATE
from broker.store.live import LiveStore, host_load

S = SessionState
TTL_MS = 60_000


async def recount(store: LiveStore, cfg: PoolConfig) -> dict[str, Any]:
    """A pool summary from a scan of every record (what pool_summary returned before the counters)."""
    hosts = [h for h in await store.get_hosts(await store.host_ids()) if h["pool"] == cfg.name]
    loads = [host_load(h, cfg) for h in hosts]
    sessions = [s for s in await store.get_sessions(await store.live_session_ids()) if s["pool"] == cfg.name]
    staged = [s for h in hosts for s in await store.get_sessions(h["sessions"]) if s["state"] == STAGED_STATE]
    ready = sum(1 for s in staged if s["state_ms"] > 0)  # its node reported it ready
    return {
        "seats_total": sum(h.seats for h in loads if h.state == HostState.UP),
        "seats_used": sum(h.used for h in loads if h.state != HostState.DOWN),
        "seats_free": sum(h.free for h in loads if h.state == HostState.UP),
        "queue_length": await store.queue_length(cfg.name),
        "hosts": {st.value: sum(1 for h in hosts if h["state"] == st) for st in HostState},
        "sessions": {st.value: sum(1 for s in sessions if s["state"] == st) for st in S if st != S.ENDED},
        "staged_sessions": {"target": cfg.staged, "ready": ready, "starting": len(staged) - ready},
    }


def index_order(loads: list[HostLoad], strategy: str) -> list[str]:
    """The placement index as broker.placement orders candidates (up, a free seat)."""
    cands = [h for h in loads if h.state == HostState.UP and h.free > 0]
    if strategy == "depth-first":
        return [h.host_id for h in sorted(cands, key=lambda h: (-h.used, h.host_id))]
    return [h.host_id for h in sorted(cands, key=lambda h: (h.used, -h.free, h.host_id))]


async def check(store: LiveStore, cfg: PoolConfig) -> None:
    assert await store.pool_summary(cfg) == await recount(store, cfg)
    t = Timeouts(cfg.queue_timeout_s, cfg.idle_timeout_s, cfg.disconnect_timeout_s, cfg.max_duration_s,
                 close_grace_s=cfg.close_grace_s)
    for s in await store.get_sessions(await store.live_session_ids()):
        clock = SessionClock(S(s["state"]), s["created_ms"], s["seated_ms"], s["last_active_ms"], s["disconnected_ms"],
                             s["left_ms"])
        due = await store.redis.zscore(store.keys.due_sessions, s["id"])
        assert (None if due is None else int(due)) == next_due_ms(clock, t), s
        warn = await store.redis.zscore(store.keys.due_warn, s["id"])
        assert (None if warn is None else int(warn)) == max_duration_end_ms(clock, t), s
    hosts = await store.get_hosts(await store.host_ids(cfg.name))
    want = index_order([host_load(h, cfg) for h in hosts if h["state"] != HostState.DOWN], cfg.strategy)
    got = [x.decode() for x in await store.redis.zrange(store.keys.pool_avail(cfg.name), 0, -1)]
    assert got == want


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_counters_and_index_equal_a_recount_after_random_operations(redis_url: str, prefix: str,
                                                                         seed: int) -> None:
    rng = random.Random(seed)
    r = aioredis.Redis.from_url(redis_url)
    store = LiveStore(r, prefix)
    cfg = PoolConfig(name="p", strategy=rng.choice(["breadth-first", "depth-first"]), max_sessions_per_gpu=2,
                     vram_per_session_mb=4096, max_queue=50, max_sessions_per_user=2)
    now = 1_000_000
    await store.put_pool(cfg, now)
    users = 0
    try:
        for step in range(160):
            now += rng.randint(1, 3000)
            op = rng.random()
            host_ids = await store.host_ids("p")
            live = await store.get_sessions(await store.live_session_ids())
            if op < 0.12 or not host_ids:
                hid = f"h{rng.randint(0, 7)}"
                gpus = [Gpu(i, rng.choice([8192, 16384, 24576]), encoder_session_limit=rng.choice([None, 1, 3]))
                        for i in range(rng.randint(1, 3))]
                await store.register_host(hid, "p", "a:1", gpus, now, TTL_MS)
            elif op < 0.45:
                users += 1
                await store.create_session(f"s{step}", f"u{rng.randint(0, users)}", "p", {}, now)
            elif op < 0.6 and live:
                await store.end_session(rng.choice(live)["id"], "user", now)
            elif op < 0.72 and live:
                s = rng.choice(live)
                if s["host"]:
                    await store.set_session_state(s["id"], s["host"], rng.choice(["running", "disconnected"]), now)
            elif op < 0.8:
                hid = rng.choice(host_ids)
                await store.set_host_state(hid, rng.choice([HostState.UP, HostState.DRAINING]), now)
            elif op < 0.85:
                hid = rng.choice(host_ids)
                await r.delete(store.keys.host_lease(hid))
                await store.host_down(hid, now)
            elif op < 0.88:
                await store.remove_host(rng.choice(host_ids), True, "admin", now)
            elif op < 0.93:
                hid = rng.choice(host_ids)
                host = (await store.get_hosts([hid]))[0]
                reported = [s for s in host["sessions"] if rng.random() < 0.7]
                await store.heartbeat(hid, now, TTL_MS, {"gpus": [], "sessions": [
                    {"id": s, "state": rng.choice(["running", "disconnected"]), "last_input_ms": now - 5}
                    for s in reported]})
            else:
                cfg = PoolConfig(**{**cfg.to_dict(), "max_sessions_per_gpu": rng.randint(1, 3),
                                    "strategy": rng.choice(["breadth-first", "depth-first"]),
                                    "idle_timeout_s": rng.choice([0, 600]),
                                    "max_duration_s": rng.choice([0, 3600]),
                                    "disconnect_timeout_s": rng.choice([0, 300])})
                await store.put_pool(cfg, now)
            await check(store, cfg)
        # a rebuild from the records gives the same counters and index
        await store.reindex_pool("p", now)
        await check(store, cfg)
    finally:
        await r.aclose()


@pytest.mark.parametrize("seed", range(4))
async def test_lua_deadlines_equal_the_lifecycle_policy(redis_url: str, prefix: str, seed: int) -> None:
    rng = random.Random(seed)
    r = aioredis.Redis.from_url(redis_url)
    store = LiveStore(r, prefix)
    try:
        for i in range(40):
            t = Timeouts(rng.choice([0, 30, 600]), rng.choice([0, 60, 1800]), rng.choice([0, 120]),
                         rng.choice([0, 3600]), close_grace_s=rng.choice([0, 30, 600]))
            await store.put_pool(PoolConfig(name=f"p{i}", queue_timeout_s=t.queue_timeout_s,
                                            idle_timeout_s=t.idle_timeout_s,
                                            disconnect_timeout_s=t.disconnect_timeout_s,
                                            max_duration_s=t.max_duration_s, close_grace_s=t.close_grace_s), 0)
            state = rng.choice([S.QUEUED, S.STARTING, S.RUNNING, S.DISCONNECTED])
            created = rng.randint(10**6, 2 * 10**6)
            seated = 0 if state == S.QUEUED else created + rng.choice([0, 500])
            clock = SessionClock(state, created, seated, seated + rng.randint(0, 10**6),
                                 (seated + rng.randint(0, 10**5)) if state == S.DISCONNECTED else 0,
                                 rng.choice([0, seated + 1]) if seated else 0)  # left its tab on purpose
            sid = f"s{i}"
            await r.hset(store.keys.session(sid), mapping={
                "state": state.value, "pool": f"p{i}", "created_ms": clock.created_ms, "seated_ms": clock.seated_ms,
                "last_active_ms": clock.last_active_ms, "disconnected_ms": clock.disconnected_ms,
                "left_ms": clock.left_ms})
            await store.reschedule([sid], 0)
            due = await r.zscore(store.keys.due_sessions, sid)
            want = next_due_ms(clock, t)
            assert (None if due is None else int(due)) == want, (clock, t)
            warn = await r.zscore(store.keys.due_warn, sid)
            assert (None if warn is None else int(warn)) == max_duration_end_ms(clock, t), (clock, t)
            # the policy's own promise: reap ends the session exactly from the deadline on
            for now in (created, created + 10**5, created + 10**7) + ((want - 1, want) if want else ()):
                assert reap(clock, t, now).end is (want is not None and now >= want), (clock, t, now)
    finally:
        await r.aclose()


async def test_a_seating_and_a_heartbeat_cost_the_same_commands_at_10_and_200_hosts(tmp_path) -> None:
    """Redis commands (Lua-internal included) per step on a private server: constant in the fleet size."""
    server = EmbeddedRedis(tmp_path / "r", persist=False)
    url = await server.start()
    r = aioredis.Redis.from_url(url)

    async def calls() -> int:
        stats = await r.info("commandstats")
        return sum(int(v["calls"]) for k, v in stats.items() if not k.startswith("cmdstat_info"))

    try:
        costs = {}
        for n in (10, 200):
            store = LiveStore(r, f"f{n}")
            await store.put_pool(PoolConfig(name="p", max_sessions_per_gpu=3, vram_per_session_mb=1024), 0)
            for h in range(n):
                await store.register_host(f"h{h:03d}", "p", "a:1", [Gpu(g, 24576) for g in range(4)], 0, TTL_MS)
            for k in range(n * 2):  # every host carries sessions, as in a real fleet
                await store.create_session(f"w{k}", f"w{k}", "p", {}, 1)
            host = (await store.get_hosts(["h005"]))[0]
            body = {"gpus": [{"index": 0, "utilization": 50.0}], "sessions": [
                {"id": s, "state": "running", "last_input_ms": 5} for s in host["sessions"]]}
            await store.heartbeat("h005", 10, TTL_MS, body)  # the first report moves states
            await store.create_session("warm", "warm", "p", {}, 15)  # every script loaded (SCRIPT LOAD
            await store.end_session("warm", "user", 15)  # on first use counts as commands)
            a = await calls()
            await store.create_session("new", "new", "p", {}, 20)
            b = await calls()
            await store.heartbeat("h005", 30, TTL_MS, body)
            c = await calls()
            await store.end_session("new", "user", 40)
            d = await calls()
            costs[n] = (b - a, c - b, d - c)
        assert costs[10] == costs[200], costs
    finally:
        await r.aclose()
        await server.stop()


async def test_indexes_are_built_once_from_records_an_older_broker_wrote(api, clock) -> None:
    from broker.keys_app import BROKER
    from tests.conftest import auth, setup_pool, user_token

    await setup_pool(api, "p1", hosts=3, gpus_per_host=2, max_sessions_per_gpu=2)
    b = api.app[BROKER]
    for i in range(5):
        r = await api.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(await user_token(api, f"u{i}")))
        assert r.status == 201
    cfg = await b.get_pool("p1")
    before = await b.live.pool_summary(cfg)
    assert await b.ensure_indexes() is False  # built with the data: nothing to do
    # what an index-less broker leaves: no index keys, no marker, no accounting fields on hosts
    keys = b.live.keys
    await b.live.redis.delete(keys.pool_avail("p1"), keys.pool_stats("p1"), keys.due_leases, keys.due_sessions,
                              keys.due_warn, keys.index_version)
    for h in await b.live.host_ids():
        await b.live.redis.hdel(keys.host(h), "acct", "seats", "used", "free", "g", "s:0", "s:1")
    assert (await b.live.pool_summary(cfg))["seats_total"] == 0
    assert await b.ensure_indexes() is True
    assert await b.live.pool_summary(cfg) == before == await recount(b.live, cfg)
    assert await b.live.redis.zcard(keys.due_leases) == 3 and await b.live.redis.zcard(keys.due_sessions) == 5
    await check(b.live, cfg)


async def test_two_replicas_share_the_reaping_and_warn_once(aiohttp_client, settings_factory, clock) -> None:
    from broker.app import create_app
    from broker.keys_app import BROKER
    from tests.conftest import NODE, auth, setup_pool, user_token

    settings = settings_factory(warn_before_end_s=300)
    a = await aiohttp_client(create_app(settings, clock=clock))
    b = await aiohttp_client(create_app(settings, clock=clock))
    await setup_pool(a, "p1", hosts=2, max_sessions_per_gpu=1, queue_timeout_s=30, max_duration_s=600,
                     max_queue=100)
    seated, queued = [], []
    for i in range(24):
        r = await (a, b)[i % 2].post("/api/v1/sessions", json={"pool": "p1"},
                                     headers=auth(await user_token(a, f"u{i}")))
        v = await r.json()
        (seated if v["state"] == "starting" else queued).append(v)
    assert len(seated) == 2
    for v in seated:
        await a.put(f"/api/v1/hosts/{v['host']}/sessions/{v['id']}/state", json={"state": "running"},
                    headers=auth(NODE))
    ba, bb = a.app[BROKER], b.app[BROKER]
    sub = ba.live.redis.pubsub()
    await sub.psubscribe(f"{ba.live.keys.prefix}:ev:session:*")
    import asyncio

    clock.advance(30_000)
    ra, rb = await asyncio.gather(ba.reap_once(), bb.reap_once())
    ended = [sid for sid, _ in ra + rb]
    assert sorted(ended) == sorted(v["id"] for v in queued) and len(set(ended)) == len(ended)
    clock.advance(600_000 - 30_000 - 299_000)  # 299 s before max duration
    await asyncio.gather(ba.reap_once(), bb.reap_once(), ba.reap_once())
    warnings: list[str] = []
    idle = 0
    while idle < 3:  # read until the channel has been quiet three times in a row
        msg = await sub.get_message(ignore_subscribe_messages=True, timeout=0.2)
        if msg is None:
            idle += 1
            continue
        idle = 0
        data = json.loads(msg["data"])
        if data.get("type") == "warning":
            warnings.append(data["session_id"])
    assert sorted(warnings) == sorted(v["id"] for v in seated)
    await sub.aclose()
