"""The node command socket sends each ``start`` once.

The socket subscribes to its host's channel, then lists the host's starting sessions and sends them.
A session seated between those two steps is listed *and* its publish (from the seating step) waits in
the socket's queue: that publish must not reach the node as a second ``start``.  The test replays
exactly that order: the listing sends a start, then the same start is published on the host's
channel (as the seating step published it), then the session is deleted; the next message the node
reads must be the ``stop``.
"""

from __future__ import annotations

import json

from broker.keys_app import BROKER
from tests.conftest import NODE, auth, setup_pool, user_token


async def _create(api, token: str) -> str:  # type: ignore[no-untyped-def]
    r = await api.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(token))
    assert r.status == 201, await r.text()
    return str((await r.json())["id"])


async def test_a_start_listed_on_connect_is_not_sent_again_when_its_publish_arrives(api) -> None:  # type: ignore[no-untyped-def]
    await setup_pool(api, "p1")
    token = await user_token(api, "alice")
    listed = await _create(api, token)  # seated before the node connects: its publish reached no socket
    b = api.server.app[BROKER]
    async with api.ws_connect("/api/v1/hosts/p1-h0/commands", headers=auth(NODE)) as ws:
        first = await ws.receive_json(timeout=5)
        assert first["cmd"] == "start" and first["session"]["id"] == listed
        # the seating step's publish, arriving after the listing (the race's second half)
        record = await b.live.get_session(listed)
        await b.live.redis.publish(b.live.keys.chan_node("p1-h0"), json.dumps({"cmd": "start", "session": record}))
        r = await api.delete(f"/api/v1/sessions/{listed}", headers=auth(token))
        assert r.status in (200, 204), await r.text()
        nxt = await ws.receive_json(timeout=5)
        assert (nxt["cmd"], nxt.get("session_id")) == ("stop", listed), nxt  # not a second start
        # a session seated while the socket is open still gets its start (the skip is for listed ones only)
        later = await _create(api, token)
        nxt = await ws.receive_json(timeout=5)
        assert nxt["cmd"] == "start" and nxt["session"]["id"] == later
        assert nxt["session"]["ice_servers"] is not None  # the per-session payload, not the raw publish
