"""REST handlers for scaling plans, the autoscaler's view and pool sizing (``plan_routes``).

- ``PUT/GET/DELETE /api/v1/pools/{name}/plan`` (admin): a pool's scaling plan, validated by
  ``broker.autoscale.plans.PLAN_SCHEMA`` (nothing is stored when it is invalid), kept in SQL, audited.
  A pool is autoscaled while it has a plan (``mode``: reactive, or predictive with its
  ``predictive`` margin settings); DELETE turns autoscaling off and undrains the hosts the
  autoscaler had drained.
- ``GET /api/v1/pools/{name}/autoscale`` (admin): current phase, persisted state, the last
  evaluation and the latest decisions with their reasons and, for predictive plans, the numbers
  behind them (forecast, margin, actual) (``?limit=50``).
- ``POST /api/v1/pools/{name}/simulate`` (admin): always-on vs the plan vs a recommended plan,
  each also as a multiple of the packing oracle's and the lower bound's host-hours,
  over the pool's SQL history or a synthetic week (``broker.autoscale.scaler.SIMULATE_SCHEMA``); the
  simulation runs in an executor thread.
- ``GET /api/v1/pools/{name}/recommendation`` (admin): the latest stored recommendation, or 404.

Handlers only authenticate, parse and call `broker.autoscale.scaler.Scaler`; errors are domain errors
mapped by the app's problem middleware.
"""

from __future__ import annotations

from aiohttp import web

from broker.autoscale.scaler import Scaler
from broker.http.api import ok, query_int, read_json, require
from broker.keys_app import BROKER
from broker.protocol import API_PREFIX, Role

plan_routes = web.RouteTableDef()
SCALER = web.AppKey("scaler", Scaler)

_POOL = f"{API_PREFIX}/pools/{{name}}"


@plan_routes.put(f"{_POOL}/plan")
async def put_plan(request: web.Request) -> web.Response:
    who = require(request, Role.ADMIN)
    created, view = await request.app[SCALER].put_plan(who, request.match_info["name"], await read_json(request))
    return ok(view, 201 if created else 200)


@plan_routes.get(f"{_POOL}/plan")
async def get_plan(request: web.Request) -> web.Response:
    require(request, Role.ADMIN)
    return ok(await request.app[SCALER].get_plan(request.match_info["name"]))


@plan_routes.delete(f"{_POOL}/plan")
async def delete_plan(request: web.Request) -> web.Response:
    who = require(request, Role.ADMIN)
    await request.app[SCALER].delete_plan(who, request.match_info["name"])
    return web.Response(status=204)


@plan_routes.get(f"{_POOL}/autoscale")
async def autoscale_status(request: web.Request) -> web.Response:
    require(request, Role.ADMIN)
    cfg = await request.app[BROKER].get_pool(request.match_info["name"])
    limit = query_int(request, "limit", 50, 1, 500)
    return ok(await request.app[SCALER].status(cfg.name, limit))


@plan_routes.post(f"{_POOL}/simulate")
async def simulate_pool(request: web.Request) -> web.Response:
    who = require(request, Role.ADMIN)
    return ok(await request.app[SCALER].simulate(who, request.match_info["name"], await read_json(request)))


@plan_routes.get(f"{_POOL}/recommendation")
async def recommendation(request: web.Request) -> web.Response:
    require(request, Role.ADMIN)
    return ok(await request.app[SCALER].recommendation(request.match_info["name"]))
