"""Streaming endpoints: session events (SSE), node command sockets, signaling relay.

- ``GET /api/v1/sessions/{id}/events`` (owner or admin): Server-Sent Events.
  Each Redis message about the session, or (while it is queued) about its pool's queue, triggers a
  re-read of the authoritative record, so the stream always carries the real
  state and queue position (a dropped pub/sub message cannot leave a viewer
  with a stale position).
- ``GET /api/v1/hosts/{id}/commands`` (the host's own node credential): WebSocket.  The broker
  pushes ``start``/``stop``/``warn``/``signal`` commands published on the
  host's channel by any replica; on connect it replays the host's ``starting``
  sessions so an assignment published before the node connected is not lost (and skips, once, the
  publish of a session it replayed: one seated between subscribing and listing is both).
  The node sends signaling messages for viewers up the same socket.
- ``GET /api/v1/sessions/{id}/signal`` (session owner): WebSocket.  Viewer
  messages go to the node's channel; node messages arrive on the session's
  client channel.  Any replica can hold either side.  One browser tab at a time
  holds the session's viewer (``?tab=<id>``, ``P:session:{id}:tab``): another tab
  gets ``in_use`` and its socket closes, unless it asks ``?takeover=1``; then the
  holder gets ``moved`` and its socket closes.  Only the holder's socket tells the
  node ``peer_left`` when it closes, so a tab that lost the session cannot drop the
  viewer that replaced it.  A client without ``tab`` takes over on every connect
  (what every connect did before tabs were told apart).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from typing import Any, Final

from aiohttp import WSMsgType, web

from broker.errors import Conflict, MalformedBody, NotFound, ValidationError
from broker.http.api import parse_json, principal, require_host, routes, signal_messages
from broker.keys_app import BROKER, HUB
from broker.models import TAB_RE
from broker.protocol import (
    API_PREFIX,
    SEATED_STATES,
    SIGNAL_MAX_BYTES,
    NodeCommand,
    Role,
    SessionState,
    SignalType,
)
from broker.store.keys import STAGED_STATE, VIEWER_TAB_RENEW_S

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
    pool_channel = keys.chan_pool(view["pool"])
    async with hub.listen(keys.chan_session(sid), pool_channel) as q:
        last: tuple[Any, ...] | None = None
        while True:
            if view["state"] != SessionState.QUEUED:
                # Only a queued session's position follows the pool's queue (a session never goes back to
                # the queue): a seated one stops re-reading its record on every queue movement of its pool.
                hub.unlisten(q, pool_channel)
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
        listed: set[str] = set()  # starts sent from the listing: their publish may still be in ``q``
        for s in await b.live.get_sessions(host["sessions"]):
            if s["state"] in (SessionState.STARTING, STAGED_STATE):
                await ws.send_json(b.session_command(s))
                listed.add(s["id"])
        pump = asyncio.create_task(_forward(q, ws, b, listed))
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


async def _forward(q: asyncio.Queue[bytes], ws: web.WebSocketResponse, b: Any, listed: set[str]) -> None:
    """Forward the host channel's commands; a plain start the listing already sent is skipped once.

    The socket listens before it lists the host's sessions (so no assignment falls between the two),
    which means a session seated in between is both listed and published: its publish is the
    duplicate.  A ``bind`` start is a different command (a staged session handed out) and always goes.
    """
    while True:
        raw = await q.get()
        msg = json.loads(raw)
        if msg.get("cmd") == NodeCommand.START.value:
            if not msg.get("bind") and msg["session"]["id"] in listed:
                listed.discard(msg["session"]["id"])
                continue
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
    viewer = msg.get("viewer")
    if isinstance(viewer, str) and viewer:  # for one share viewer (broker.http.shares)
        await b.live.redis.publish(b.live.keys.chan_signal_viewer(sid, viewer[:64]), json.dumps(inner))
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
    tab = request.query.get("tab", "")
    if tab and not TAB_RE.match(tab):
        raise ValidationError("tab: 1 to 64 letters, digits, '-' or '_'", field="tab")
    takeover = request.query.get("takeover", "") in ("1", "true") or not tab
    tab = tab or f"untabbed-{uuid.uuid4().hex}"
    host = s["host"]
    ws = web.WebSocketResponse(heartbeat=10.0, max_msg_size=SIGNAL_MAX_BYTES)
    await ws.prepare(request)
    node_chan = b.live.keys.chan_node(host)
    client_chan = b.live.keys.chan_signal_client(sid)
    sock = uuid.uuid4().hex  # this socket, among the ones a tab opens over reloads and reconnects
    held, other = await b.live.claim_tab(sid, tab, sock, take=takeover)
    if not held:
        await ws.send_json({"type": SignalType.IN_USE.value,
                            "detail": "this session is open in another tab; connect with takeover=1 to continue here"})
        await ws.close()
        return ws

    async def to_node(inner: dict[str, Any]) -> None:
        await b.live.redis.publish(node_chan, json.dumps(
            {"cmd": NodeCommand.SIGNAL.value, "session_id": sid, "msg": inner}))

    async with hub.listen(client_chan, b.live.keys.chan_session(sid)) as q:
        if other and other != tab:  # the tab that held it stops (it is listening on the client channel)
            await b.live.redis.publish(client_chan, json.dumps({"type": SignalType.MOVED.value, "tab": tab}))
        await to_node({"type": SignalType.PEER_JOINED.value})
        pump = asyncio.create_task(_forward_client(q, ws, tab))
        keeper = asyncio.create_task(_keep_tab(b, sid, tab, sock, ws))
        try:
            async for inner in signal_messages(ws, SIGNAL_TYPES, "a signaling message type"):
                await b.touch_session(sid)
                await to_node(inner)
        finally:
            for task in (pump, keeper):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            with contextlib.suppress(Exception):
                # a socket that lost the session (another tab, or a newer socket of this tab) leaves the
                # viewer that replaced it be
                if await b.live.release_tab(sid, tab, sock):
                    await to_node({"type": SignalType.PEER_LEFT.value})
    return ws


MOVED_DETAIL: Final = "this session moved to another tab"


async def _keep_tab(b: Any, sid: str, tab: str, sock: str, ws: web.WebSocketResponse) -> None:
    """Renew the tab's hold while its socket is open; a hold another tab took ends the socket."""
    while True:
        await asyncio.sleep(VIEWER_TAB_RENEW_S)
        try:
            if await b.live.keep_tab(sid, tab, sock):
                continue
            # lapsed (Redis was slow): take it back if it is free
            held, _ = await b.live.claim_tab(sid, tab, sock, take=False)
        except Exception:  # task boundary: Redis away; the next renewal tries again
            log.warning("session %s: renewing tab %s failed", sid, tab, exc_info=True)
            continue
        if not held:
            await ws.send_json({"type": SignalType.MOVED.value, "detail": MOVED_DETAIL})
            await ws.close()
            return


async def _forward_client(q: asyncio.Queue[bytes], ws: web.WebSocketResponse, tab: str) -> None:
    while True:
        msg = json.loads(await q.get())
        if msg.get("type") == SignalType.MOVED:
            if msg.get("tab") == tab:
                continue  # our own takeover
            await ws.send_json({"type": SignalType.MOVED.value, "detail": MOVED_DETAIL})
            await ws.close()
            return
        if msg.get("type") == "state":
            if msg.get("state") == SessionState.ENDED:
                await ws.send_json({"type": SignalType.BYE.value, "reason": msg.get("reason")})
                await ws.close()
                return
            continue
        if msg.get("type") == "warning":
            continue
        await ws.send_json(msg)
