"""Seat counting and placement: table tests of the pure policy, and parity with the Lua step."""

from __future__ import annotations

import json
import random

import pytest
import redis.asyncio as aioredis

from broker.models import PoolConfig
from broker.placement import GpuLoad, HostLoad, gpu_seats, place, with_session
from broker.store.live import LiveStore


@pytest.mark.parametrize(("vram", "limit", "max_per_gpu", "per_session", "headroom", "want"), [
    (24_576, None, 8, 4096, 0.2, 4),    # VRAM bound: 24 GiB * 0.8 / 4 GiB = 4.8 -> 4
    (24_576, 2, 8, 4096, 0.2, 2),       # encoder session limit bound
    (81_920, None, 3, 4096, 0.2, 3),    # max per GPU bound
    (16_384, None, 8, 4096, 0.0, 4),    # exact fit without headroom
    (16_384, None, 8, 4096, 0.25, 3),   # 12288 / 4096 = 3 exactly (no float undershoot)
    (2_048, None, 8, 4096, 0.2, 0),     # too small for one session
    (24_576, 0, 8, 1024, 0.2, 0),       # encoder limit 0: no seats
])
def test_gpu_seats(vram, limit, max_per_gpu, per_session, headroom, want) -> None:
    assert gpu_seats(vram, limit, max_per_gpu, per_session, headroom) == want


def host(hid: str, *used: int, seats: int = 2, state: str = "up") -> HostLoad:
    return HostLoad(hid, state, tuple(GpuLoad(i, seats, u) for i, u in enumerate(used)))


def test_breadth_first_spreads_and_depth_first_packs() -> None:
    hosts = [host("a", 1, 0), host("b", 0, 0), host("c", 2, 1)]
    bf = place(hosts, "breadth-first")
    df = place(hosts, "depth-first")
    assert (bf.host_id, bf.gpu_index) == ("b", 0)
    assert (df.host_id, df.gpu_index) == ("c", 1)  # fullest host still under its limit, its free GPU
    assert "breadth-first" in bf.reason and "depth-first" in df.reason


def test_draining_down_and_full_hosts_get_nothing() -> None:
    hosts = [host("a", 0, state="draining"), host("b", 0, state="down"), host("c", 2, 2)]
    assert place(hosts, "breadth-first") is None
    assert place(hosts, "depth-first") is None


def test_depth_first_fills_one_host_before_the_next() -> None:
    hosts = [host("a", 0, 0), host("b", 0, 0)]
    order = []
    for _ in range(8):
        p = place(hosts, "depth-first")
        assert p is not None
        order.append(p.host_id)
        hosts = with_session(hosts, p)
    assert order == ["a"] * 4 + ["b"] * 4
    assert place(hosts, "depth-first") is None


def test_breadth_first_alternates_and_balances_gpus() -> None:
    hosts = [host("a", 0, 0), host("b", 0, 0)]
    seq = []
    for _ in range(4):
        p = place(hosts, "breadth-first")
        assert p is not None
        seq.append((p.host_id, p.gpu_index))
        hosts = with_session(hosts, p)
    assert seq == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]


@pytest.mark.parametrize("strategy", ["breadth-first", "depth-first"])
async def test_lua_placement_matches_python_policy(redis_url: str, prefix: str, strategy: str) -> None:
    """Random host loads: the Lua seating step picks exactly what broker.placement picks."""
    rng = random.Random(7 if strategy == "breadth-first" else 11)
    r = aioredis.Redis.from_url(redis_url)
    store = LiveStore(r, prefix)
    cfg = PoolConfig(name="p", strategy=strategy, max_sessions_per_gpu=3, vram_per_session_mb=4096)
    await store.put_pool(cfg, 0)
    try:
        for trial in range(25):
            hosts: list[HostLoad] = []
            for h in range(rng.randint(1, 6)):
                hid = f"h{trial}-{h}"
                gpus = []
                for g in range(rng.randint(1, 3)):
                    gpus.append({"index": g, "vram_mb": rng.choice([8192, 16384, 24576]), "model": "x",
                                 "encoder_session_limit": rng.choice([None, 1, 2]), "nvenc": False})
                state = rng.choice(["up", "up", "up", "draining"])
                await r.hset(store.keys.host(hid), mapping={"pool": "p", "state": state, "gpus": json.dumps(gpus),
                                                            "address": "a"})
                await r.set(store.keys.host_lease(hid), 1, px=60_000)
                await r.sadd(store.keys.pool_hosts("p"), hid)
                loads = []
                for g in gpus:
                    seats = gpu_seats(g["vram_mb"], g["encoder_session_limit"], 3, 4096, 0.2)
                    used = rng.randint(0, seats)
                    await r.hset(store.keys.host(hid), f"u:{g['index']}", used)
                    loads.append(GpuLoad(g["index"], seats, used))
                hosts.append(HostLoad(hid, state, tuple(loads)))
            # the hosts were written field by field, as an older broker would have: build the index
            await store.reindex_pool("p", 1000)
            want = place(hosts, strategy)
            res = await store.create_session(f"s{trial}", f"user{trial}", "p", {}, 1000)
            assert not isinstance(res, str)
            s = await store.get_session(f"s{trial}")
            assert s is not None
            if want is None:
                assert s["state"] == "queued", trial
                await store.end_session(f"s{trial}", "cancelled", 1001)
            else:
                assert (s["host"], s["gpu"]) == (want.host_id, want.gpu_index), trial
                await store.end_session(f"s{trial}", "user", 1001)
            for h in hosts:
                await r.srem(store.keys.pool_hosts("p"), h.host_id)
    finally:
        await r.aclose()
