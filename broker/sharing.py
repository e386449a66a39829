"""Share links: an owner lets view-only viewers watch their session; an admin shadows any session.

Job: create, list and revoke a session's share links and admit or refuse the viewers that present a
link's token.  A link is a signed ``s1`` token (``broker.auth.mint_share_token``) scoped to one
session and one share id, plus a record in Redis (``P:session:{id}:shares``); revoking writes a marker
that lives for the token's remaining life (``P:share:{id}:revoked``).  Revoking and joining are each one
Lua step (``store/lua/share.lua``), so a viewer either joins before the revocation (and is listed in it,
told ``bye share_revoked`` and cut off) or is refused after it; never in between, whichever replica
serves either side.

Control (``grant_control``/``take_control``): the owner hands control to one connected viewer at a time
(``P:session:{id}:control``, set by the same Lua script, so it never outlives the viewer's place or its
link); the node is told with a ``control`` command which viewer's input to apply, and the viewer with a
``control`` message.  The owner's own input is always applied: control is shared with one viewer, never
taken from the owner, and the owner takes it back at once.  Both are audited.

An admin's link is a shadow: audited ``session.shadow`` and, where the pool says ``announce_shadow``, the
owner is told through the session's event stream (a ``shadowed`` warning).  Every create and revoke is
audited.

Concurrency: stateless functions over the ``Broker`` (one per process); wall-clock time for expiries
(tokens carry epoch seconds), the broker's clock for audit stamps.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import time
from typing import Any

from broker.auth import Keys, Principal, ShareGrant, mint_share_token, verify_share_token
from broker.errors import Conflict, NotFound, ShareRevoked, ValidationError
from broker.models import CONTROL_SCHEMA, SHARE_SCHEMA
from broker.protocol import API_PREFIX, SEATED_STATES, NodeCommand, Role, SignalType
from broker.service import Broker
from broker.store.keys import SHARES_MAX
from broker.validate import validate

log = logging.getLogger(__name__)

SHARE_ID_BYTES = 8  # 16 hex characters
VIEWER_ID_RE = re.compile(r"^[0-9a-f]{16}$")  # the signaling socket's viewer id (broker.http.shares)


def wall_ms() -> int:
    return int(time.time() * 1000)


async def create_share(b: Broker, keys: Keys, who: Principal, sid: str, body: Any) -> dict[str, Any]:
    """Mint a link for session ``sid`` (its owner, or an admin: a shadow); 404 for anyone else's session."""
    data = validate(body, SHARE_SCHEMA)
    s = await b.live.get_session(sid)
    if s is None:
        raise NotFound(f"no session {sid!r}", field="session")
    b.check_owner(who, s)
    if s["state"] not in SEATED_STATES:
        raise Conflict(f"session {sid!r} is {s['state']}: only a seated session can be shared", field="session")
    shadow = who.role == Role.ADMIN and who.name != s["user"]
    share_id = secrets.token_hex(SHARE_ID_BYTES)
    now = time.time()
    token, exp = mint_share_token(keys, sid, share_id, data["role"], now, data["ttl_s"])
    created_ms = b.clock()
    record = {"role": data["role"], "by": who.name, "shadow": shadow, "created_ms": created_ms, "expires_at": exp}
    status = await b.live.create_share(sid, share_id, record, data["ttl_s"] * 1000, int(now * 1000), SHARES_MAX)
    if status == "not_live":
        raise Conflict(f"session {sid!r} has ended", field="session")
    if status == "too_many":
        raise Conflict(f"session {sid!r} already has {SHARES_MAX} live share links: stop one first", field="session")
    action = "session.shadow" if shadow else "share.create"
    await b.repo.audit(created_ms, who.name, who.role, action, sid,
                       {"share": share_id, "role": data["role"], "ttl_s": data["ttl_s"]})
    if shadow:
        await _announce_shadow(b, s, who)
    return {"id": share_id, "session": sid, "token": token, "role": data["role"], "by": who.name, "shadow": shadow,
            "created_ms": created_ms, "expires_at": exp, "watch_url": f"/watch?token={token}",
            "signaling_url": f"{API_PREFIX}/sessions/{sid}/watch"}


async def _announce_shadow(b: Broker, s: dict[str, Any], who: Principal) -> None:
    cfg = await b.live.get_pool(s["pool"])
    if cfg is None or not cfg.announce_shadow:
        return
    await b.live.redis.publish(b.live.keys.chan_session(s["id"]), json.dumps(
        {"type": "warning", "code": "shadowed", "detail": f"an administrator ({who.name}) is watching this session",
         "ends_in_s": None}))


async def list_shares(b: Broker, who: Principal, sid: str) -> list[dict[str, Any]]:
    """The session's live links, oldest first: id, role, by, shadow, created, expiry, viewers connected."""
    b.check_owner(who, await _session(b, sid))
    rows = await b.live.shares(sid, wall_ms())
    out = [{"id": k, **v} for k, v in rows.items()]
    return sorted(out, key=lambda r: (r["created_ms"], r["id"]))


async def controller(b: Broker, sid: str) -> str | None:
    """The viewer id in control of session ``sid`` (besides its owner), or None."""
    member = await b.live.controller(sid)
    return member.split(" ", 1)[1] if member and " " in member else None


async def grant_control(b: Broker, who: Principal, sid: str, body: Any) -> dict[str, Any]:
    """Hand control to one connected share viewer (replacing any other): 422 for a malformed ``viewer``,
    409 naming ``viewer`` when it is not connected to the session now."""
    data = validate(body, CONTROL_SCHEMA)
    viewer = data["viewer"]
    if not VIEWER_ID_RE.match(viewer):
        raise ValidationError("viewer: must be a viewer id (16 hex digits) from GET /sessions/{id}/shares",
                              field="viewer")
    s = await _session(b, sid)
    b.check_owner(who, s)
    if s["state"] not in SEATED_STATES:
        raise Conflict(f"session {sid!r} is {s['state']}: only a seated session can be controlled", field="session")
    status, previous = await b.live.set_control(sid, viewer, wall_ms())
    if status != "ok":
        raise Conflict(f"viewer {viewer!r} is not watching session {sid!r} now", field="viewer")
    prev = previous.split(" ", 1)[1] if previous and " " in previous else None
    await _tell_control(b, s, viewer, prev)
    await b.repo.audit(b.clock(), who.name, who.role, "control.grant", sid, {"viewer": viewer, "previous": prev})
    return {"session": sid, "controller": viewer, "previous": prev}


async def take_control(b: Broker, who: Principal, sid: str) -> dict[str, Any]:
    """Take control back from the viewer that has it (idempotent: ``previous`` null when none had it)."""
    s = await _session(b, sid)
    b.check_owner(who, s)
    _, previous = await b.live.set_control(sid, None, wall_ms())
    prev = previous.split(" ", 1)[1] if previous and " " in previous else None
    if prev is not None:
        await _tell_control(b, s, None, prev)
        await b.repo.audit(b.clock(), who.name, who.role, "control.revoke", sid, {"viewer": prev})
    return {"session": sid, "controller": None, "previous": prev}


async def _tell_control(b: Broker, s: dict[str, Any], viewer: str | None, previous: str | None) -> None:
    """The node learns which viewer's input to apply; the viewers concerned learn what they may do."""
    sid, keys = s["id"], b.live.keys
    if s.get("host"):
        await b.live.redis.publish(keys.chan_node(s["host"]), json.dumps(
            {"cmd": NodeCommand.CONTROL.value, "session_id": sid, "viewer": viewer}))
    if previous is not None and previous != viewer:
        await b.live.redis.publish(keys.chan_signal_viewer(sid, previous), json.dumps(
            {"type": SignalType.CONTROL.value, "granted": False}))
    if viewer is not None:
        await b.live.redis.publish(keys.chan_signal_viewer(sid, viewer), json.dumps(
            {"type": SignalType.CONTROL.value, "granted": True}))


async def revoke_shares(b: Broker, who: Principal, sid: str, share_id: str | None) -> dict[str, Any]:
    """Revoke one link or all of them; their viewers are told ``bye share_revoked`` and the node ``peer_left``."""
    s = await _session(b, sid)
    b.check_owner(who, s)
    in_control = await controller(b, sid)
    status, revoked, removed = await b.live.revoke_shares(sid, share_id, wall_ms())
    if status == "not_found":
        raise NotFound(f"no share {share_id!r} on session {sid!r}", field="share")
    viewers = [m.split(" ", 1)[1] for m in removed if " " in m]
    if in_control is not None and in_control in viewers and s.get("host"):
        # the script dropped the control key with the link; the node stops applying that viewer's input
        # now (before peer_left closes its connection: no input in flight is applied meanwhile)
        await b.live.redis.publish(b.live.keys.chan_node(s["host"]), json.dumps(
            {"cmd": NodeCommand.CONTROL.value, "session_id": sid, "viewer": None}))
    # The node hears of each viewer cut off (their sockets say so too as they close; a viewer whose
    # broker replica died has no socket to say it): peer_left is idempotent on the node.
    if s.get("host") and s["state"] in SEATED_STATES:
        for viewer in viewers:
            await b.live.redis.publish(b.live.keys.chan_node(s["host"]), json.dumps(
                {"cmd": "signal", "session_id": sid, "viewer": viewer,
                 "msg": {"type": SignalType.PEER_LEFT.value, "reason": "share_revoked"}}))
    if revoked:
        await b.repo.audit(b.clock(), who.name, who.role, "share.revoke", sid,
                           {"shares": revoked, "viewers": len(viewers)})
    return {"session": sid, "revoked": revoked, "viewers_disconnected": len(viewers)}


async def _session(b: Broker, sid: str) -> dict[str, Any]:
    s = await b.live.get_session(sid)
    if s is None:
        raise NotFound(f"no session {sid!r}", field="session")
    return s


async def check_grant(b: Broker, keys: Keys, token: str, sid: str | None = None) -> ShareGrant:
    """A share token's grant: 401 forged/expired, 404 for another session than ``sid`` (or an ended one),
    403 ``share_revoked`` when its link was revoked."""
    grant = verify_share_token(keys, token, time.time())
    if sid is not None and grant.session != sid:
        raise NotFound(f"no session {sid!r}", field="session")
    if await b.live.share_revoked(grant.share_id):
        raise ShareRevoked("the owner stopped sharing this session", field="token")
    s = await b.live.get_session(grant.session)
    if s is None or s["state"] not in SEATED_STATES:
        raise ShareRevoked("this session is no longer shared (it ended)", field="token")
    return grant
