"""Redis high availability: two real broker processes reach Redis through a real Sentinel; the master
is killed under session traffic, Sentinel promotes the replica, the brokers follow it, no seat is lost
or doubled, and the outbox still reaches SQL."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import redis

from broker.auth import mint_user_token
from broker.embedded import free_port
from tests.conftest import ADMIN, NODE, SECRET, auth
from tests.procs import broker_process

REDIS_SERVER = shutil.which("redis-server")
pytestmark = pytest.mark.skipif(REDIS_SERVER is None, reason="the system redis-server (7.x, with --sentinel) is "
                                                             "not installed")
MASTER = "rb-test"


def _wait_ping(port: int, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(redis.RedisError):
            if redis.Redis(port=port, socket_timeout=0.5).ping():
                return
        assert time.monotonic() < deadline, f"redis on {port} did not start"
        time.sleep(0.05)


@contextlib.contextmanager
def redis_ha(tmp: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, int, int]]:
    """A master, its replica and one sentinel (quorum 1) on free loopback ports."""
    assert REDIS_SERVER is not None
    m, r, s = free_port(), free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for port, extra in ((m, []), (r, ["--replicaof", "127.0.0.1", str(m)])):
            d = tmp / f"redis-{port}"
            d.mkdir()
            procs.append(subprocess.Popen([REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d),
                                           "--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0",
                                           *extra],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            _wait_ping(port)
        deadline = time.monotonic() + 15  # the replica finished its first sync
        while redis.Redis(port=m).info("replication").get("slave0", {}).get("state") != "online":
            assert time.monotonic() < deadline, f"the replica did not sync: {redis.Redis(port=m).info('replication')}"
            time.sleep(0.1)
        conf = tmp / "sentinel.conf"
        conf.write_text(f"port {s}\nbind 127.0.0.1\ndir {tmp}\n"
                        f"sentinel monitor {MASTER} 127.0.0.1 {m} 1\n"
                        f"sentinel down-after-milliseconds {MASTER} 1000\n"
                        f"sentinel failover-timeout {MASTER} 5000\n")
        procs.append(subprocess.Popen([REDIS_SERVER, str(conf), "--sentinel"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_ping(s)
        deadline = time.monotonic() + 10  # the sentinel has found the replica
        while not redis.Redis(port=s).sentinel_slaves(MASTER):
            assert time.monotonic() < deadline, "sentinel did not discover the replica"
            time.sleep(0.1)
        yield procs[0], m, r, s
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


async def test_brokers_follow_a_sentinel_failover_without_losing_or_doubling_a_seat(
        tmp_path: Path, db_url: str) -> None:
    with redis_ha(tmp_path) as (master_proc, m, r, s):
        env = {"BROKER_REDIS_SENTINELS": f"127.0.0.1:{s}", "BROKER_REDIS_SENTINEL_MASTER": MASTER,
               "BROKER_REDIS_PREFIX": "rbha", "BROKER_ADMIN_TOKEN": ADMIN, "BROKER_NODE_TOKEN": NODE,
               "BROKER_SECRET": SECRET, "BROKER_DATABASE_URL": db_url, "BROKER_DATA_DIR": str(tmp_path / "d"),
               "BROKER_HOST_LEASE_TTL_S": "30"}
        async with broker_process(env, str(tmp_path / "b1.log")) as b1, \
                broker_process(env, str(tmp_path / "b2.log")) as b2, aiohttp.ClientSession() as http:
            r1 = await http.put(f"{b1.url}/api/v1/pools/p1", json={"max_sessions_per_gpu": 2}, headers=auth(ADMIN))
            assert r1.status in (200, 201), await r1.text()
            creds = {}
            for h in ("h1", "h2"):
                r1 = await http.post(f"{b1.url}/api/v1/hosts", headers=auth(NODE), json={
                    "id": h, "pool": "p1", "address": "10.0.0.1:7000",
                    "gpus": [{"index": 0, "model": "L4", "vram_mb": 24576}]})
                assert r1.status == 201, await r1.text()
                creds[h] = auth((await r1.json())["node_credential"]["token"])

            tokens: dict[str, str] = {}

            async def seat(user: str, url: str) -> tuple[int, dict[str, object]]:
                tok = tokens[user] = mint_user_token(SECRET, user, time.time(), 600)[0]
                for _ in range(100):  # during the failover a call may get 503: the client retries
                    with contextlib.suppress(aiohttp.ClientError):
                        async with http.post(f"{url}/api/v1/sessions", json={"pool": "p1"}, headers=auth(tok)) as resp:
                            if resp.status != 503:
                                return resp.status, await resp.json()
                    await asyncio.sleep(0.1)
                raise AssertionError("no answer in 10 s")

            before = [await seat(f"u{i}", (b1, b2)[i % 2].url) for i in range(2)]
            assert [st for st, _ in before] == [201, 201]
            probe = redis.Redis(port=m)
            probe.set("rbha:probe", 1)
            assert probe.wait(1, 5000) == 1  # the replica has every write so far
            master_proc.send_signal(signal.SIGKILL)
            master_proc.wait()
            # users keep asking for seats while Sentinel notices (1 s) and promotes the replica
            after = await asyncio.gather(*[seat(f"v{i}", (b1, b2)[i % 2].url) for i in range(4)])
            promoted = redis.Redis(port=s, decode_responses=True).sentinel_get_master_addr_by_name(MASTER)
            assert promoted == ("127.0.0.1", r)
            # two hosts x 2 seats: 4 seated, 2 queued, whichever replica answered
            states = sorted(str(body["state"]) for _, body in before + list(after))
            assert states.count("starting") == 4 and states.count("queued") == 2, states
            live = redis.Redis(port=r, decode_responses=True)
            used = sum(int(live.hget(f"rbha:host:{h}", "u:0") or 0) for h in ("h1", "h2"))
            assert used == 4  # no seat lost in the failover, none counted twice
            # every session ends through either replica; the records reach SQL through the outbox
            ids = [str(body["id"]) for _, body in before + list(after)]
            for i, (_, body) in enumerate(before + list(after)):
                async with http.delete(f"{(b1, b2)[i % 2].url}/api/v1/sessions/{body['id']}",
                                       headers=auth(tokens[str(body["user"])])) as resp:
                    assert resp.status in (200, 204), await resp.text()
            deadline = time.monotonic() + 20
            while True:
                async with http.get(f"{b2.url}/api/v1/sessions/history?limit=50", headers=auth(ADMIN)) as resp:
                    hist = await resp.json()
                ended = {str(x["id"]): x.get("end_reason") for x in hist.get("sessions", [])}
                if all(ended.get(i) in ("user", "cancelled") for i in ids):
                    break
                assert time.monotonic() < deadline, (ids, hist)
                await asyncio.sleep(0.5)
