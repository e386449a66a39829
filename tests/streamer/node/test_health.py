"""The watchdog wired into a real agent and a real broker: a sick sample drains the host with the
reason audited, a healthy one undrains it, and /healthz answers for Kubernetes probes; heartbeats carry
the watchdog's state to /metrics, and an operator's undrain releases a hold."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import aiohttp

from broker.embedded import free_port
from streamer.node.agent import NodeAgent
from streamer.node.settings import load
from tests.broker.test_ops_metrics import samples
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


async def test_heartbeats_report_the_watchdog_and_an_operators_undrain_releases_its_hold(api) -> None:
    r = await api.put("/api/v1/pools/game", json={"kind": "game"}, headers=auth(ADMIN))
    assert r.status in (200, 201)
    settings = load(["--broker-url", str(api.make_url("")).rstrip("/"), "--node-token", NODE, "--pool", "game",
                     "--host-id", "wd-h0", "--heartbeat-interval-s", "30"], {})
    agent = NodeAgent(settings)
    # one trip is too many and the healthy hold is 0 s: the first healthy sample holds the drain
    agent.health.limits = replace(agent.health.limits, max_trips=1, healthy_hold_ms=0)
    reading = [HOT]

    async def read_gpus() -> list[dict[str, Any]]:
        return reading

    agent.read_gpus = read_gpus  # type: ignore[method-assign]

    async def exported() -> tuple[set[str], float | None]:
        text = await (await api.get("/metrics")).text()
        tripped = {lab for lab, v in samples(text, "render_broker_node_watchdog_tripped").items() if v}
        held = samples(text, "render_broker_node_watchdog_held").get('{host="wd-h0",pool="game"}')
        return tripped, held

    task = asyncio.create_task(agent.run())
    try:
        await asyncio.wait_for(agent.registered.wait(), 30)
        await until(lambda: agent.health.heartbeat.ok, "no heartbeat reached the broker")
        await agent.heartbeat()  # hot: the watchdog drains, and this heartbeat says which check tripped
        assert (await _host(api))["state"] == "draining"
        assert await exported() == ({'{check="gpu_hot",host="wd-h0",pool="game"}'}, 0.0)
        reading[:] = [COOL]
        await agent.heartbeat()  # healthy, but one trip is the limit: held for an operator
        assert agent.health.state.held
        assert await exported() == ({'{check="gpu_hot",host="wd-h0",pool="game"}'}, 1.0)

        r = await api.post("/api/v1/hosts/wd-h0/undrain", headers=auth(ADMIN), json={"reason": "fan replaced"})
        assert r.status == 200, await r.text()
        await agent.heartbeat()  # the reply says up: the watchdog lets go of its hold
        assert not agent.health.state.held and not agent.health.state.drained
        await agent.heartbeat()
        assert await exported() == (set(), 0.0)
        reading[:] = [HOT]
        await agent.heartbeat()  # and watches again: a new trip drains the host again
        assert (await _host(api))["state"] == "draining"
        assert await exported() == ({'{check="gpu_hot",host="wd-h0",pool="game"}'}, 0.0)
    finally:
        agent.stop()
        await asyncio.wait_for(task, 30)
