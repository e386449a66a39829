"""The node's heartbeat carries each session's freezes, encoder errors and time to first frame, and the
node's own counters of them (sessions gone included); the broker exports the counters per pool and host
(a real agent against a real broker app on real Redis + SQLite; the session runtime is a stand-in)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from streamer.node.agent import NodeAgent
from streamer.node.settings import NodeSettings
from tests.conftest import ADMIN, NODE, auth


class CountingRuntime:
    """What the agent reads of a ``SessionRuntime`` for heartbeats, with set counts."""

    last_input_ms = None

    def __init__(self, freezes: int, encoder_errors: int, first_frame_ms: float | None) -> None:
        self.counts = {"freezes": freezes, "encoder_errors": encoder_errors, "first_frame_ms": first_frame_ms}
        self.stopped = False

    def stats(self) -> dict[str, Any]:
        return {"connected": True, "fps": 30.0, **self.counts}

    async def stop(self, _why: str = "") -> None:
        self.stopped = True


def counter(text: str, name: str) -> float | None:
    m = re.search(rf'^{name}{{host="c1",pool="p1"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


async def test_heartbeat_counts_reach_the_broker_and_outlive_their_session(aiohttp_client, settings_factory,
                                                                          clock) -> None:
    from broker.app import create_app

    api = await aiohttp_client(create_app(settings_factory(), clock=clock))
    assert (await api.put("/api/v1/pools/p1", json={}, headers=auth(ADMIN))).status == 201
    agent = NodeAgent(NodeSettings(broker_url=str(api.make_url("")), node_token=NODE, host_id="c1", pool="p1",
                                   seats=1, heartbeat_interval_s=3600, watchdog=False))
    run = asyncio.create_task(agent.run())
    try:
        await asyncio.wait_for(agent.registered.wait(), 30)
        stand_in = CountingRuntime(freezes=3, encoder_errors=2, first_frame_ms=420.0)
        agent.sessions["gone1"] = stand_in  # type: ignore[assignment]
        await agent.heartbeat()  # the broker has no such session: it tells the node to stop it
        text = await (await api.get("/metrics")).text()
        assert counter(text, "render_broker_stream_freezes_total") == 3.0
        assert counter(text, "render_broker_encoder_errors_total") == 2.0
        assert stand_in.stopped and "gone1" not in agent.sessions
        await agent.heartbeat()  # no session left: the node's counters keep what it counted
        text = await (await api.get("/metrics")).text()
        assert counter(text, "render_broker_stream_freezes_total") == 3.0
        assert counter(text, "render_broker_encoder_errors_total") == 2.0
    finally:
        agent.stop()
        await asyncio.wait_for(run, 30)


async def test_a_drain_reason_over_the_brokers_limit_still_drains_cut_to_it(aiohttp_client, settings_factory,
                                                                           clock) -> None:
    from broker.app import create_app
    from broker.http.api import DRAIN_REASON_MAX

    api = await aiohttp_client(create_app(settings_factory(), clock=clock))
    assert (await api.put("/api/v1/pools/p1", json={}, headers=auth(ADMIN))).status == 201
    agent = NodeAgent(NodeSettings(broker_url=str(api.make_url("")), node_token=NODE, host_id="c2", pool="p1",
                                   seats=1, heartbeat_interval_s=3600, watchdog=False))
    run = asyncio.create_task(agent.run())
    try:
        await asyncio.wait_for(agent.registered.wait(), 30)
        reason = "watchdog: " + "; ".join(f"gpu_hot: GPU {i} at 95 C (limit 90 C)" for i in range(8))
        assert len(reason) > DRAIN_REASON_MAX
        assert await agent.set_drained(True, reason)
        host = await (await api.get("/api/v1/hosts/c2", headers=auth(ADMIN))).json()
        assert host["state"] == "draining"
        entries = (await (await api.get("/api/v1/audit?action=host.drain", headers=auth(ADMIN))).json())["entries"]
        kept = entries[0]["detail"]["reason"]
        assert len(kept) == DRAIN_REASON_MAX and kept.endswith("...") and reason.startswith(kept[:-3])
    finally:
        agent.stop()
        await asyncio.wait_for(run, 30)
