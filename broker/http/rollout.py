"""REST handlers for canary rollouts (``rollout_routes``), all admin-only and audited.

- ``PUT /api/v1/pools/{name}/rollout``: start or restart a rollout (``broker.rollout.policy.POLICY_SCHEMA``;
  a 422 names the field and stores nothing); a restart opens a fresh judging window.
- ``GET /api/v1/pools/{name}/rollout``: policy, state, seating split, hosts by version class, latest verdict.
- ``DELETE /api/v1/pools/{name}/rollout``: stop without a verdict.
- ``POST /api/v1/pools/{name}/rollout/promote`` and ``.../rollback`` (optional ``{"reason"}``): an admin's word.

Handlers only authenticate, parse and call `broker.rollout.service.Rollouts`.
"""

from __future__ import annotations

from aiohttp import web

from broker.http.api import ok, read_json, require
from broker.protocol import API_PREFIX, Role
from broker.rollout.service import Rollouts

rollout_routes = web.RouteTableDef()
ROLLOUTS = web.AppKey("rollouts", Rollouts)

_URL = f"{API_PREFIX}/pools/{{name}}/rollout"


async def _optional_json(request: web.Request) -> object:
    return await read_json(request) if request.can_read_body else {}


@rollout_routes.put(_URL)
async def put_rollout(request: web.Request) -> web.Response:
    who = require(request, Role.ADMIN)
    created, view = await request.app[ROLLOUTS].put(who, request.match_info["name"], await read_json(request))
    return ok(view, 201 if created else 200)


@rollout_routes.get(_URL)
async def get_rollout(request: web.Request) -> web.Response:
    require(request, Role.ADMIN)
    return ok(await request.app[ROLLOUTS].get(request.match_info["name"]))


@rollout_routes.delete(_URL)
async def delete_rollout(request: web.Request) -> web.Response:
    who = require(request, Role.ADMIN)
    await request.app[ROLLOUTS].delete(who, request.match_info["name"])
    return web.Response(status=204)


@rollout_routes.post(f"{_URL}/promote")
async def promote(request: web.Request) -> web.Response:
    who = require(request, Role.ADMIN)
    return ok(await request.app[ROLLOUTS].admin_decision(who, request.match_info["name"], "promote",
                                                         await _optional_json(request)))


@rollout_routes.post(f"{_URL}/rollback")
async def rollback(request: web.Request) -> web.Response:
    who = require(request, Role.ADMIN)
    return ok(await request.app[ROLLOUTS].admin_decision(who, request.match_info["name"], "rollback",
                                                         await _optional_json(request)))
