"""Composition root: ``create_app(settings)`` wires every resource of a broker process.

Resources are aiohttp cleanup contexts in dependency order: Redis (embedded
or external) -> SQL (migrated) -> broker service + pub/sub hub + background
loops.  Each is torn down in reverse on shutdown, so an embedded redis-server
never outlives the broker (nor do render nodes the autoscaler's local provider
started: the provider is closed after the loops stop).  No module-level mutable
state: everything hangs off the app under typed ``web.AppKey``s
(``broker.keys_app``; the autoscaler's is ``broker.http.plans.SCALER``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import redis.asyncio as aioredis
import redis.exceptions as redis_errors
from aiohttp import web
from redis.asyncio.sentinel import Sentinel
from sqlalchemy.exc import DBAPIError, OperationalError

from broker.autoscale.providers import provider_from_settings
from broker.autoscale.scaler import Scaler
from broker.db.engine import create_engine, migrate
from broker.db.repository import Repository
from broker.embedded import EmbeddedRedis
from broker.errors import BrokerError, MalformedBody, NotFound, Unavailable
from broker.http import realtime, shares  # noqa: F401  (register their routes on broker.http.api.routes)
from broker.http.api import path_params_middleware, routes
from broker.http.edge import EDGE, Edge, parse_listen
from broker.http.openapi import openapi_document
from broker.http.plans import SCALER, plan_routes
from broker.http.rollout import ROLLOUTS, rollout_routes
from broker.hub import Hub
from broker.keys_app import BROKER, HUB, METRICS, SETTINGS
from broker.metrics import Metrics
from broker.rollout.service import Rollouts
from broker.service import Broker, Clock, run_every, wall_clock_ms
from broker.settings import BrokerSettings
from broker.store.live import LiveStore

log = logging.getLogger(__name__)

WEB_DIR = Path(__file__).resolve().parent.parent / "web"
REDIS_KEY = web.AppKey("redis", aioredis.Redis)
OUTBOX_INTERVAL_S = 0.5
LOOP_STOP_TIMEOUT_S = 5.0  # a loop mid-step gets this long to finish before it is cancelled


def _problem_response(err: BrokerError, metrics: Metrics) -> web.Response:
    metrics.http_errors.labels(str(err.status), err.code).inc()
    return web.json_response(err.problem(), status=err.status, content_type="application/problem+json")


@web.middleware
async def problem_middleware(request: web.Request,
                             handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    metrics = request.app[METRICS]
    try:
        resp = await handler(request)
    except BrokerError as err:
        return _problem_response(err, metrics)
    except (ConnectionResetError, BrokenPipeError):
        raise  # the client went away mid-response (aiohttp's reset errors too): not the store's fault
    except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as exc:
        log.warning("redis unavailable during %s %s: %s", request.method, request.path, exc)
        return _problem_response(Unavailable("live state store (Redis) is unavailable; retry shortly"), metrics)
    except (OperationalError, DBAPIError) as exc:
        log.warning("SQL unavailable during %s %s: %s", request.method, request.path, exc)
        return _problem_response(Unavailable("history database is unavailable; retry shortly"), metrics)
    except web.HTTPException as exc:
        if exc.status >= 400 and request.path.startswith("/api/"):
            cls = NotFound if exc.status == 404 else MalformedBody
            err = cls(exc.reason or "error")
            err.status = exc.status
            err.code = "not_found" if exc.status == 404 else f"http_{exc.status}"
            return _problem_response(err, metrics)
        raise
    metrics.http_requests.labels(request.method, str(resp.status)).inc()
    return resp


async def _redis_ctx(app: web.Application) -> AsyncIterator[None]:
    s = app[SETTINGS]
    embedded = None
    pool = None
    if s.redis_sentinels:
        client = sentinel_client(s)
        log.info("Redis through sentinels %s, master %r", ", ".join(s.redis_sentinels), s.redis_sentinel_master)
    else:
        client, pool, embedded = await _url_client(s)
    app[REDIS_KEY] = client
    try:
        yield
    finally:
        await client.aclose()
        if pool is not None:
            await pool.aclose()
        if embedded:
            await embedded.stop()


async def _url_client(s: BrokerSettings) -> tuple[aioredis.Redis, aioredis.BlockingConnectionPool,
                                                  EmbeddedRedis | None]:
    """A client of ``redis_url`` (or of an embedded redis-server started here when it is empty)."""
    embedded = None
    url = s.redis_url
    if not url:
        embedded = EmbeddedRedis(Path(s.data_dir) / "redis")
        url = await embedded.start()
        log.info("started embedded redis-server at %s", url)
    # A blocking pool: a burst of requests waits for a free connection instead of failing.  Every
    # request and loop step is one or two round trips (one Lua step each); a connection is held for
    # the round trip plus the event loop's delay in resuming the caller, which under load is the
    # larger part (in flight = calls/s x that), so the pool is sized for a lagging loop, not for
    # Redis: 64 ran out at 2,000 hosts and failed heartbeats (docs/fleet.md).  hiredis parses.
    pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=s.redis_max_connections,
                                                    timeout=s.redis_pool_timeout_s,
                                                    socket_timeout=s.redis_timeout_s,
                                                    socket_connect_timeout=s.redis_timeout_s,
                                                    health_check_interval=10)
    return aioredis.Redis(connection_pool=pool), pool, embedded


def sentinel_client(s: BrokerSettings) -> aioredis.Redis:
    """A client of the master the sentinels name: each new connection asks them where it is, so after a
    failover the broker's next calls reach the promoted replica (calls in flight fail with a 503 and the
    pub/sub hub reconnects).  Same timeouts and pool size as a plain URL."""
    addresses = [a for a in (parse_listen(item, "redis_sentinels") for item in s.redis_sentinels) if a]
    timeouts = {"socket_timeout": s.redis_timeout_s, "socket_connect_timeout": s.redis_timeout_s}
    sentinel = Sentinel(addresses, sentinel_kwargs=timeouts, **timeouts)
    client: aioredis.Redis = sentinel.master_for(s.redis_sentinel_master, max_connections=s.redis_max_connections,
                                                 health_check_interval=10)
    return client


def _database_url(s: BrokerSettings) -> str:
    if s.database_url:
        return s.database_url
    path = Path(s.data_dir)
    path.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(path / 'broker.db').resolve()}"


def _tune_gc(thresholds: str) -> None:
    """Collect young objects less often: each request's objects die young, and promoting the ones
    caught in flight is what triggered full collections (0.4-1.1 s stalls at 1,000 hosts with
    Python's defaults, docs/fleet.md)."""
    if thresholds.strip():
        gen0, gen1, gen2 = (int(x) for x in thresholds.split(","))
        gc.set_threshold(gen0, gen1, gen2)


def make_ctx(clock: Clock) -> Callable[[web.Application], AsyncIterator[None]]:
    async def _broker_ctx(app: web.Application) -> AsyncIterator[None]:
        s = app[SETTINGS]
        engine = create_engine(_database_url(s))
        await migrate(engine)
        live = LiveStore(app[REDIS_KEY], s.redis_prefix)
        metrics = app[METRICS]
        broker = Broker(s, live, Repository(engine), clock, metrics.allocation.observe,
                        on_start_timeout=metrics.start_timed_out)
        app[BROKER] = broker
        hub = Hub(app[REDIS_KEY], s.redis_prefix)
        app[HUB] = hub
        await hub.start()
        restored = await broker.restore_pools()
        if restored:
            log.info("restored %d pool config(s) from SQL into Redis", restored)
        await broker.ensure_indexes()
        await broker.state_check()  # joins this Redis's live-state generation (or starts one: a recovery)
        _tune_gc(s.gc_thresholds)
        owner = uuid.uuid4().hex
        provider = provider_from_settings(s)
        scaler = Scaler(broker, provider, s, owner)
        app[SCALER] = scaler
        rollouts = Rollouts(broker, metrics.registry, owner, s.rollout_interval_s)
        app[ROLLOUTS] = rollouts

        async def sample() -> None:
            # one replica samples per interval: a TTL'd lock keyed by the interval slot
            slot = int(time.time() // s.sample_interval_s)
            if await live.try_lock(f"sample:{slot}", owner, int(s.sample_interval_s * 2000)):
                await broker.sample_once()

        stop = asyncio.Event()
        tasks = [asyncio.create_task(run_every(s.reaper_interval_s, broker.reap_once, "reaper", stop,
                                               on_late=broker.note_loop_lag)),
                 asyncio.create_task(run_every(OUTBOX_INTERVAL_S, broker.drain_outbox, "outbox", stop)),
                 asyncio.create_task(run_every(s.sample_interval_s, sample, "sampler", stop))]
        if s.rollout_interval_s > 0:
            tasks.append(asyncio.create_task(run_every(s.rollout_interval_s, rollouts.run_once, "rollout", stop)))
        if s.autoscale_interval_s > 0:
            tasks.append(asyncio.create_task(run_every(s.autoscale_interval_s, scaler.run_once, "autoscaler", stop)))
        try:
            yield
        finally:
            stop.set()
            _done, pending = await asyncio.wait(tasks, timeout=LOOP_STOP_TIMEOUT_S)
            for t in pending:
                t.cancel()
            for t in pending:
                with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                    await asyncio.wait_for(t, 1.0)
            with contextlib.suppress(Exception):
                await broker.drain_outbox()  # flush what ended during shutdown
            try:
                await provider.close()  # a local provider stops the render nodes it started
            except Exception:  # shutdown boundary: log and go on releasing the rest
                log.exception("host provider %s did not close cleanly", provider.name)
            await hub.stop()
            await engine.dispose()

    return _broker_ctx


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document(request.app.router))


async def index(_request: web.Request) -> web.StreamResponse:
    page = WEB_DIR / "index.html"
    if not page.exists():
        return web.json_response({"service": "render-broker", "api": "/api/v1", "openapi": "/api/v1/openapi.json"})
    return web.FileResponse(page)


async def admin_page(_request: web.Request) -> web.StreamResponse:
    """``/admin`` (what people type) reaches the dashboard page."""
    raise web.HTTPFound("/web/admin.html")


def create_app(settings: BrokerSettings, *, clock: Clock = wall_clock_ms) -> web.Application:
    """Build a broker application; resources start when the app starts."""
    app = web.Application(middlewares=[problem_middleware, path_params_middleware],
                          client_max_size=settings.max_body_bytes)
    app[SETTINGS] = settings
    app[METRICS] = Metrics()
    app[EDGE] = Edge.from_settings(settings)
    app.cleanup_ctx.append(_redis_ctx)
    app.cleanup_ctx.append(make_ctx(clock))
    app.router.add_get("/api/v1/openapi.json", openapi)
    app.router.add_routes(routes)
    app.router.add_routes(plan_routes)
    app.router.add_routes(rollout_routes)
    app.router.add_get("/", index)
    app.router.add_get("/admin", admin_page)
    if WEB_DIR.is_dir():
        app.router.add_static("/web/", WEB_DIR, show_index=False)
    return app
