"""End to end: a live game session survives its broker's Redis restarting empty.

Real processes: a private redis-server (no persistence), a ``render-broker serve`` process on it,
a render node (``python -m streamer``) and an aiortc viewer streaming through the broker's
signaling.  Redis is killed and started again with nothing in it.  The broker notices (its epoch
key is gone), restores the pool from SQL without a restart, the node is told to re-register and
lists the session it still streams, and the broker re-adopts it on the same host and GPU: the
viewer keeps decoding frames, the user sees the same session running, the seat is counted, and a
lease after the recovery nothing was ended ``state_lost``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from broker.embedded import EmbeddedRedis, free_port
from tests.conftest import ADMIN, NODE, SECRET, auth
from tests.procs import broker_process
from tests.streamer.node.test_node_e2e import BrokerSignal, node_process, start_session, wait_host, wait_state
from tests.streamer.viewer import Viewer

pytestmark = pytest.mark.e2e

LEASE_S = 3.0


async def test_a_live_session_survives_redis_restarting_empty(tmp_path: Path) -> None:
    import aiohttp

    redis = EmbeddedRedis(tmp_path / "redis", persist=False, port=free_port())
    await redis.start()
    env = {"BROKER_REDIS_URL": redis.url, "BROKER_ADMIN_TOKEN": ADMIN, "BROKER_NODE_TOKEN": NODE,
           "BROKER_SECRET": SECRET, "BROKER_DATA_DIR": str(tmp_path / "d"),
           "BROKER_HOST_LEASE_TTL_S": str(LEASE_S), "BROKER_REAPER_INTERVAL_S": "0.5", "BROKER_LOG_LEVEL": "info"}
    try:
        async with broker_process(env, str(tmp_path / "broker.log")) as b, aiohttp.ClientSession() as http:
            url = b.url
            token, s = await start_session(http, url, "game", "game", "gamer", {"width": 320, "height": 240,
                                                                                  "fps": 15})
            async with node_process(url, "game", "node-game", tmp_path / "node.log"):
                await wait_host(http, url, "node-game")
                s = await wait_state(http, url, s["id"], token, {"running"})
                viewer = Viewer()
                async with http.ws_connect(f"{url}/api/v1/sessions/{s['id']}/signal?access_token={token}") as ws:
                    await viewer.connect(BrokerSignal(ws))
                    await viewer.wait_frames(10)

                    await redis.stop()
                    await redis.start()  # same port, nothing in it
                    t0 = time.monotonic()
                    # the broker restores the pool from SQL and the node re-registers with its session
                    deadline = t0 + 30
                    while True:
                        async with http.get(f"{url}/api/v1/sessions/{s['id']}", headers=auth(token)) as r:
                            got = await r.json() if r.status == 200 else {"state": f"http {r.status}"}
                        if got["state"] == "running":
                            break
                        assert time.monotonic() < deadline, f"session not re-adopted: {got}"
                        await asyncio.sleep(0.2)
                    recovered_s = time.monotonic() - t0
                    assert (got["host"], got["gpu"], got["user"]) == (s["host"], s["gpu"], "gamer"), got
                    async with http.get(f"{url}/readyz") as r:
                        assert r.status == 200, await r.text()
                    seen = len(viewer.frames)
                    await viewer.wait_frames(10, after=seen)  # the stream never stopped

                    # past the recovery's window (one lease): still running, counted, nothing ended
                    await asyncio.sleep(LEASE_S + 1.5)
                    s2 = await wait_state(http, url, s["id"], token, {"running"})
                    assert s2["id"] == s["id"]
                    async with http.get(f"{url}/api/v1/pools/game", headers=auth(ADMIN)) as r:
                        pool = await r.json()
                    assert pool["seats_used"] == 1 and pool["sessions"]["running"] == 1, pool
                    async with http.get(f"{url}/api/v1/sessions/history", headers=auth(ADMIN)) as r:
                        history = (await r.json())["sessions"]
                    assert [h for h in history if h["id"] == s["id"]] == []  # never ended
                    async with http.get(f"{url}/api/v1/audit?action=host.adopt", headers=auth(ADMIN)) as r:
                        adopt = (await r.json())["entries"]
                    assert adopt and adopt[0]["detail"]["adopted"] == [s["id"]], adopt
                    print(f"re-adopted {recovered_s:.2f} s after Redis restarted empty")
                await viewer.close()
    finally:
        await redis.stop()
