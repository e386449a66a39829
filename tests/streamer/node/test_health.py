"""The watchdog wired into a real agent and a real broker: a sick sample drains the host with the
reason audited, a healthy one undrains it, and /healthz answers for Kubernetes probes."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from broker.embedded import free_port
from streamer.node.agent import NodeAgent
from streamer.node.settings import load
from tests.conftest import ADMIN, NODE, auth
from tests.streamer.viewer import until

HOT = {"index": 0, "temperature_c": 95.0, "throttle_reasons": [], "vram_used_mb": 1000.0}
COOL = {"index": 0, "temperature_c": 60.0, "throttle_reasons": [], "vram_used_mb": 1000.0}


async def _host(api: Any) -> dict[str, Any]:
    return await (await api.get("/api/v1/hosts/wd-h0", headers=auth(ADMIN))).json()


async def test_watchdog_drains_and_undrains_through_the_broker_and_healthz_answers(api) -> None:
    r = await api.put("/api/v1/pools/game", json={"kind": "game"}, headers=auth(ADMIN))
    assert r.status in (200, 201)
    port = free_port()
    settings = load(["--broker-url", str(api.make_url("")).rstrip("/"), "--node-token", NODE, "--pool", "game",
                     "--host-id", "wd-h0", "--heartbeat-interval-s", "30", "--watchdog-healthy-hold-s", "0",
                     "--health-host", "127.0.0.1", "--health-port", str(port)], {})
    agent = NodeAgent(settings)
    task = asyncio.create_task(agent.run())
    try:
        await asyncio.wait_for(agent.registered.wait(), 30)
        await until(lambda: agent.health.heartbeat.ok, "no heartbeat reached the broker")
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/healthz") as h:
            body = await h.json()
            assert h.status == 200 and body["status"] == "ok" and body["watchdog"]["drained"] is False

        await agent._watch([HOT])
        assert (await _host(api))["state"] == "draining"
        entries = (await (await api.get("/api/v1/audit?action=host.drain", headers=auth(ADMIN))).json())["entries"]
        assert entries[0]["target"] == "wd-h0" and entries[0]["role"] == "node"
        assert entries[0]["detail"]["reason"] == "watchdog: gpu_hot: GPU 0 at 95 C (limit 90 C)"

        await agent._watch([COOL])  # healthy; the hold (0 s here) starts
        await agent._watch([COOL])
        assert (await _host(api))["state"] == "up"
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/healthz") as h:
            body = await h.json()
            assert body["watchdog"]["trips"] == 1 and body["watchdog"]["last_action"] == "undrain"
    finally:
        agent.stop()
        await asyncio.wait_for(task, 30)
