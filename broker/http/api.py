"""REST handlers under /api/v1: pools, hosts, sessions, tokens, admin views.

Each handler authenticates (``require``), parses JSON (``read_json``), calls
one ``Broker`` method and renders JSON.  Errors are raised as domain errors and
turned into problem bodies by ``broker.app.problem_middleware``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

from aiohttp import WSMsgType, web
from redis.exceptions import RedisError

from broker.auth import Principal, authenticate, mint_node_credential, mint_user_token, needs_renewal
from broker.errors import Conflict, Forbidden, MalformedBody, PayloadTooLarge, ValidationError
from broker.http.edge import check_access, check_metrics
from broker.keys_app import BROKER, METRICS, SETTINGS
from broker.models import NAME_RE, TAB_RE, TOKEN_SCHEMA, parse_user
from broker.protocol import API_PREFIX, HostState, Role, SignalType
from broker.settings import BrokerSettings
from broker.validate import validate

routes = web.RouteTableDef()


def principal(request: web.Request, *, query_token: bool = False) -> Principal:
    """Who calls: the ``Authorization`` header; ``?access_token=`` only where ``query_token`` says so
    (the SSE and WebSocket routes: EventSource and WebSocket cannot set headers), so tokens stay out
    of REST URLs and their logs."""
    s = request.app[SETTINGS]
    header = request.headers.get("Authorization")
    if header is None and query_token and request.query.get("access_token"):
        header = "Bearer " + request.query["access_token"]
    who = authenticate(header, admin_token=s.admin_token, node_token=s.node_token, secret=signing_keys(s),
                       now_s=time.time())
    check_access(request, who)  # admin listener split, per-role address allow-lists (broker.http.edge)
    return who


def signing_keys(s: BrokerSettings) -> tuple[str, ...]:
    """The HMAC keys newest first: ``secret`` signs, it and ``previous_secrets`` verify (rotation overlap)."""
    return (s.secret, *s.previous_secrets)


def require_host(request: web.Request, host_id: str, *roles: Role, field: str = "host") -> Principal:
    """The caller of a per-host route: an admin (where ``roles`` allows one), or a node whose credential
    is bound to ``host_id``.  A credential for another host is 403 naming ``field`` (the path's ``host``,
    or the body's ``id``).  The shared bootstrap token only registers hosts: on a per-host route it is
    403 naming ``Authorization`` unless the ``node_token_any_host`` compatibility window is on."""
    who = principal(request)
    if who.role not in roles:
        raise Forbidden(f"this endpoint needs a {' or '.join(r.value for r in roles)} token")
    if who.role != Role.NODE:
        return who
    if who.host is None:
        if request.app[SETTINGS].node_token_any_host:
            return who
        raise Forbidden("the shared node token only registers hosts (POST /api/v1/hosts); per-host routes "
                        "take the node_credential that registration returned", field="Authorization")
    if who.host != host_id:
        raise Forbidden(f"{field}: this node credential is bound to host {who.host!r}, not {host_id[:80]!r}",
                        field=field)
    return who


def node_credential(request: web.Request, host_id: str) -> dict[str, Any]:
    """A fresh credential bound to ``host_id``, signed with the newest key, as replies carry it."""
    s = request.app[SETTINGS]
    token, exp = mint_node_credential(signing_keys(s), host_id, time.time(), s.node_credential_ttl_s)
    return {"token": token, "host": host_id, "expires_at": exp}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
DRAIN_REASON_MAX = 200  # characters of a drain/undrain reason kept in the audit record
JSON_MAX_DEPTH = 32  # nesting levels a request body or a signaling message may have


def require(request: web.Request, *roles: Role) -> Principal:
    who = principal(request)
    if who.role not in roles:
        raise Forbidden(f"this endpoint needs a {' or '.join(r.value for r in roles)} token")
    return who


async def read_json(request: web.Request) -> Any:
    limit = request.app[SETTINGS].max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"body is {request.content_length} bytes; the limit is {limit}", field="body")
    raw = await request.content.read(limit + 1)
    if len(raw) > limit:
        raise PayloadTooLarge(f"body exceeds {limit} bytes", field="body")
    if not raw.strip():
        return {}
    return parse_json(raw, "body")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(raw: bytes | str, field: str) -> Any:
    """Strict JSON: no NaN/Infinity, nesting at most ``JSON_MAX_DEPTH``; else ``MalformedBody`` naming ``field``."""
    try:
        value = json.loads(raw, parse_constant=_no_constant)
    except RecursionError as exc:
        raise MalformedBody(f"{field}: nested too deeply", field=field) from exc
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise MalformedBody(f"{field} is not valid JSON: {exc}", field=field) from exc
    if _depth(value) > JSON_MAX_DEPTH:
        raise MalformedBody(f"{field}: nested deeper than {JSON_MAX_DEPTH} levels", field=field)
    return value


async def signal_messages(ws: web.WebSocketResponse, allowed: frozenset[str],
                          expected: str) -> AsyncIterator[dict[str, Any]]:
    """A viewer's signaling messages on ``ws``: text frames holding a JSON object whose ``type`` is one of
    ``allowed``.  A bad frame is answered with an ``error`` ``bad_signal`` (``expected`` says what ``type``
    must be) and skipped: the socket lives on."""
    async for msg in ws:
        if msg.type != WSMsgType.TEXT:
            continue
        try:
            inner = parse_json(msg.data, "message")
            if not isinstance(inner, dict) or not isinstance(inner.get("type"), str) or inner["type"] not in allowed:
                raise ValueError(f"type must be {expected}")
        except (ValueError, MalformedBody) as exc:
            await ws.send_json({"type": SignalType.ERROR.value, "code": "bad_signal", "detail": str(exc)})
            continue
        yield inner


def _depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value, iteratively (a deep value must not recurse here either)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            deepest = max(deepest, d)
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            deepest = max(deepest, d)
            stack.extend((x, d + 1) for x in v)
    return deepest


# Path parameters by route variable: the rule and the field a problem names.  Checked before any
# handler runs, so a name can never carry key syntax (":") into a Redis key.
SESSION_ID_RE: Final = re.compile(r"^[0-9a-f]{32}$")
PATH_RULES: Final = {"name": (NAME_RE, "pool"), "id": (NAME_RE, "host"), "sid": (SESSION_ID_RE, "session")}


@web.middleware
async def path_params_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse a malformed pool, host or session id in the URL path with a 422 naming the field."""
    for key, value in request.match_info.items():
        rule = PATH_RULES.get(key)
        if rule is not None and not rule[0].fullmatch(value):
            raise ValidationError(f"{rule[1]}: {value[:80]!r} must match {rule[0].pattern}", field=rule[1])
    return await handler(request)


def ok(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status)


def query_int(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        v = int(raw)
    except ValueError as exc:
        raise ValidationError(f"{name}: must be an integer", field=name) from exc
    if not lo <= v <= hi:
        raise ValidationError(f"{name}: must be between {lo} and {hi}", field=name)
    return v


# ---- tokens ---------------------------------------------------------------------------------
@routes.post(f"{API_PREFIX}/tokens")
async def mint_token(request: web.Request) -> web.Response:
    who = require(request, Role.ADMIN)
    data = validate(await read_json(request), TOKEN_SCHEMA)
    user = parse_user(data["user"])
    token, exp = mint_user_token(signing_keys(request.app[SETTINGS]), user, time.time(), data["ttl_s"])
    b = request.app[BROKER]
    await b.repo.audit(b.clock(), who.name, who.role, "token.mint", user, {"ttl_s": data["ttl_s"]})
    return ok({"token": token, "user": user, "expires_at": exp}, 201)


@routes.post(f"{API_PREFIX}/guest")
async def guest_token(request: web.Request) -> web.Response:
    s = request.app[SETTINGS]
    if not s.allow_guests:
        raise Forbidden("guest access is disabled on this broker (allow_guests)")
    import secrets

    user = "guest-" + secrets.token_hex(4)
    token, exp = mint_user_token(signing_keys(s), user, time.time(), 3600)
    return ok({"token": token, "user": user, "expires_at": exp}, 201)


@routes.get(f"{API_PREFIX}/whoami")
async def whoami(request: web.Request) -> web.Response:
    who = principal(request)
    out: dict[str, Any] = {"role": who.role.value, "name": who.name}
    if who.host is not None:
        out["host"] = who.host
    if who.expires_at is not None:
        out["expires_at"] = who.expires_at
    return ok(out)


# ---- pools ----------------------------------------------------------------------------------
@routes.get(f"{API_PREFIX}/pools")
async def list_pools(request: web.Request) -> web.Response:
    principal(request)
    return ok({"pools": await request.app[BROKER].list_pools()})


@routes.get(f"{API_PREFIX}/pools/{{name}}")
async def get_pool(request: web.Request) -> web.Response:
    principal(request)
    b = request.app[BROKER]
    return ok(await b.pool_view(await b.get_pool(request.match_info["name"])))


@routes.put(f"{API_PREFIX}/pools/{{name}}")
async def put_pool(request: web.Request) -> web.Response:
    who = require(request, Role.ADMIN)
    created, view = await request.app[BROKER].put_pool(who, request.match_info["name"], await read_json(request))
    return ok(view, 201 if created else 200)


@routes.delete(f"{API_PREFIX}/pools/{{name}}")
async def delete_pool(request: web.Request) -> web.Response:
    who = require(request, Role.ADMIN)
    await request.app[BROKER].delete_pool(who, request.match_info["name"])
    return web.Response(status=204)


@routes.get(f"{API_PREFIX}/pools/{{name}}/samples")
async def pool_samples(request: web.Request) -> web.Response:
    require(request, Role.ADMIN)
    b = request.app[BROKER]
    name = (await b.get_pool(request.match_info["name"])).name
    hours = query_int(request, "hours", 24, 1, 24 * 90)
    since = b.clock() - hours * 3_600_000
    return ok({"pool": name, "samples": await b.repo.samples(name, since)})


# ---- hosts ----------------------------------------------------------------------------------
@routes.post(f"{API_PREFIX}/hosts")
async def register_host(request: web.Request) -> web.Response:
    """Register a host with the shared node token (or re-register with the host's own credential);
    the reply carries ``node_credential``, bound to the host id, for every later per-host call.

    The bootstrap token cannot take over a host that is live (lease held): that re-registration
    needs the host's own credential, else 409 naming ``id`` (a restarted node that lost its
    credential registers once the old lease lapses, at most ``host_lease_ttl_s``)."""
    who = require(request, Role.NODE)
    body = await read_json(request)
    host_id = body.get("id") if isinstance(body, dict) else None
    b, s = request.app[BROKER], request.app[SETTINGS]
    if isinstance(host_id, str):
        if who.host is not None and who.host != host_id:
            raise Forbidden(f"id: this node credential is bound to host {who.host!r}, not {host_id[:80]!r}",
                            field="id")
        if who.host is None and not s.node_token_any_host and NAME_RE.fullmatch(host_id):
            live = await b.live.get_hosts([host_id])
            if live and live[0]["alive"]:
                raise Conflict(f"id: host {host_id!r} is live (lease {live[0]['lease_ttl_ms']} ms left); "
                               "re-registering it takes its own node credential, or wait for the lease to "
                               "lapse", field="id")
    view = await b.register_host(body)
    view["node_credential"] = node_credential(request, view["id"])
    return ok(view, 201)


@routes.get(f"{API_PREFIX}/hosts")
async def list_hosts(request: web.Request) -> web.Response:
    """Every host: admins (and the bootstrap token during the compatibility window)."""
    who = require(request, Role.ADMIN, Role.NODE)
    if who.role == Role.NODE and (who.host is not None or not request.app[SETTINGS].node_token_any_host):
        raise Forbidden("a node reads only its own host: GET /api/v1/hosts/{id}", field="Authorization")
    return ok({"hosts": await request.app[BROKER].list_hosts(request.query.get("pool"))})


@routes.get(f"{API_PREFIX}/hosts/{{id}}")
async def get_host(request: web.Request) -> web.Response:
    require_host(request, request.match_info["id"], Role.ADMIN, Role.NODE)
    return ok(await request.app[BROKER].get_host(request.match_info["id"]))


@routes.put(f"{API_PREFIX}/hosts/{{id}}/heartbeat")
async def heartbeat(request: web.Request) -> web.Response:
    """Renew the lease; the reply carries a fresh ``node_credential`` when the one used is past half
    its life or was signed with an older key (or the caller used the bootstrap token)."""
    host_id = request.match_info["id"]
    who = require_host(request, host_id, Role.NODE)
    reply = await request.app[BROKER].heartbeat(host_id, await read_json(request))
    if needs_renewal(who, time.time(), request.app[SETTINGS].node_credential_ttl_s):
        reply["node_credential"] = node_credential(request, host_id)
    return ok(reply)


async def _drain_reason(request: web.Request) -> str:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise ValidationError("body: expected a JSON object", field="body")
    reason = body.get("reason", "")
    if not isinstance(reason, str) or len(reason) > DRAIN_REASON_MAX:
        raise ValidationError(f"reason: a string of at most {DRAIN_REASON_MAX} characters", field="reason")
    return reason


@routes.post(f"{API_PREFIX}/hosts/{{id}}/drain")
async def drain(request: web.Request) -> web.Response:
    """An admin, or the host's own node (its watchdog, a rolling restart), stops new sessions there."""
    who = require_host(request, request.match_info["id"], Role.ADMIN, Role.NODE)
    reason = await _drain_reason(request)
    return ok(await request.app[BROKER].set_host_state(who, request.match_info["id"], HostState.DRAINING, reason))


@routes.post(f"{API_PREFIX}/hosts/{{id}}/undrain")
async def undrain(request: web.Request) -> web.Response:
    who = require_host(request, request.match_info["id"], Role.ADMIN, Role.NODE)
    reason = await _drain_reason(request)
    return ok(await request.app[BROKER].set_host_state(who, request.match_info["id"], HostState.UP, reason))


@routes.delete(f"{API_PREFIX}/hosts/{{id}}")
async def remove_host(request: web.Request) -> web.Response:
    who = require_host(request, request.match_info["id"], Role.ADMIN, Role.NODE)
    force = request.query.get("force", "false").lower()
    if force not in ("true", "false"):
        raise ValidationError("force: must be true or false", field="force")
    ended = await request.app[BROKER].remove_host(who, request.match_info["id"], force == "true")
    return ok({"removed": request.match_info["id"], "ended_sessions": ended})


@routes.put(f"{API_PREFIX}/hosts/{{id}}/sessions/{{sid}}/state")
async def node_session_state(request: web.Request) -> web.Response:
    require_host(request, request.match_info["id"], Role.NODE)
    return ok(await request.app[BROKER].node_session_state(request.match_info["id"], request.match_info["sid"],
                                                           await read_json(request)))


# ---- sessions -------------------------------------------------------------------------------
@routes.post(f"{API_PREFIX}/sessions")
async def create_session(request: web.Request) -> web.Response:
    who = principal(request)
    created, view = await request.app[BROKER].create_session(who, await read_json(request))
    return ok(view, 201 if created else 200)


@routes.get(f"{API_PREFIX}/sessions")
async def list_sessions(request: web.Request) -> web.Response:
    who = principal(request)
    b = request.app[BROKER]
    if who.role == Role.NODE:
        raise Forbidden("nodes learn their sessions from heartbeats and commands")
    pool = request.query.get("pool")
    if who.role == Role.USER:  # the user's own index: cost follows the user's sessions, not the fleet
        live = [s for s in await b.live.get_sessions(await b.live.user_session_ids(who.name, pool))
                if s["user"] == who.name]
    else:
        live = await b.live.get_sessions(await b.live.live_session_ids())
    if pool:
        live = [s for s in live if s["pool"] == pool]
    return ok({"sessions": [await b.session_view(s["id"], s) for s in live]})


@routes.get(f"{API_PREFIX}/sessions/history")
async def session_history(request: web.Request) -> web.Response:
    who = principal(request)
    if who.role == Role.NODE:
        raise Forbidden("history is for users and admins")
    user = who.name if who.role == Role.USER else request.query.get("user")
    limit = query_int(request, "limit", 100, 1, 1000)
    rows = await request.app[BROKER].repo.session_history(request.query.get("pool"), user, limit)
    return ok({"sessions": rows})


@routes.get(f"{API_PREFIX}/sessions/{{sid}}")
async def get_session(request: web.Request) -> web.Response:
    who = principal(request)
    return ok(await request.app[BROKER].get_session(who, request.match_info["sid"]))


@routes.delete(f"{API_PREFIX}/sessions/{{sid}}")
async def end_session(request: web.Request) -> web.Response:
    who = principal(request)
    return ok(await request.app[BROKER].end_session(who, request.match_info["sid"]))


@routes.post(f"{API_PREFIX}/sessions/{{sid}}/leave")
async def leave_session(request: web.Request) -> web.Response:
    """The viewer's tab is closing on purpose (a keepalive fetch on pagehide): a short grace, not the full
    disconnect timeout.  ``?tab=`` names the tab; another tab holding the viewer makes it a no-op."""
    who = principal(request)
    tab = request.query.get("tab", "")
    if tab and not TAB_RE.match(tab):
        raise ValidationError("tab: 1 to 64 letters, digits, '-' or '_'", field="tab")
    return ok(await request.app[BROKER].leave_session(who, request.match_info["sid"], tab))


# ---- admin ----------------------------------------------------------------------------------
@routes.get(f"{API_PREFIX}/audit")
async def audit_log(request: web.Request) -> web.Response:
    require(request, Role.ADMIN)
    limit = query_int(request, "limit", 100, 1, 1000)
    before = request.query.get("before_id")
    before_id = query_int(request, "before_id", 0, 0, 2**62) if before else None
    rows = await request.app[BROKER].repo.audit_log(limit, before_id, request.query.get("action"))
    return ok({"entries": rows})


@routes.get("/healthz")
async def healthz(_request: web.Request) -> web.Response:
    return ok({"status": "alive"})


@routes.get("/readyz")
async def readyz(request: web.Request) -> web.Response:
    b = request.app[BROKER]
    checks: dict[str, str] = {}
    try:
        await b.live.ping()
        checks["redis"] = "ok"
        # live state: this process's generation still in Redis (absent: Redis lost it and the
        # reaper is restoring pools from SQL; another: a peer restored it, this one joins next pass)
        epoch = await b.live.get_epoch()
        checks["live_state"] = ("recovering" if b.recovering else "ok" if epoch is not None and epoch == b.epoch
                                else "lost: restoring from SQL" if epoch is None else "new generation: joining")
    except Exception as exc:  # readiness reports, never raises
        checks["redis"] = f"unavailable: {type(exc).__name__}"
    try:
        await b.repo.ping()
        checks["sql"] = "ok"
    except Exception as exc:  # readiness reports, never raises
        checks["sql"] = f"unavailable: {type(exc).__name__}"
    ready = all(v == "ok" for v in checks.values())
    return ok({"status": "ready" if ready else "not_ready", "checks": checks}, 200 if ready else 503)


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    check_metrics(request)
    b, m = request.app[BROKER], request.app[METRICS]
    try:
        pools = await b.list_pools()
        m.update_pools(pools)
        m.update_queue_waits(await b.live.queue_waits([p["name"] for p in pools]))
        hosts = await b.live.get_hosts(await b.live.host_ids())
        m.update_streams(hosts)
        m.update_gpus(hosts)
        m.update_watchdogs(hosts)
    except (RedisError, OSError):  # Redis down: still serve process counters
        pass
    return web.Response(body=m.render(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
