"""``render-broker bench``: allocation throughput and latency, side by side with a bare baseline.

Two servers run as separate processes, one after the other, driven by the same
client loop in this process:

1. the broker (``render-broker serve``) with a pool big enough that nothing
   queues; each client loop does POST /api/v1/sessions (the measured seat
   step: auth, validation, one Lua script, JSON) then DELETE it (not measured);
2. a bare aiohttp app whose handler does one Redis call (INCR), the floor any
   Redis-backed HTTP service pays on this machine; the client loop likewise
   follows each POST with a DELETE (one Redis call, DECR; not measured), so both
   servers serve the same request mix and throughput is counted the same way
   (POST time only).

The ratio of the two shows the broker's own overhead.  Redis: the URL given,
else the system one on 127.0.0.1:6379, else an embedded redis-server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from redis.exceptions import RedisError

from broker.embedded import EmbeddedRedis, free_port
from rbcommon.procs import terminate_group


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far; NaN where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


@dataclass
class Run:
    """One server's run: seat steps per second of POST time, POST latencies, and the server process's
    CPU per loop iteration (POST + DELETE): the cost the other processes sharing the cores cannot skew."""

    per_s: float
    lat: list[float]
    cpu_ms: float


async def _wait(url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with http.get(url) as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise TimeoutError(url)


async def _spawn(args: list[str], env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(*args, env={**os.environ, **env}, stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.DEVNULL, start_new_session=True)


async def _drive(clients: int, duration_s: float, one: OneCall) -> tuple[int, list[float]]:
    lat: list[float] = []
    stop_at = time.monotonic() + duration_s

    async def loop(i: int) -> None:
        while time.monotonic() < stop_at:
            t0 = time.perf_counter()
            await one(i)
            lat.append(time.perf_counter() - t0)

    await asyncio.gather(*[loop(i) for i in range(clients)])
    return len(lat), lat


class OneCall:
    async def __call__(self, i: int) -> None: ...


async def _delete_keys(redis_url: str, pattern: str) -> int:
    """Delete the keys matching ``pattern`` (a run's own prefix: the Redis may be shared); returns how many."""
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(redis_url)
    try:
        keys = [k async for k in r.scan_iter(pattern, count=1000)]
        for i in range(0, len(keys), 1000):
            await r.delete(*keys[i:i + 1000])
        return len(keys)
    finally:
        await r.aclose()


async def bench_broker(redis_url: str, clients: int, duration_s: float, prefix: str = "") -> Run:
    """Measure the broker; its state lives under ``prefix`` (default: a fresh ``bench??????``), deleted after."""
    port = free_port()
    admin, node = uuid.uuid4().hex, uuid.uuid4().hex
    prefix = prefix or "bench" + admin[:6]
    with tempfile.TemporaryDirectory() as tmp:
        env = {"BROKER_PORT": str(port), "BROKER_REDIS_URL": redis_url, "BROKER_REDIS_PREFIX": prefix,
               "BROKER_ADMIN_TOKEN": admin, "BROKER_NODE_TOKEN": node, "BROKER_SECRET": admin,
               "BROKER_DATA_DIR": tmp, "BROKER_LOG_LEVEL": "warning", "BROKER_REAPER_INTERVAL_S": "5"}
        proc = await _spawn([sys.executable, "-m", "broker", "serve"], env)
        base = f"http://127.0.0.1:{port}"
        try:
            await _wait(base + "/readyz")
            h = {"Authorization": f"Bearer {admin}"}
            async with aiohttp.ClientSession() as http:
                await http.put(f"{base}/api/v1/pools/bench", json={
                    "max_sessions_per_gpu": 64, "vram_per_session_mb": 1, "max_queue": 10_000}, headers=h)
                for n in range(8):
                    await http.post(f"{base}/api/v1/hosts", json={
                        "id": f"bench-{n}", "pool": "bench", "address": f"10.9.0.{n}:1",
                        "gpus": [{"index": g, "vram_mb": 81920} for g in range(4)]},
                        headers={"Authorization": f"Bearer {node}"})
                tokens = []
                for i in range(clients):
                    r = await http.post(f"{base}/api/v1/tokens", json={"user": f"b{i}"}, headers=h)
                    tokens.append({"Authorization": f"Bearer {(await r.json())['token']}"})

                class Seat(OneCall):
                    async def __call__(self, i: int) -> None:
                        async with http.post(f"{base}/api/v1/sessions", json={"pool": "bench"},
                                             headers=tokens[i]) as r:
                            sid = (await r.json())["id"]
                            assert r.status == 201, r.status
                        t = time.perf_counter()
                        async with http.delete(f"{base}/api/v1/sessions/{sid}", headers=tokens[i]) as r:
                            await r.read()
                        self.ended += time.perf_counter() - t

                    ended = 0.0

                seat = Seat()
                t0, cpu0 = time.perf_counter(), _cpu_s(proc.pid)
                n, lat = await _drive(clients, duration_s, seat)
                wall, cpu = time.perf_counter() - t0, _cpu_s(proc.pid) - cpu0
            # DELETE time is excluded from latency but shares the wall clock: count seat steps per
            # second of POST time only, i.e. as if the client did nothing else
            busy = wall - seat.ended / clients
            return Run(n / busy, lat, cpu / max(n, 1) * 1e3)
        finally:
            await terminate_group(proc)
            with contextlib.suppress(RedisError, OSError):  # a Redis gone away already failed the run
                await _delete_keys(redis_url, f"{prefix}:*")  # ~8,000 keys a run (sessions, history, users)


def _bare_app(redis_url: str, key: str) -> web.Application:
    import redis.asyncio as aioredis

    rkey = web.AppKey("r", aioredis.Redis)

    async def ctx(app: web.Application):  # type: ignore[no-untyped-def]
        app[rkey] = aioredis.Redis(connection_pool=aioredis.BlockingConnectionPool.from_url(redis_url,
                                                                                          max_connections=64))
        yield
        await app[rkey].aclose()

    async def handler(request: web.Request) -> web.Response:
        n = await request.app[rkey].incr(key)
        return web.json_response({"id": f"{n:032x}"}, status=201)

    async def end(request: web.Request) -> web.Response:
        n = await request.app[rkey].decr(key)
        return web.json_response({"id": request.match_info["sid"], "n": n})

    async def ready(_r: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.cleanup_ctx.append(ctx)
    app.router.add_post("/seat", handler)
    app.router.add_delete("/seat/{sid}", end)
    app.router.add_get("/readyz", ready)
    return app


async def bench_bare(redis_url: str, clients: int, duration_s: float, key: str = "") -> Run:
    """Measure the bare server; its one counter is ``key`` (default: a fresh ``bench??????:bare``), deleted after."""
    port = free_port()
    key = key or f"bench{uuid.uuid4().hex[:6]}:bare"
    proc = await _spawn([sys.executable, "-m", "broker.bench", "--bare-server", str(port), "--redis-url", redis_url,
                         "--bare-key", key], {})
    base = f"http://127.0.0.1:{port}"
    try:
        await _wait(base + "/readyz")
        async with aiohttp.ClientSession() as http:
            class Bare(OneCall):
                async def __call__(self, i: int) -> None:
                    async with http.post(f"{base}/seat", json={"pool": "bench"}) as r:
                        sid = (await r.json())["id"]
                    t = time.perf_counter()
                    async with http.delete(f"{base}/seat/{sid}") as r:
                        await r.read()
                    self.ended += time.perf_counter() - t

                ended = 0.0

            bare = Bare()
            t0, cpu0 = time.perf_counter(), _cpu_s(proc.pid)
            n, lat = await _drive(clients, duration_s, bare)
            wall, cpu = time.perf_counter() - t0, _cpu_s(proc.pid) - cpu0
            busy = wall - bare.ended / clients  # the same accounting as the broker's
            return Run(n / busy, lat, cpu / max(n, 1) * 1e3)
    finally:
        await terminate_group(proc)
        with contextlib.suppress(RedisError, OSError):
            await _delete_keys(redis_url, key)


async def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="render-broker bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--duration-s", type=float, default=5.0)
    p.add_argument("--redis-url", default="")
    p.add_argument("--bare-server", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--bare-key", default="bench:bare", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.bare_server:
        await web._run_app(_bare_app(a.redis_url, a.bare_key), host="127.0.0.1", port=a.bare_server, print=None)
        return 0
    embedded = None
    url = a.redis_url
    if not url:
        import redis as sync_redis

        try:
            sync_redis.Redis.from_url("redis://127.0.0.1:6379/0").ping()
            url = "redis://127.0.0.1:6379/0"
        except sync_redis.RedisError:
            embedded = EmbeddedRedis(tempfile.mkdtemp(prefix="rb-bench-"), persist=False)
            url = await embedded.start()
    try:
        print(f"redis: {url}   duration per run: {a.duration_s:.0f} s   cores: {os.cpu_count()}")
        print(f"{'clients':>7} | {'broker seat/s':>13} {'p50 ms':>7} {'p99 ms':>7} {'cpu ms':>6} | "
              f"{'bare req/s':>10} {'p50 ms':>7} {'p99 ms':>7} {'cpu ms':>6} | {'throughput':>10} {'p99':>5} "
              f"{'cpu':>5}")
        for c in a.clients:
            b = await bench_broker(url, c, a.duration_s)
            r = await bench_bare(url, c, a.duration_s)
            print(f"{c:>7} | {b.per_s:>13.0f} {_pct(b.lat, .5) * 1e3:>7.2f} {_pct(b.lat, .99) * 1e3:>7.2f} "
                  f"{b.cpu_ms:>6.3f} | {r.per_s:>10.0f} {_pct(r.lat, .5) * 1e3:>7.2f} {_pct(r.lat, .99) * 1e3:>7.2f} "
                  f"{r.cpu_ms:>6.3f} | {b.per_s / r.per_s:>10.2f} {_pct(b.lat, .99) / _pct(r.lat, .99):>5.2f} "
                  f"{r.cpu_ms / b.cpu_ms:>5.2f}", flush=True)
        print("throughput, p99: broker / bare; cpu: bare / broker server CPU per iteration (POST + DELETE), "
              "the throughput ratio where each server is the bottleneck")
    finally:
        if embedded:
            await embedded.stop()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
