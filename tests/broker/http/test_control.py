"""Handing control to a share viewer: grant, take back, validation, revocation takes it back.

Real Redis and broker; a node's command socket stands in for the render node and sees the ``control``
commands; the viewer's real signaling socket sees ``control`` messages.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from broker.keys_app import BROKER
from tests.broker.http.test_shares import _node_signal, _session, _share
from tests.conftest import NODE, auth, user_token

pytestmark = pytest.mark.timeout(60)


async def _node_cmd(node: aiohttp.ClientWebSocketResponse, kind: str) -> dict[str, Any]:
    while True:
        msg = await node.receive_json(timeout=5)
        if msg.get("cmd") == kind:
            return msg


async def test_owner_grants_control_to_a_viewer_takes_it_back_and_revocation_takes_it(api) -> None:
    sid, owner = await _session(api)
    share = await _share(api, sid, owner)
    async with api.ws_connect("/api/v1/hosts/p1-h0/commands", headers=auth(NODE)) as node:
        viewer_ws = await api.ws_connect(f"/api/v1/sessions/{sid}/watch?access_token={share['token']}")
        viewer = (await _node_signal(node))["viewer"]
        listed = await (await api.get(f"/api/v1/sessions/{sid}/shares", headers=auth(owner))).json()
        assert listed["shares"][0]["viewer_ids"] == [viewer] and listed["controller"] is None

        r = await api.post(f"/api/v1/sessions/{sid}/control", json={"viewer": viewer}, headers=auth(owner))
        assert r.status == 200, await r.text()
        assert await r.json() == {"session": sid, "controller": viewer, "previous": None}
        assert await _node_cmd(node, "control") == {"cmd": "control", "session_id": sid, "viewer": viewer}
        assert await viewer_ws.receive_json(timeout=5) == {"type": "control", "granted": True}
        listed = await (await api.get(f"/api/v1/sessions/{sid}/shares", headers=auth(owner))).json()
        assert listed["controller"] == viewer

        r = await api.delete(f"/api/v1/sessions/{sid}/control", headers=auth(owner))
        assert await r.json() == {"session": sid, "controller": None, "previous": viewer}
        assert (await _node_cmd(node, "control"))["viewer"] is None
        assert await viewer_ws.receive_json(timeout=5) == {"type": "control", "granted": False}
        # taking back twice is fine and says nobody had it
        r = await api.delete(f"/api/v1/sessions/{sid}/control", headers=auth(owner))
        assert r.status == 200 and (await r.json())["previous"] is None

        # granted again, then the link is revoked: control goes with it, the node hears so first
        assert (await api.post(f"/api/v1/sessions/{sid}/control", json={"viewer": viewer},
                               headers=auth(owner))).status == 200
        assert (await _node_cmd(node, "control"))["viewer"] == viewer
        assert (await api.delete(f"/api/v1/sessions/{sid}/shares", headers=auth(owner))).status == 200
        assert (await _node_cmd(node, "control"))["viewer"] is None
        left = await _node_signal(node)
        assert left["viewer"] == viewer and left["msg"]["type"] == "peer_left"
        listed = await (await api.get(f"/api/v1/sessions/{sid}/shares", headers=auth(owner))).json()
        assert listed["controller"] is None
        await viewer_ws.close()

    b = api.server.app[BROKER]
    actions = [a["action"] for a in await b.repo.audit_log(50)]
    assert actions.count("control.grant") == 2 and actions.count("control.revoke") == 1


async def test_bad_control_requests_name_the_field(api) -> None:
    sid, owner = await _session(api)
    url = f"/api/v1/sessions/{sid}/control"
    cases = [({}, 422, "viewer"), ({"viewer": 5}, 422, "viewer"), ({"viewer": "zz"}, 422, "viewer"),
             ({"viewer": "0" * 16, "x": 1}, 422, "x"),
             ({"viewer": "0" * 16}, 409, "viewer")]  # well formed, but nobody watching with that id
    for body, status, field in cases:
        r = await api.post(url, json=body, headers=auth(owner))
        assert r.status == status, (body, await r.text())
        assert (await r.json())["field"] == field
    other = await user_token(api, "u2")
    r = await api.post(url, json={"viewer": "0" * 16}, headers=auth(other))
    assert r.status == 404  # another user's session does not exist for them
    assert (await api.delete(url, headers=auth(other))).status == 404
    b = api.server.app[BROKER]
    assert await b.live.controller(sid) is None


async def test_a_viewer_leaving_takes_its_control_with_it(api) -> None:
    sid, owner = await _session(api)
    share = await _share(api, sid, owner)
    b = api.server.app[BROKER]
    async with api.ws_connect("/api/v1/hosts/p1-h0/commands", headers=auth(NODE)) as node:
        viewer_ws = await api.ws_connect(f"/api/v1/sessions/{sid}/watch?access_token={share['token']}")
        viewer = (await _node_signal(node))["viewer"]
        assert (await api.post(f"/api/v1/sessions/{sid}/control", json={"viewer": viewer},
                               headers=auth(owner))).status == 200
        assert await b.live.controller(sid) == f"{share['id']} {viewer}"
        await viewer_ws.close()
        left = await _node_signal(node)  # the broker's leave step ran before it tells the node
        assert left["viewer"] == viewer and left["msg"]["type"] == "peer_left"
        assert await b.live.controller(sid) is None
        r = await api.post(f"/api/v1/sessions/{sid}/control", json={"viewer": viewer}, headers=auth(owner))
        assert r.status == 409 and (await r.json())["field"] == "viewer"
