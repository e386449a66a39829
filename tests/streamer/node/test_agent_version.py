"""The node reports its version at registration: ``NODE_VERSION`` when set, else the installed package's;
the broker keeps it per host (a real agent against a real broker app on real Redis + SQLite)."""

from __future__ import annotations

import asyncio
import importlib.metadata

from streamer.node.agent import NodeAgent, node_version
from streamer.node.settings import NodeSettings, load
from tests.conftest import ADMIN, NODE, auth


def test_node_version_is_the_setting_else_the_package_version() -> None:
    assert node_version(load([], {"NODE_VERSION": "1.5.0-rc1+g1234"})) == "1.5.0-rc1+g1234"
    assert node_version(load(["--version", "2.0"], {})) == "2.0"
    assert node_version(load([], {})) == importlib.metadata.version("render-broker")


async def test_the_agent_registers_its_version_and_the_broker_shows_it(aiohttp_client, settings_factory,
                                                                      clock) -> None:
    from broker.app import create_app

    api = await aiohttp_client(create_app(settings_factory(), clock=clock))
    assert (await api.put("/api/v1/pools/p1", json={}, headers=auth(ADMIN))).status == 201
    agent = NodeAgent(NodeSettings(broker_url=str(api.make_url("")), node_token=NODE, host_id="v1", pool="p1",
                                   seats=1, heartbeat_interval_s=0.05, watchdog=False, version="1.5.0-rc1"))
    run = asyncio.create_task(agent.run())
    try:
        await asyncio.wait_for(agent.registered.wait(), 30)
        host = await (await api.get("/api/v1/hosts/v1", headers=auth(ADMIN))).json()
        assert host["version"] == "1.5.0-rc1"
    finally:
        agent.stop()
        await asyncio.wait_for(run, 30)
