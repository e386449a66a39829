"""The OpenAPI 3.1 document, built from the live route table and the request schemas.

Every route the app serves appears (a test checks none is missing); request
bodies come from the same ``broker.validate`` schemas the handlers enforce.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from broker.autoscale.plans import PLAN_SCHEMA
from broker.autoscale.scaler import SIMULATE_SCHEMA
from broker.models import (
    CONTROL_SCHEMA,
    HEARTBEAT_SCHEMA,
    HOST_SCHEMA,
    POOL_SCHEMA,
    SESSION_SCHEMA,
    SESSION_STATE_SCHEMA,
    SHARE_SCHEMA,
    TOKEN_SCHEMA,
)
from broker.protocol import API_PREFIX, all_constants
from broker.rollout.policy import POLICY_SCHEMA
from broker.validate import Schema, to_json_schema

A = API_PREFIX
# (method, path) -> (summary, roles, body schema or None)
DOCS: dict[tuple[str, str], tuple[str, str, Schema | None]] = {
    ("POST", f"{A}/tokens"): ("Mint a user token (HMAC-signed, expiring)", "admin", TOKEN_SCHEMA),
    ("POST", f"{A}/guest"): ("Mint a short guest token when the broker allows guests", "none", None),
    ("GET", f"{A}/whoami"): ("The caller's role and name", "any", None),
    ("GET", f"{A}/pools"): ("Pools with live seats used/free and queue length", "any", None),
    ("GET", f"{A}/pools/{{name}}"): ("One pool with live seats and queue", "any", None),
    ("PUT", f"{A}/pools/{{name}}"): ("Create or replace a pool", "admin", POOL_SCHEMA),
    ("DELETE", f"{A}/pools/{{name}}"): ("Delete an empty pool", "admin", None),
    ("GET", f"{A}/pools/{{name}}/samples"): ("Utilization samples (?hours=24)", "admin", None),
    ("PUT", f"{A}/pools/{{name}}/plan"): ("Set the pool's scaling plan, reactive or predictive (turns "
                                          "autoscaling on; audited)", "admin", PLAN_SCHEMA),
    ("GET", f"{A}/pools/{{name}}/plan"): ("The pool's scaling plan and its current phase", "admin", None),
    ("DELETE", f"{A}/pools/{{name}}/plan"): ("Remove the plan: autoscaling off, autoscaler-drained hosts undrained",
                                            "admin", None),
    ("GET", f"{A}/pools/{{name}}/autoscale"): ("Autoscaler phase, state and latest decisions with reasons (?limit)",
                                              "admin", None),
    ("POST", f"{A}/pools/{{name}}/simulate"): ("Simulate always-on vs plan vs recommended plan (history or "
                                              "synthetic demand), host-hours vs the packing oracle and lower bound",
                                              "admin", SIMULATE_SCHEMA),
    ("GET", f"{A}/pools/{{name}}/recommendation"): ("The latest pool-sizing recommendation", "admin", None),
    ("PUT", f"{A}/pools/{{name}}/rollout"): ("Start or restart a canary rollout: a share of new sessions on hosts of "
                                             "a candidate version, judged for promote/rollback (audited)", "admin",
                                             POLICY_SCHEMA),
    ("GET", f"{A}/pools/{{name}}/rollout"): ("The rollout: policy, state, seating split, hosts by version class, "
                                             "latest verdict with its figures", "admin", None),
    ("DELETE", f"{A}/pools/{{name}}/rollout"): ("Stop the rollout without a verdict (drained hosts stay drained)",
                                                "admin", None),
    ("POST", f"{A}/pools/{{name}}/rollout/promote"): ("Promote the candidate now (body {reason}, audited)", "admin",
                                                      None),
    ("POST", f"{A}/pools/{{name}}/rollout/rollback"): ("Roll back now: drain the candidate's hosts (body {reason}, "
                                                       "audited)", "admin", None),
    ("POST", f"{A}/hosts"): ("Register a render node and its GPUs; answers a credential bound to the host id",
                              "node (shared token or the host's credential)", HOST_SCHEMA),
    ("GET", f"{A}/hosts"): ("Hosts with GPU telemetry (?pool=)", "admin", None),
    ("GET", f"{A}/hosts/{{id}}"): ("One host", "admin, that host's node", None),
    ("PUT", f"{A}/hosts/{{id}}/heartbeat"): ("Renew the host lease; report telemetry and sessions", "node",
                                             HEARTBEAT_SCHEMA),
    ("POST", f"{A}/hosts/{{id}}/drain"): ("Stop placing new sessions on the host (body {reason}, audited)",
                                           "admin, that host's node", None),
    ("POST", f"{A}/hosts/{{id}}/undrain"): ("Place sessions on the host again", "admin, that host's node", None),
    ("DELETE", f"{A}/hosts/{{id}}"): ("Deregister a host (?force=true ends its sessions)",
                                     "admin, that host's node", None),
    ("PUT", f"{A}/hosts/{{id}}/sessions/{{sid}}/state"): ("Node reports a session running/disconnected/ended",
                                                          "node", SESSION_STATE_SCHEMA),
    ("GET", f"{A}/hosts/{{id}}/commands"): ("WebSocket: commands for the node (start/stop/warn/signal)", "node",
                                            None),
    ("POST", f"{A}/sessions"): ("Request a session: seated (201), queued (201) or your live one (200)", "user",
                                SESSION_SCHEMA),
    ("GET", f"{A}/sessions"): ("Live sessions (a user sees their own)", "user, admin", None),
    ("GET", f"{A}/sessions/history"): ("Ended sessions from SQL", "user, admin", None),
    ("GET", f"{A}/sessions/{{sid}}"): ("One session with queue position or signaling details", "owner, admin",
                                       None),
    ("DELETE", f"{A}/sessions/{{sid}}"): ("End or cancel a session", "owner, admin", None),
    ("POST", f"{A}/sessions/{{sid}}/leave"): ("The viewer's tab is closing on purpose (?tab=): once disconnected "
                                              "the seat is kept close_grace_s, not disconnect_timeout_s",
                                              "owner, admin", None),
    ("GET", f"{A}/sessions/{{sid}}/events"): ("Server-Sent Events: state and queue position changes",
                                              "owner, admin", None),
    ("GET", f"{A}/sessions/{{sid}}/signal"): ("WebSocket: WebRTC signaling relayed to the session's node",
                                              "owner", None),
    ("POST", f"{A}/sessions/{{sid}}/shares"): ("Create a view-only share link: a token scoped to the session "
                                               "(an admin's link shadows the session: audited, announced to the "
                                               "owner where the pool says so)", "owner, admin", SHARE_SCHEMA),
    ("GET", f"{A}/sessions/{{sid}}/shares"): ("The session's live share links with their viewers connected",
                                              "owner, admin", None),
    ("DELETE", f"{A}/sessions/{{sid}}/shares"): ("Stop sharing: revoke every link, disconnect their viewers",
                                                 "owner, admin", None),
    ("DELETE", f"{A}/sessions/{{sid}}/shares/{{share}}"): ("Revoke one share link, disconnect its viewers",
                                                           "owner, admin", None),
    ("POST", f"{A}/sessions/{{sid}}/control"): ("Hand control to one connected share viewer (its input is applied "
                                                "besides the owner's; audited)", "owner, admin", CONTROL_SCHEMA),
    ("DELETE", f"{A}/sessions/{{sid}}/control"): ("Take control back from the viewer that has it (audited)",
                                                  "owner, admin", None),
    ("GET", f"{A}/sessions/{{sid}}/watch"): ("WebSocket: a share viewer's signaling (?access_token=<share token>)",
                                             "share token", None),
    ("GET", f"{A}/audit"): ("Audit log, newest first (?limit, ?before_id, ?action)", "admin", None),
    ("GET", f"{A}/openapi.json"): ("This document", "none", None),
    ("GET", "/healthz"): ("Process is alive", "none", None),
    ("GET", "/readyz"): ("Redis and SQL reachable", "none", None),
    ("GET", "/metrics"): ("Prometheus metrics", "none", None),
}

JSON_OK: dict[str, Any] = {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}
CREATED: dict[str, Any] = {"description": "Created", "content": {"application/json": {"schema": {"type": "object"}}}}
NO_CONTENT: dict[str, Any] = {"description": "Done (no body)"}
# Success responses where they are not "200 with a JSON object"
SUCCESS: dict[tuple[str, str], dict[str, Any]] = {
    **{k: {"201": CREATED} for k in (("POST", f"{A}/tokens"), ("POST", f"{A}/guest"), ("POST", f"{A}/hosts"),
                                     ("POST", f"{A}/sessions/{{sid}}/shares"))},
    **{k: {"200": JSON_OK, "201": CREATED} for k in (
        ("PUT", f"{A}/pools/{{name}}"), ("POST", f"{A}/sessions"), ("PUT", f"{A}/pools/{{name}}/plan"),
        ("PUT", f"{A}/pools/{{name}}/rollout"))},
    **{k: {"204": NO_CONTENT} for k in (("DELETE", f"{A}/pools/{{name}}"), ("DELETE", f"{A}/pools/{{name}}/plan"),
                                        ("DELETE", f"{A}/pools/{{name}}/rollout"))},
    ("GET", f"{A}/sessions/{{sid}}/events"): {"200": {"description": "An event stream", "content": {
        "text/event-stream": {"schema": {"type": "string"}}}}},
    **{k: {"101": {"description": "Switching to a WebSocket"}} for k in (
        ("GET", f"{A}/sessions/{{sid}}/signal"), ("GET", f"{A}/hosts/{{id}}/commands"),
        ("GET", f"{A}/sessions/{{sid}}/watch"))},
    ("GET", "/metrics"): {"200": {"description": "Prometheus text exposition", "content": {
        "text/plain": {"schema": {"type": "string"}}}}},
}

PROBLEM = {"type": "object", "properties": {
    "type": {"type": "string"}, "title": {"type": "string"}, "status": {"type": "integer"},
    "code": {"type": "string"}, "detail": {"type": "string"}, "field": {"type": "string"}}}


def openapi_document(router: web.UrlDispatcher) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in router.routes():
        info = route.resource.get_info() if route.resource else {}
        path = info.get("path") or info.get("formatter")
        if not path or route.method in ("HEAD", "*") or not (path.startswith("/api/") or path in
                                                              ("/healthz", "/readyz", "/metrics")):
            continue
        summary, roles, schema = DOCS.get((route.method, path), ("", "", None))
        op: dict[str, Any] = {
            "summary": summary, "description": f"Authorization: {roles}",
            "responses": {"default": {"description": "Problem", "content": {
                "application/problem+json": {"schema": PROBLEM}}},
                          **SUCCESS.get((route.method, path), {"200": JSON_OK})},
        }
        params = [p.strip("{}") for p in path.split("/") if p.startswith("{")]
        if params:
            op["parameters"] = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                                for p in params]
        if schema is not None:
            op["requestBody"] = {"required": True, "content": {"application/json": {
                "schema": to_json_schema(schema)}}}
        if roles not in ("none", ""):
            op["security"] = [{"bearer": []}]
        paths.setdefault(path, {})[route.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "render-broker", "version": "1",
                 "description": "GPU render session broker. Constants: see x-constants."},
        "paths": dict(sorted(paths.items())),
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "x-constants": all_constants(),
    }
