"""Share links: create/list/revoke, view-only viewers' signaling, revocation atomic with joining.

Real Redis, two real broker apps on the same prefix (two replicas), a node's command socket standing in for
the render node: it sees what the broker relays for each viewer (peer_joined, offers, peer_left).
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import pytest

from broker.app import create_app
from broker.auth import mint_share_token
from tests.conftest import ADMIN, NODE, SECRET, auth, setup_pool, user_token

pytestmark = pytest.mark.timeout(60)

CLOSED = (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING)


async def _session(api: Any, user: str = "u1") -> tuple[str, str]:
    await setup_pool(api, "p1", hosts=1)
    token = await user_token(api, user)
    r = await api.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(token))
    assert r.status == 201, await r.text()
    return (await r.json())["id"], token


async def _node_signal(node: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    while True:
        msg = await node.receive_json(timeout=5)
        if msg.get("cmd") == "signal":
            return msg


async def _share(api: Any, sid: str, token: str, **body: Any) -> dict[str, Any]:
    r = await api.post(f"/api/v1/sessions/{sid}/shares", json=body, headers=auth(token))
    assert r.status == 201, await r.text()
    return await r.json()


async def test_owner_creates_lists_and_revokes_a_link_and_its_viewer_is_cut_off(api, aiohttp_client,
                                                                                   settings_factory, clock) -> None:
    sid, owner = await _session(api)
    replica = await aiohttp_client(create_app(settings_factory(), clock=clock))  # a second broker, same Redis
    share = await _share(api, sid, owner)
    assert share["role"] == "view" and share["watch_url"] == f"/watch?token={share['token']}"
    assert share["expires_at"] - time.time() == pytest.approx(3600, abs=5)

    async with api.ws_connect("/api/v1/hosts/p1-h0/commands", headers=auth(NODE)) as node:
        owner_ws = await api.ws_connect(f"/api/v1/sessions/{sid}/signal?access_token={owner}&tab=t1")
        assert (await _node_signal(node))["msg"]["type"] == "peer_joined"
        # the viewer reaches the other replica
        viewer_ws = await replica.ws_connect(f"/api/v1/sessions/{sid}/watch?access_token={share['token']}")
        joined = await _node_signal(node)
        viewer = joined["viewer"]
        assert joined["msg"]["type"] == "peer_joined" and joined["role"] == "view" and len(viewer) == 16
        await viewer_ws.send_json({"type": "offer", "sdp": "v=0 viewer"})
        offer = await _node_signal(node)
        assert offer["viewer"] == viewer and offer["msg"] == {"type": "offer", "sdp": "v=0 viewer"}
        # a viewer may not speak for the broker
        await viewer_ws.send_json({"type": "peer_left"})
        assert (await viewer_ws.receive_json(timeout=5))["code"] == "bad_signal"
        # nor crash its socket with a frame the owner's socket answers (a list as type was unhashable here)
        for frame in ('{"type": ["offer"]}', "[" * 5000 + "]" * 5000, '"just a string"', "{not json"):
            await viewer_ws.send_str(frame)
            assert (await viewer_ws.receive_json(timeout=5))["code"] == "bad_signal", frame[:20]
        assert not viewer_ws.closed

        # the node's answer for the viewer goes to the viewer only
        await node.send_json({"cmd": "signal", "session_id": sid, "viewer": viewer,
                              "msg": {"type": "answer", "sdp": "v=0 for the viewer"}})
        assert (await viewer_ws.receive_json(timeout=5))["sdp"] == "v=0 for the viewer"
        await node.send_json({"cmd": "signal", "session_id": sid, "msg": {"type": "answer", "sdp": "v=0 owner"}})
        assert (await owner_ws.receive_json(timeout=5))["sdp"] == "v=0 owner"

        listed = (await (await api.get(f"/api/v1/sessions/{sid}/shares", headers=auth(owner))).json())["shares"]
        assert [(x["id"], x["role"], x["by"], x["viewers"]) for x in listed] == [(share["id"], "view", "u1", 1)]

        r = await api.delete(f"/api/v1/sessions/{sid}/shares/{share['id']}", headers=auth(owner))
        assert r.status == 200, await r.text()
        assert (await r.json())["viewers_disconnected"] == 1
        assert await viewer_ws.receive_json(timeout=5) == {"type": "bye", "reason": "share_revoked"}
        assert (await viewer_ws.receive(timeout=5)).type in CLOSED
        left = await _node_signal(node)
        assert left["viewer"] == viewer and left["msg"]["type"] == "peer_left"
        # the owner's socket is untouched
        await owner_ws.send_json({"type": "candidate", "candidate": "still here"})
        msg = await _node_signal(node)
        while msg.get("viewer"):  # the closing viewer socket's own peer_left may come in between
            msg = await _node_signal(node)
        assert msg["msg"]["candidate"] == "still here" and "viewer" not in msg
        await owner_ws.close()

    # a revoked token: 403 share_revoked on the page and the socket, at either replica
    for client in (api, replica):
        r = await client.get(f"/watch?token={share['token']}")
        assert r.status == 403 and (await r.json())["code"] == "share_revoked"
        r = await client.get(f"/watch?token={share['token']}", headers={"Accept": "text/html"})
        assert r.status == 403 and "watch.js" in await r.text()  # a browser: the page, which says why
        r = await client.get(f"/api/v1/sessions/{sid}/watch?access_token={share['token']}")
        assert r.status == 403 and (await r.json())["code"] == "share_revoked"
    assert (await (await api.get(f"/api/v1/sessions/{sid}/shares", headers=auth(owner))).json())["shares"] == []


async def test_the_revocation_marker_lives_for_the_token_s_remaining_life(api) -> None:
    sid, owner = await _session(api)
    share = await _share(api, sid, owner, ttl_s=120)
    from broker.keys_app import BROKER

    b = api.server.app[BROKER]
    assert (await api.delete(f"/api/v1/sessions/{sid}/shares", headers=auth(owner))).status == 200
    ttl_ms = await b.live.redis.pttl(b.live.keys.share_revoked(share["id"]))
    assert 110_000 < ttl_ms <= 120_000
    # revoking an unknown link: 404 naming it; revoking the same one again is fine
    r = await api.delete(f"/api/v1/sessions/{sid}/shares/{'0' * 16}", headers=auth(owner))
    assert r.status == 404 and (await r.json())["field"] == "share"
    assert (await api.delete(f"/api/v1/sessions/{sid}/shares/{share['id']}", headers=auth(owner))).status == 200


async def test_joining_and_revoking_are_one_step_each(api) -> None:
    """A join after the revocation is refused; a join before it is listed in it (the viewer is cut off)."""
    from broker.keys_app import BROKER

    sid, owner = await _session(api)
    b = api.server.app[BROKER]
    now = int(time.time() * 1000)
    a = await _share(api, sid, owner)
    assert await b.live.join_share(sid, a["id"], "v-early", now) == "ok"
    status, revoked, removed = await b.live.revoke_shares(sid, a["id"], now)
    assert (status, revoked, removed) == ("ok", [a["id"]], [f"{a['id']} v-early"])
    assert await b.live.join_share(sid, a["id"], "v-late", now) == "revoked"
    assert not await b.live.keep_share(sid, a["id"], "v-early", now)
    # another link of the same session is unaffected; a stale hold lapses from the count
    c = await _share(api, sid, owner)
    assert await b.live.join_share(sid, c["id"], "v1", now - 60_000) == "ok"
    assert (await b.live.shares(sid, now))[c["id"]]["viewers"] == 0
    assert await b.live.join_share(sid, c["id"], "v2", now) == "ok"
    assert (await b.live.shares(sid, now))[c["id"]]["viewers"] == 1


async def test_bad_input_and_other_users_sessions(api) -> None:
    sid, owner = await _session(api)
    other = await user_token(api, "u2")
    for body, field in (({"role": "control"}, "role"), ({"ttl_s": 5}, "ttl_s"), ({"ttl_s": "x"}, "ttl_s"),
                        ([], "body")):
        r = await api.post(f"/api/v1/sessions/{sid}/shares", json=body, headers=auth(owner))
        assert r.status == 422, (body, await r.text())
        assert (await r.json())["field"] == field, body
    for method, path in (("POST", "shares"), ("GET", "shares"), ("DELETE", "shares"), ("DELETE", "shares/" + "a" * 16)):
        r = await api.request(method, f"/api/v1/sessions/{sid}/{path}", json={}, headers=auth(other))
        assert r.status == 404 and (await r.json())["field"] == "session", (method, path)
    r = await api.delete(f"/api/v1/sessions/{sid}/shares/NOT-AN-ID", headers=auth(owner))
    assert r.status == 422 and (await r.json())["field"] == "share"
    # tokens: forged, for another session, a user token as a share token, none
    share = await _share(api, sid, owner)
    forged = mint_share_token("not-the-secret", sid, share["id"], "view", time.time(), 60)[0]
    assert (await api.get(f"/watch?token={forged}")).status == 401
    assert (await api.get(f"/watch?token={owner}")).status == 401
    assert (await api.get("/watch")).status == 422
    elsewhere = mint_share_token(SECRET, "f" * 32, share["id"], "view", time.time(), 60)[0]
    assert (await api.get(f"/api/v1/sessions/{sid}/watch?access_token={elsewhere}")).status == 404
    # a share token is no REST credential
    assert (await api.get(f"/api/v1/sessions/{sid}", headers=auth(share["token"]))).status == 401
    ok = await api.get(f"/watch?token={share['token']}", headers={"Accept": "application/json"})
    assert ok.status == 200
    info = await ok.json()
    assert (info["session"], info["role"], info["signaling_url"]) == (sid, "view", f"/api/v1/sessions/{sid}/watch")
    assert info["ice_servers"] == [] and info["expires_at"] == share["expires_at"]


async def test_an_admin_shadows_a_session_audited_and_announced(api) -> None:
    sid, owner = await _session(api)
    async with api.get(f"/api/v1/sessions/{sid}/events?access_token={owner}") as events:
        first = await events.content.readuntil(b"\n\n")
        assert b"event: state" in first
        shadow = await _share(api, sid, ADMIN)
        assert shadow["shadow"] is True and shadow["by"] == "admin"
        told = await events.content.readuntil(b"\n\n")
        assert b"event: warning" in told and b"shadowed" in told, told
    listed = (await (await api.get(f"/api/v1/sessions/{sid}/shares", headers=auth(owner))).json())["shares"]
    assert [(x["by"], x["shadow"]) for x in listed] == [("admin", True)]
    await _share(api, sid, owner)
    assert (await api.delete(f"/api/v1/sessions/{sid}/shares", headers=auth(ADMIN))).status == 200
    audit = (await (await api.get("/api/v1/audit", headers=auth(ADMIN))).json())["entries"]
    actions = [e["action"] for e in audit if e.get("target") == sid]
    assert actions[:3] == ["share.revoke", "share.create", "session.shadow"], actions
