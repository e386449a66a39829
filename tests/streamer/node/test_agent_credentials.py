"""The node agent's side of per-host identity, against a real broker app (real Redis, SQLite) with
the compatibility window off: it registers with the node token, then uses only its host-bound
credential; when the broker forgets the host it registers again with that credential; when the
credential is refused (its key removed), it registers again with the node token, which the broker
allows only once the host's lease has lapsed.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from broker.auth import mint_node_credential, verify_node_credential
from streamer.node.agent import NodeAgent
from streamer.node.settings import NodeSettings
from tests.conftest import ADMIN, NODE, SECRET, auth


async def registrations(api, host_id: str) -> int:  # type: ignore[no-untyped-def]
    r = await api.get("/api/v1/audit?action=host.register", headers=auth(ADMIN))
    return sum(1 for e in (await r.json())["entries"] if e["target"] == host_id)


async def wait_registrations(api, host_id: str, n: int, deadline_s: float = 30) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + deadline_s
    while (got := await registrations(api, host_id)) < n:
        assert time.monotonic() < end, f"{host_id} registered {got} time(s), not {n}"
        await asyncio.sleep(0.05)
    assert got == n


async def test_the_agent_uses_its_credential_and_registers_again_when_refused(
        aiohttp_client, settings_factory, clock, caplog: pytest.LogCaptureFixture) -> None:
    from broker.app import create_app

    caplog.set_level(logging.WARNING, logger="streamer.node.agent")

    api = await aiohttp_client(create_app(settings_factory(node_token_any_host=False, host_lease_ttl_s=1.0),
                                          clock=clock))
    assert (await api.put("/api/v1/pools/p1", json={}, headers=auth(ADMIN))).status == 201
    agent = NodeAgent(NodeSettings(broker_url=str(api.make_url("")), node_token=NODE, host_id="a1", pool="p1",
                                   seats=1, heartbeat_interval_s=0.05, watchdog=False))
    run = asyncio.create_task(agent.run())
    try:
        await asyncio.wait_for(agent.registered.wait(), 30)
        first = agent.credential
        assert first is not None and verify_node_credential(SECRET, first, time.time()).host == "a1"
        # its heartbeats pass with the credential; the node token alone is refused on that route
        r = await api.put("/api/v1/hosts/a1/heartbeat", json={}, headers=auth(NODE))
        assert r.status == 403
        # the broker forgets the host (the node's own deregistration, as after a lost Redis):
        # "register again", with its credential, at once
        r = await api.delete("/api/v1/hosts/a1?force=true", headers=auth(first))
        assert r.status == 200, await r.text()
        await wait_registrations(api, "a1", 2)
        assert not [m for m in caplog.messages if "409" in m]  # its credential re-registered it
        # its credential is refused (signed with a key the broker no longer has): it drops it and registers
        # with the node token, which waits out the host's live lease (1 s) instead of taking the id over
        agent.credential = mint_node_credential("a-removed-key", "a1", time.time(), 3600)[0]
        await wait_registrations(api, "a1", 3)
        assert any("refused with 401" in m for m in caplog.messages)
        assert any("register failed: 409" in m for m in caplog.messages)  # no takeover while the lease lived
        await asyncio.wait_for(agent.registered.wait(), 30)  # the reply (and its credential) reached the agent
        assert agent.credential is not None
        assert verify_node_credential(SECRET, agent.credential, time.time()).host == "a1"
        r = await api.get("/api/v1/hosts/a1", headers=auth(ADMIN))
        assert (await r.json())["state"] == "up"
    finally:
        agent.stop()
        await asyncio.wait_for(run, 30)
    r = await api.get("/api/v1/hosts/a1", headers=auth(ADMIN))
    assert r.status == 404  # it deregistered itself on stop, with its credential
