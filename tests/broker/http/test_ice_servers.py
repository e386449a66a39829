"""BROKER_TURN_URLS reach both sides unchanged: a ``turns:`` URL (TURN over TLS) is in the session view's
ICE servers and in the node's ``start`` command, with the same per-session credentials."""

from __future__ import annotations

import time

from broker.app import create_app
from broker.auth import turn_credentials
from tests.conftest import NODE, auth, setup_pool, user_token

TURN_URLS = ["turns:turn.example.test:5349?transport=tcp", "turn:turn.example.test:3478?transport=udp"]


async def test_turns_urls_and_credentials_reach_the_viewer_and_the_node(aiohttp_client, settings_factory) -> None:
    api = await aiohttp_client(create_app(settings_factory(
        stun_urls=["stun:turn.example.test:3478"], turn_urls=TURN_URLS, turn_secret="coturn-secret", turn_ttl_s=600)))
    await setup_pool(api, "p1")
    r = await api.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(await user_token(api, "u1")))
    assert r.status == 201, await r.text()
    view = await r.json()
    stun, turn = view["signaling"]["ice_servers"]
    assert stun == {"urls": ["stun:turn.example.test:3478"]}
    assert turn["urls"] == TURN_URLS  # order kept: aiortc peers use the first, browsers try all
    expiry, sid = turn["username"].split(":")
    assert sid == view["id"] and 590 <= int(expiry) - time.time() <= 610
    assert turn_credentials("coturn-secret", sid, int(expiry) - 600, 600) == (turn["username"], turn["credential"])
    async with api.ws_connect("/api/v1/hosts/p1-h0/commands", headers=auth(NODE)) as ws:
        start = await ws.receive_json(timeout=5)
    assert start["cmd"] == "start" and start["session"]["id"] == view["id"]
    node_turn = start["session"]["ice_servers"][1]
    assert node_turn["urls"] == TURN_URLS and node_turn["username"].endswith(f":{sid}")
