"""Share-link routes: the owner's REST (create, list, revoke), the watch page and the viewer's signaling socket.

- ``POST /api/v1/sessions/{sid}/shares`` (owner; an admin: a shadow), ``GET`` lists, ``DELETE .../shares/{share}``
  and ``DELETE .../shares`` revoke (``broker.sharing``).
- ``POST /api/v1/sessions/{sid}/control`` ``{"viewer": id}`` hands control to one connected viewer,
  ``DELETE`` takes it back (``broker.sharing``).
- ``GET /watch?token=<share token>``: the view-only page (``web/watch.html``), or with ``Accept: application/json``
  what it needs to connect (session, ICE servers, signaling path); 401 for a forged or expired token, 403
  ``share_revoked`` for a revoked one (a problem body; a browser asking for HTML gets the page with that
  status, and the page says why).
- ``GET /api/v1/sessions/{sid}/watch?access_token=<share token>``: WebSocket.  The viewer gets an id; its
  messages go to the node as ``{"cmd":"signal","session_id":...,"viewer":id,"role":...,"msg":...}`` and the
  node's answers come back on ``P:sig:{sid}:viewer:{id}``.  Joining is one Lua step with revocation; a
  revocation (``P:sig:{sid}:shares``, published by that step) or the session's end sends ``bye`` and closes
  the socket, and the node hears ``peer_left`` for that viewer.  Nothing is sent to the viewer on connect:
  the page offers once and waits for the answer.

Concurrency: one task per socket reading the viewer, one pumping the hub queue, one renewing the hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import uuid
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from broker.errors import BrokerError, ValidationError
from broker.http.api import PATH_RULES, ok, principal, read_json, routes, signal_messages, signing_keys
from broker.keys_app import BROKER, HUB, SETTINGS
from broker.protocol import API_PREFIX, SIGNAL_MAX_BYTES, ByeReason, NodeCommand, SessionState, SignalType
from broker.service import Broker
from broker.sharing import (
    check_grant,
    controller,
    create_share,
    grant_control,
    list_shares,
    revoke_shares,
    take_control,
    wall_ms,
)
from broker.store.keys import VIEWER_TAB_RENEW_S

log = logging.getLogger(__name__)

SHARE_ID_RE: Final = re.compile(r"^[0-9a-f]{16}$")
PATH_RULES["share"] = (SHARE_ID_RE, "share")
# what a viewer may send the node: its own connection's signaling, nothing that speaks for the broker
VIEWER_SIGNALS: Final = frozenset({SignalType.OFFER.value, SignalType.CANDIDATE.value, SignalType.BYE.value})
PAGE_HEADERS: Final = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}  # the URL holds a token
WEB_WATCH: Final = Path(__file__).resolve().parents[2] / "web" / "watch.html"


@routes.post(f"{API_PREFIX}/sessions/{{sid}}/shares")
async def post_share(request: web.Request) -> web.Response:
    who = principal(request)
    body = await read_json(request)
    share = await create_share(request.app[BROKER], signing_keys(request.app[SETTINGS]), who,
                               request.match_info["sid"], body)
    return ok(share, 201)


@routes.get(f"{API_PREFIX}/sessions/{{sid}}/shares")
async def get_shares(request: web.Request) -> web.Response:
    who = principal(request)
    sid = request.match_info["sid"]
    b = request.app[BROKER]
    shares = await list_shares(b, who, sid)
    return ok({"session": sid, "shares": shares, "controller": await controller(b, sid)})


@routes.post(f"{API_PREFIX}/sessions/{{sid}}/control")
async def post_control(request: web.Request) -> web.Response:
    who = principal(request)
    body = await read_json(request)
    return ok(await grant_control(request.app[BROKER], who, request.match_info["sid"], body))


@routes.delete(f"{API_PREFIX}/sessions/{{sid}}/control")
async def delete_control(request: web.Request) -> web.Response:
    who = principal(request)
    return ok(await take_control(request.app[BROKER], who, request.match_info["sid"]))


@routes.delete(f"{API_PREFIX}/sessions/{{sid}}/shares/{{share}}")
async def delete_share(request: web.Request) -> web.Response:
    who = principal(request)
    return ok(await revoke_shares(request.app[BROKER], who, request.match_info["sid"], request.match_info["share"]))


@routes.delete(f"{API_PREFIX}/sessions/{{sid}}/shares")
async def delete_shares(request: web.Request) -> web.Response:
    who = principal(request)
    return ok(await revoke_shares(request.app[BROKER], who, request.match_info["sid"], None))


def _token(request: web.Request, name: str) -> str:
    token = request.query.get(name, "")
    if not token:
        raise ValidationError(f"{name}: the share link's token is required", field=name)
    return token


@routes.get("/watch")
async def watch_page(request: web.Request) -> web.StreamResponse:
    """The view-only page, for a token that is valid and not revoked; asked for JSON (``Accept:
    application/json``), what the page needs to connect: session, role, expiry, ICE servers, signaling path."""
    b = request.app[BROKER]
    accept = request.headers.get("Accept", "")
    try:
        grant = await check_grant(b, signing_keys(request.app[SETTINGS]), _token(request, "token"))
    except BrokerError as exc:
        if "text/html" not in accept or not WEB_WATCH.exists():
            raise
        # a browser: the page with the refusal's status; it asks again for JSON and says why (revoked, expired)
        return web.FileResponse(WEB_WATCH, status=exc.status, headers=PAGE_HEADERS)
    if "application/json" in accept:
        return ok({"session": grant.session, "role": grant.role, "expires_at": grant.expires_at,
                   "ice_servers": b.ice_servers(grant.session),
                   "signaling_url": f"{API_PREFIX}/sessions/{grant.session}/watch"})
    if not WEB_WATCH.exists():
        return ok({"watch": "ok"})
    return web.FileResponse(WEB_WATCH, headers=PAGE_HEADERS)


@routes.get(f"{API_PREFIX}/sessions/{{sid}}/watch")
async def watch_signal(request: web.Request) -> web.WebSocketResponse:
    b, hub = request.app[BROKER], request.app[HUB]
    sid = request.match_info["sid"]
    grant = await check_grant(b, signing_keys(request.app[SETTINGS]), _token(request, "access_token"), sid)
    s = await b.live.get_session(sid)
    host = s["host"] if s else None
    ws = web.WebSocketResponse(heartbeat=10.0, max_msg_size=SIGNAL_MAX_BYTES)
    await ws.prepare(request)
    viewer = uuid.uuid4().hex[:16]
    keys = b.live.keys

    async def to_node(inner: dict[str, Any]) -> None:
        await b.live.redis.publish(keys.chan_node(host or ""), json.dumps(
            {"cmd": NodeCommand.SIGNAL.value, "session_id": sid, "viewer": viewer, "role": grant.role,
             "msg": inner}))

    async with hub.listen(keys.chan_signal_viewer(sid, viewer), keys.chan_shares(sid), keys.chan_session(sid)) as q:
        # listening before joining: a revocation after the join reaches this socket
        status = await b.live.join_share(sid, grant.share_id, viewer, wall_ms())
        if status != "ok" or not host:
            await _bye(ws, ByeReason.SHARE_REVOKED.value)
            return ws
        await to_node({"type": SignalType.PEER_JOINED.value})
        tasks = [asyncio.create_task(_pump(q, ws, grant.share_id)),
                 asyncio.create_task(_keep(b, sid, grant.share_id, viewer, ws))]
        try:
            async for inner in signal_messages(ws, VIEWER_SIGNALS, "offer, candidate or bye"):
                await to_node(inner)
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            with contextlib.suppress(Exception):
                await b.live.leave_share(sid, grant.share_id, viewer)
                await to_node({"type": SignalType.PEER_LEFT.value})
    return ws


async def _bye(ws: web.WebSocketResponse, reason: str | None) -> None:
    with contextlib.suppress(Exception):
        await ws.send_json({"type": SignalType.BYE.value, "reason": reason})
        await ws.close()


async def _pump(q: asyncio.Queue[bytes], ws: web.WebSocketResponse, share_id: str) -> None:
    """Node messages to the viewer; a revocation of its link or the session's end closes the socket."""
    while True:
        msg = json.loads(await q.get())
        kind = msg.get("type")
        if kind == ByeReason.SHARE_REVOKED:
            if share_id in msg.get("shares", ()):
                await _bye(ws, ByeReason.SHARE_REVOKED.value)
                return
            continue
        if kind == "state":
            if msg.get("state") == SessionState.ENDED:
                await _bye(ws, msg.get("reason"))
                return
            continue
        if kind == "warning":
            continue
        await ws.send_json(msg)


async def _keep(b: Broker, sid: str, share_id: str, viewer: str, ws: web.WebSocketResponse) -> None:
    """Renew the viewer's hold while its socket is open; a hold that is gone (revoked) ends the socket."""
    while True:
        await asyncio.sleep(VIEWER_TAB_RENEW_S)
        try:
            held = await b.live.keep_share(sid, share_id, viewer, wall_ms())
        except Exception:  # task boundary: Redis away; the next renewal tries again
            log.warning("session %s: renewing viewer %s failed", sid, viewer, exc_info=True)
            continue
        if not held:
            await _bye(ws, ByeReason.SHARE_REVOKED.value)
            return
