"""One tab at a time holds a session's viewer: "in use" for a second tab, "moved" for the one taken over.

Real Redis, the real broker app (aiohttp test client), a node's command socket standing in for the
render node: it sees exactly the signaling the broker lets through (peer_joined, offers, peer_left).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.conftest import NODE, auth, setup_pool, user_token

pytestmark = pytest.mark.timeout(60)


async def _node_signals(node: aiohttp.ClientWebSocketResponse, count: int) -> list[Any]:
    """The next ``count`` signaling messages the node gets (start commands skipped)."""
    out: list[Any] = []
    while len(out) < count:
        msg = await node.receive_json(timeout=5)
        if msg.get("cmd") == "signal":
            inner = msg["msg"]
            out.append(inner["type"] if inner["type"] != "candidate" else ("candidate", inner["candidate"]))
    return out


def _marker(name: str) -> dict[str, Any]:
    return {"type": "candidate", "candidate": name}


async def test_a_second_tab_is_told_in_use_and_a_takeover_moves_the_first(api) -> None:
    await setup_pool(api, "p1", hosts=1)
    token = await user_token(api, "u1")
    s = await (await api.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(token))).json()
    url = f"/api/v1/sessions/{s['id']}/signal?access_token={token}"
    async with api.ws_connect("/api/v1/hosts/p1-h0/commands", headers=auth(NODE)) as node:
        a = await api.ws_connect(f"{url}&tab=tab-a")
        await a.send_json(_marker("a1"))
        assert await _node_signals(node, 2) == ["peer_joined", ("candidate", "a1")]

        # a second tab: told the session is open elsewhere, its socket closes, the node hears nothing of it
        b = await api.ws_connect(f"{url}&tab=tab-b")
        told = await b.receive_json(timeout=5)
        assert told["type"] == "in_use" and "another tab" in told["detail"], told
        assert (await b.receive(timeout=5)).type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        await a.send_json(_marker("a2"))
        assert await _node_signals(node, 1) == [("candidate", "a2")]

        # "continue here": the second tab takes it; the first is told and closed, and its close does not
        # drop the new viewer at the node (no peer_left between the new tab's join and its messages)
        b = await api.ws_connect(f"{url}&tab=tab-b&takeover=1")
        moved = await a.receive_json(timeout=5)
        assert moved["type"] == "moved" and "another tab" in moved["detail"], moved
        assert (await a.receive(timeout=5)).type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        await b.send_json(_marker("b1"))
        assert await _node_signals(node, 2) == ["peer_joined", ("candidate", "b1")]

        # the holder leaving frees the session: the node hears peer_left, a new tab gets it without asking
        await b.close()
        assert await _node_signals(node, 1) == ["peer_left"]
        c = await api.ws_connect(f"{url}&tab=tab-c")
        await c.send_json(_marker("c1"))
        assert await _node_signals(node, 2) == ["peer_joined", ("candidate", "c1")]

        # a client that names no tab (older clients, native ones) takes over, as every connect did before
        legacy = await api.ws_connect(url)
        assert (await c.receive_json(timeout=5))["type"] == "moved"
        await legacy.send_json(_marker("l1"))
        assert await _node_signals(node, 2) == ["peer_joined", ("candidate", "l1")]
        await legacy.close()
        assert await _node_signals(node, 1) == ["peer_left"]
        for ws in (a, b, c):
            await ws.close()


async def test_a_malformed_tab_is_a_422_naming_the_field(api) -> None:
    await setup_pool(api, "p1", hosts=1)
    token = await user_token(api, "u1")
    s = await (await api.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(token))).json()
    for bad in ("../x", "a" * 65, "tab%20a"):
        r = await api.get(f"/api/v1/sessions/{s['id']}/signal?access_token={token}&tab={bad}")
        body = await r.json()
        assert r.status == 422 and body["field"] == "tab", (bad, r.status, body)


async def test_tab_holds_renew_release_and_lapse(api) -> None:
    live = api.app[__import__("broker.keys_app", fromlist=["BROKER"]).BROKER].live
    assert await live.claim_tab("s1", "a", "1", take=False) == (True, "")
    assert await live.claim_tab("s1", "a", "2", take=False) == (True, "a")  # a reload of the same tab
    assert not await live.release_tab("s1", "a", "1")  # the old socket closing leaves the new one's hold
    assert await live.claim_tab("s1", "b", "1", take=False) == (False, "a")
    assert await live.keep_tab("s1", "a", "2") and not await live.keep_tab("s1", "b", "1")
    assert not await live.release_tab("s1", "b", "1")  # not b's to release
    assert await live.claim_tab("s1", "b", "1", take=True) == (True, "a")
    assert not await live.keep_tab("s1", "a", "2") and not await live.release_tab("s1", "a", "2")
    ttl = await live.redis.pttl(live.keys.session_tab("s1"))
    assert 0 < ttl <= 30_000
    await live.redis.delete(live.keys.session_tab("s1"))  # the hold lapsed (its broker died with the socket)
    assert not await live.keep_tab("s1", "b", "1")
    assert await live.claim_tab("s1", "c", "1", take=False) == (True, "")
    assert await live.release_tab("s1", "c", "1") and await live.redis.exists(live.keys.session_tab("s1")) == 0
