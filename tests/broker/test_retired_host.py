"""A host an admin or the autoscaler removed stays removed: its still-running node cannot come back.

Removal retires the host id for ``RETIRED_HOST_TTL_S`` (a Redis marker written in the same Lua
step): heartbeat and registration answer 410 ``host_retired`` instead of "register again", and the
node agent stops on that answer.  A node deregistering itself (shutdown) is not retired, and a
provider that starts a host under a retired id (a StatefulSet ordinal) un-retires it.
"""

from __future__ import annotations

import asyncio

from broker.autoscale.policy import StartHosts, StopHost
from broker.autoscale.providers import HostProvider
from broker.autoscale.scaler import Outcome, Scaler
from broker.keys_app import BROKER
from broker.store.keys import RETIRED_HOST_TTL_S
from streamer.node.agent import NodeAgent
from streamer.node.settings import NodeSettings
from tests.conftest import ADMIN, NODE, auth, gpu, setup_pool, user_token


def host_body(host_id: str, pool: str = "p1") -> dict:
    return {"id": host_id, "pool": pool, "address": "10.0.0.9:7000", "gpus": [gpu(0)]}


async def pool_hosts(api, pool: str = "p1") -> list[str]:  # type: ignore[no-untyped-def]
    hosts = (await (await api.get(f"/api/v1/hosts?pool={pool}", headers=auth(ADMIN))).json())["hosts"]
    return sorted(h["id"] for h in hosts)


async def test_an_admin_removal_refuses_the_nodes_heartbeat_and_registration_until_the_marker_expires(api) -> None:
    await setup_pool(api, "p1", hosts=2)
    b = api.app[BROKER]
    r = await api.delete("/api/v1/hosts/p1-h0", headers=auth(ADMIN))
    assert r.status == 200, await r.text()
    marker = b.live.keys.host_retired("p1-h0")
    assert 0 < await b.live.redis.ttl(marker) <= RETIRED_HOST_TTL_S  # every ephemeral key has a TTL
    # the node is still running: its next heartbeat is refused for good, not answered with "register again"
    r = await api.put("/api/v1/hosts/p1-h0/heartbeat", json={}, headers=auth(NODE))
    body = await r.json()
    assert r.status == 410 and body["code"] == "host_retired" and body["retired"] is True
    assert "reregister" not in body
    r = await api.post("/api/v1/hosts", json=host_body("p1-h0"), headers=auth(NODE))
    assert r.status == 410 and (await r.json())["code"] == "host_retired"
    assert await pool_hosts(api) == ["p1-h1"]  # the refusals changed nothing
    # a session cannot land on it either: it goes to the host that is left
    tok = await user_token(api, "u1")
    r = await api.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(tok))
    assert (await r.json())["host"] == "p1-h1"
    # once the marker is gone (Redis expires it on its own clock; deleted here) the id registers again
    await b.live.redis.delete(marker)
    r = await api.post("/api/v1/hosts", json=host_body("p1-h0"), headers=auth(NODE))
    assert r.status == 201 and await pool_hosts(api) == ["p1-h0", "p1-h1"]


async def test_a_node_deregistering_itself_or_a_refused_removal_retires_nothing(api) -> None:
    await setup_pool(api, "p1", hosts=2, max_sessions_per_gpu=1)
    b = api.app[BROKER]
    # shutdown: the node removes itself and may come straight back under the same id (a restart)
    r = await api.delete("/api/v1/hosts/p1-h0?force=true", headers=auth(NODE))
    assert r.status == 200
    assert not await b.live.redis.exists(b.live.keys.host_retired("p1-h0"))
    r = await api.post("/api/v1/hosts", json=host_body("p1-h0"), headers=auth(NODE))
    assert r.status == 201
    # a removal refused because the host has a session leaves it registered and welcome
    tok = await user_token(api, "u1")
    s = await (await api.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(tok))).json()
    r = await api.delete(f"/api/v1/hosts/{s['host']}", headers=auth(ADMIN))
    assert r.status == 409
    assert not await b.live.redis.exists(b.live.keys.host_retired(s["host"]))
    r = await api.put(f"/api/v1/hosts/{s['host']}/heartbeat", json={}, headers=auth(NODE))
    assert r.status == 200


class ReusingProvider(HostProvider):
    """Stops what it is told; starts hosts under ids it was given (as a StatefulSet reuses ordinals)."""

    name = "reusing"

    def __init__(self, next_ids: list[str]) -> None:
        self.next_ids = next_ids
        self.stopped: list[str] = []

    async def start_hosts(self, pool: str, n: int) -> list[str]:
        ids, self.next_ids = self.next_ids[:n], self.next_ids[n:]
        return ids

    async def stop_host(self, pool: str, host_id: str) -> None:
        self.stopped.append(host_id)

    async def list_hosts(self, pool: str) -> list[str]:
        return []


async def test_the_autoscaler_retires_what_it_stops_and_welcomes_an_id_it_starts_again(api) -> None:
    await setup_pool(api, "p1", hosts=2)
    b = api.app[BROKER]
    prov = ReusingProvider(["p1-h1"])
    scaler = Scaler(b, prov, b.settings)
    cfg = await b.get_pool("p1")
    assert (await api.post("/api/v1/hosts/p1-h1/drain", headers=auth(ADMIN))).status == 200
    a = await scaler.apply_decision(cfg, StopHost("p1-h1", "drained_empty"))
    assert a.outcome == Outcome.APPLIED and prov.stopped == ["p1-h1"]
    # between remove_host and the provider's stop the node could still heartbeat: it is refused
    r = await api.put("/api/v1/hosts/p1-h1/heartbeat", json={}, headers=auth(NODE))
    assert r.status == 410
    assert await pool_hosts(api) == ["p1-h0"]
    # the provider starts a host under the same id: that new node registers
    a = await scaler.apply_decision(cfg, StartHosts(1, "below_min_hosts"))
    assert a.outcome == Outcome.APPLIED and a.info["hosts"] == ["p1-h1"]
    r = await api.post("/api/v1/hosts", json=host_body("p1-h1"), headers=auth(NODE))
    assert r.status == 201 and await pool_hosts(api) == ["p1-h0", "p1-h1"]


async def test_the_node_agent_stops_when_its_host_is_retired(api) -> None:
    await setup_pool(api, "p1", hosts=0)
    settings = NodeSettings(broker_url=str(api.make_url("")), node_token=NODE, host_id="p1-agent", pool="p1",
                            seats=1, heartbeat_interval_s=0.05)
    agent = NodeAgent(settings)
    run = asyncio.create_task(agent.run())
    try:
        await asyncio.wait_for(agent.registered.wait(), 30)
        assert await pool_hosts(api) == ["p1-agent"]
        r = await api.delete("/api/v1/hosts/p1-agent", headers=auth(ADMIN))
        assert r.status == 200
        await asyncio.wait_for(run, 30)  # run() returns: the agent stopped by itself
    finally:
        agent.stop()
        await asyncio.wait_for(run, 30)
    assert agent.retired and await pool_hosts(api) == []
    r = await api.get("/api/v1/hosts/p1-agent", headers=auth(ADMIN))
    assert r.status == 404  # it never came back
