"""Streaming endpoints: session events (SSE), node command sockets, signaling relay.

- ``GET /api/v1/sessions/{id}/events`` (owner or admin): Server-Sent Events.
  Each Redis message about the session, or about its pool's queue, triggers a
  re-read of the authoritative record, so the stream always carries the real
  state and queue position (a dropped pub/sub message cannot leave a viewer
  with a stale position).
- ``GET /api/v1/hosts/{id}/commands`` (the host's own node credential): WebSocket.  The broker
  pushes ``start``/``stop``/``warn``/``signal`` commands published on the
  host's channel by any replica; on connect it replays the host's ``starting``
  sessions so an assignment published before the node connected is not lost.
  The node sends signaling messages for viewers up the same socket.
- ``GET /api/v1/sessions/{id}/signal`` (session owner): WebSocket.  Viewer
  messages go to the node's channel; node messages arrive on the session's
  client channel.  Any replica can hold either side.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from aiohttp import WSMsgType, web

from broker.errors import Conflict, MalformedBody, NotFound
from broker.http.api import parse_json, principal, require_host, routes
from broker.keys_app import BROKER, HUB
from broker.protocol import (
    API_PREFIX,
    SEATED_STATES,
    SIGNAL_MAX_BYTES,
    NodeCommand,
    Role,
    SessionState,
    SignalType,
)
from broker.store.keys import STAGED_STATE

SIGNAL_TYPES = frozenset(t.value for t in SignalType)

log = logging.getLogger(__name__)

SSE_KEEPALIVE_S = 15.0


async def _sse_send(resp: web.StreamResponse, event: str, data: dict[str, Any]) -> None:
    await resp.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())


@routes.get(f"{API_PREFIX}/sessions/{{sid}}/events")
async def session_events(request: web.Request) -> web.StreamResponse:
    who = principal(request, query_token=True)
    b, hub = request.app[BROKER], request.app[HUB]
    sid = request.match_info["sid"]
    view = await b.get_session(who, sid)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                       "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    try:
        await _stream_events(resp, b, hub, sid, view)
    except ConnectionResetError:  # the viewer closed the page: normal, not an error worth a traceback
        log.debug("events stream of session %s closed by the client", sid)
    return resp


async def _stream_events(resp: web.StreamResponse, b: Any, hub: Any, sid: str, view: dict[str, Any]) -> None:
    keys = b.live.keys
    async with hub.listen(keys.chan_session(sid), keys.chan_pool(view["pool"])) as q:
        last: tuple[Any, ...] | None = None
        while True:
            key = (view["state"], view.get("queue_position"), view.get("host"))
            if key != last:
                last = key
                await _sse_send(resp, "state", {"type": "state", **view})
            if view["state"] == SessionState.ENDED:
                break
            try:
                raw = await asyncio.wait_for(q.get(), SSE_KEEPALIVE_S)
            except TimeoutError:
                await resp.write(b": keepalive\n\n")
                continue
            msg = json.loads(raw)
            if msg.get("type") == "warning":
                await _sse_send(resp, "warning", msg)
                continue
            view = await b.session_view(sid)


@routes.get(f"{API_PREFIX}/hosts/{{id}}/commands")
async def node_commands(request: web.Request) -> web.WebSocketResponse:
    host_id = request.match_info["id"]
    require_host(request, host_id, Role.NODE)  # a node's own credential only: 403 before the upgrade
    b, hub = request.app[BROKER], request.app[HUB]
    await b.get_host(host_id)  # 404 for unknown hosts before upgrading
    ws = web.WebSocketResponse(heartbeat=10.0, max_msg_size=SIGNAL_MAX_BYTES)
    await ws.prepare(request)
    async with hub.listen(b.live.keys.chan_node(host_id)) as q:
        host = await b.get_host(host_id)
        for s in await b.live.get_sessions(host["sessions"]):
            if s["state"] in (SessionState.STARTING, STAGED_STATE):
                await ws.send_json(b.session_command(s))
        pump = asyncio.create_task(_forward(q, ws, b))
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                await _from_node(b, host_id, msg.data, ws)
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
    return ws


async def _forward(q: asyncio.Queue[bytes], ws: web.WebSocketResponse, b: Any) -> None:
    while True:
        raw = await q.get()
        msg = json.loads(raw)
        if msg.get("cmd") == NodeCommand.START.value:
            s = await b.live.get_session(msg["session"]["id"])
            # a start (or a staged one), or a staged session handed to a user (bind: same runtime, now theirs)
            if s is None or not (s["state"] in (SessionState.STARTING, STAGED_STATE)
                                 or (msg.get("bind") and s["state"] in SEATED_STATES)):
                continue
            bind = bool(msg.get("bind"))
            msg = b.session_command(s)  # add ICE servers / TURN credentials minted per session
            if bind:
                msg["bind"] = True
        await ws.send_json(msg)


async def _from_node(b: Any, host_id: str, data: str, ws: web.WebSocketResponse) -> None:
    try:
        msg = parse_json(data, "message")
        if not isinstance(msg, dict):
            raise ValueError("expected a JSON object")
        sid = str(msg["session_id"])
        inner = msg["msg"]
        if msg.get("cmd") != NodeCommand.SIGNAL.value or not isinstance(inner, dict):
            raise ValueError("expected a signal command")
    except (ValueError, KeyError, TypeError, MalformedBody) as exc:
        await ws.send_json({"cmd": "error", "detail": f"bad node message: {exc}"})
        return
    s = await b.live.get_session(sid)
    if s is None or s.get("host") != host_id:
        await ws.send_json({"cmd": "error", "detail": f"session {sid} is not on host {host_id}"})
        return
    await b.live.redis.publish(b.live.keys.chan_signal_client(sid), json.dumps(inner))


@routes.get(f"{API_PREFIX}/sessions/{{sid}}/signal")
async def signal(request: web.Request) -> web.WebSocketResponse:
    who = principal(request, query_token=True)
    b, hub = request.app[BROKER], request.app[HUB]
    sid = request.match_info["sid"]
    s = await b.live.get_session(sid)
    if s is None:
        raise NotFound(f"no session {sid!r}", field="session")
    if who.role != Role.USER or who.name != s["user"]:
        raise NotFound(f"no session {sid!r}", field="session")
    if s["state"] not in (SessionState.STARTING, SessionState.RUNNING, SessionState.DISCONNECTED):
        raise Conflict(f"session {sid!r} is {s['state']}: signaling needs a seated session", field="session")
    host = s["host"]
    ws = web.WebSocketResponse(heartbeat=10.0, max_msg_size=SIGNAL_MAX_BYTES)
    await ws.prepare(request)
    node_chan = b.live.keys.chan_node(host)

    async def to_node(inner: dict[str, Any]) -> None:
        await b.live.redis.publish(node_chan, json.dumps(
            {"cmd": NodeCommand.SIGNAL.value, "session_id": sid, "msg": inner}))

    async with hub.listen(b.live.keys.chan_signal_client(sid), b.live.keys.chan_session(sid)) as q:
        await to_node({"type": SignalType.PEER_JOINED.value})
        pump = asyncio.create_task(_forward_client(q, ws))
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                try:
                    inner = parse_json(msg.data, "message")
                    if not isinstance(inner, dict) or not isinstance(inner.get("type"), str) \
                            or inner["type"] not in SIGNAL_TYPES:
                        raise ValueError("type must be a signaling message type")
                except (ValueError, MalformedBody) as exc:  # a bad frame is answered, the socket lives on
                    await ws.send_json({"type": SignalType.ERROR.value, "code": "bad_signal", "detail": str(exc)})
                    continue
                await b.touch_session(sid)
                await to_node(inner)
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
            with contextlib.suppress(Exception):
                await to_node({"type": SignalType.PEER_LEFT.value})
    return ws


async def _forward_client(q: asyncio.Queue[bytes], ws: web.WebSocketResponse) -> None:
    while True:
        msg = json.loads(await q.get())
        if msg.get("type") == "state":
            if msg.get("state") == SessionState.ENDED:
                await ws.send_json({"type": SignalType.BYE.value, "reason": msg.get("reason")})
                await ws.close()
                return
            continue
        if msg.get("type") == "warning":
            continue
        await ws.send_json(msg)
