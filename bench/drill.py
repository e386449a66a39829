"""Stability drills: inject a fault into a running local fleet and print what fired, what drained,
the sessions lost and the time to detect.

    python bench/drill.py [--drill node-killed|hot-gpu|vram-leak|encoder-failing|broker-killed|all] [--json]

The lab (all on this machine, all real): a redis-server on a free port, two broker replicas
(``python -m broker serve``) sharing it and one SQLite file, short leases (host lease 3 s, nodes
heartbeat every 0.5 s), and per drill a fresh ``game`` pool with two render nodes and sessions
seated through the public API (built-in game, 320x240 at 15 fps, no viewer).  Nodes are
``render-node`` processes where the drill kills them, and in-process ``NodeAgent``s where the drill
replaces what they read (a stub NVML reading, a failing encoder).

Drills (run in this order by ``all``; broker-killed last, as it takes a replica away):

- ``node-killed``: SIGKILL a node with seated sessions.  Detected when the broker marks the host
  down (its lease expires); its sessions end ``host_lost`` (expected); the other node's must not.
- ``hot-gpu``: the victim's GPU reading says 95 C (``NodeAgent.read_gpus`` replaced, as NVML would
  report it); its watchdog drains the host at the next heartbeat.  Its sessions keep running.
- ``vram-leak``: the victim's GPU memory reading grows by 3 GiB while its session count stays the
  same (a session or the driver leaking); its watchdog drains the host.
- ``encoder-failing``: the victim's encoder raises on every frame; its stream self-test (run now,
  as its interval would; the victim is idle) fails and the watchdog drains the host.
- ``redis-frozen``: SIGSTOP the redis-server for ``REDIS_FREEZE_S`` (past the brokers' 1 s Redis timeout,
  under the host lease), then SIGCONT.  Requests meanwhile get 503 within the timeout; no host may be
  declared down for the outage and no session may end.
- ``redis-lost``: SIGKILL the redis-server and start an empty one on its port (no persistence, or a
  failover that lost its writes).  The brokers see the live state gone (the epoch key), restore pools
  from SQL, and the nodes re-register with the sessions they still stream: every session must come
  back on its host.  "Recovered": both replicas ready, every drill session back, a new seat works.
- ``broker-killed``: SIGKILL one broker replica; the other serves on (nodes heartbeat to it, users
  create sessions through it).  Detected when the killed replica stops answering (what
  ``RenderBrokerDown`` watches: its /metrics scrape fails).

"What fired": the alert rules (``infra/prometheus/render-broker.rules.yml``) whose condition holds
on the surviving replica's /metrics after the drill (before their ``for:`` hold), plus the watchdog
or broker audit entries.  "Lost": the drill's sessions that ended, on the victim host (expected for
a killed node) and elsewhere (the goal is 0); "seats leaked": the pool's seats in use beyond its live
seated sessions afterwards (goal 0); during the Redis drills a client reads the pool and its sessions
every 50 ms, and the requests it made and the 5xx it got are counted.  Times are from the injection to
the first poll (every 100 ms) that shows the change.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp

from broker.embedded import free_port
from streamer.node.agent import NodeAgent
from streamer.node.settings import NodeSettings

DRILLS = ("node-killed", "hot-gpu", "vram-leak", "encoder-failing", "redis-frozen", "redis-lost", "broker-killed")
REDIS_FREEZE_S = 2.0  # SIGSTOP this long: past the brokers' 1 s Redis timeout, under the 3 s lease
LEASE_S = 3.0  # the brokers' host lease: a killed node is down within this (+ a reaper pass)
HEARTBEAT_S = 0.5
POLL_S = 0.1
DETECT_TIMEOUT_S = 30.0
SETTLE_S = 2.0  # after detection: time for collateral damage to show
PROFILE = {"width": 320, "height": 240, "fps": 15}
SEATS = 2  # sessions per node (the pool's max_sessions_per_gpu; nodes have one software-encode "GPU")

Series = list[tuple[dict[str, str], float]]
# alert -> (metric, its condition on one series); a drill counts the series of its own pool only
ALERTS: dict[str, tuple[str, Callable[[dict[str, str], float], bool]]] = {
    "RenderBrokerHostDown": ("render_broker_hosts", lambda lab, v: lab.get("state") == "down" and v > 0),
    "RenderBrokerHostsDraining": ("render_broker_hosts", lambda lab, v: lab.get("state") == "draining" and v > 0),
    "RenderBrokerGpuHot": ("render_broker_gpu_temperature_celsius", lambda _lab, v: v > 85),
    "RenderBrokerGpuOverheating": ("render_broker_gpu_temperature_celsius", lambda _lab, v: v > 92),
    "RenderBrokerGpuThrottled": ("render_broker_gpu_throttled",
                                 lambda lab, v: v > 0 and lab.get("reason") in ("hw_thermal", "sw_thermal",
                                                                                 "hw_slowdown", "hw_power_brake")),
    "RenderBrokerNodeWatchdogDrained": ("render_broker_node_watchdog_tripped", lambda _lab, v: v == 1),
    "RenderBrokerNodeWatchdogHeld": ("render_broker_node_watchdog_held", lambda _lab, v: v == 1),
}


@dataclass
class DrillResult:
    drill: str
    victim: str
    pool: str
    detected: str = ""  # what showed the fault
    detect_s: float | None = None
    fired: list[str] = field(default_factory=list)
    drained: dict[str, str] = field(default_factory=dict)  # host -> reason
    sessions: int = 0
    lost_on_victim: int = 0
    lost_elsewhere: int = 0  # goal 0
    encoder_errors: float | None = None  # the victim's render_broker_encoder_errors_total (None: not exported)
    notes: str = ""
    requests: int = 0  # API requests a client made from the injection to the tally
    errors_5xx: int = 0  # of those, answered 5xx (or not answered)
    seats_leaked: int = 0  # the pool's seats in use beyond its live seated sessions, after the drill (goal 0)
    recover_s: float | None = None  # from the end of the fault to a working system (Redis drills)


def parse_metrics(text: str) -> dict[str, Series]:
    out: dict[str, Series] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+)(?:\{(.*)\})? (\S+)$", line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        out.setdefault(m.group(1), []).append((labels, float(m.group(3))))
    return out


class Lab:
    """Redis, two broker replicas, and the nodes and sessions of each drill; ``close`` stops everything."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.admin, self.node_token, self.secret = (secrets.token_hex(16) for _ in range(3))
        self.redis_port = free_port()
        self.ports = [free_port(), free_port()]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.agents: list[tuple[NodeAgent, asyncio.Task[None]]] = []
        self.http: aiohttp.ClientSession | None = None
        self.logs: list[Any] = []

    @property
    def api(self) -> aiohttp.ClientSession:
        assert self.http is not None
        return self.http

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "wb")  # closed in close()
        self.logs.append(log)
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
        self.procs[name] = proc
        return proc

    async def start(self) -> None:
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        self._spawn("redis", ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", str(self.tmp)])
        for i, port in enumerate(self.ports):
            self._spawn(f"broker{i}", [
                sys.executable, "-m", "broker", "serve", "--port", str(port),
                "--redis-url", f"redis://127.0.0.1:{self.redis_port}/0",
                "--database-url", f"sqlite:///{self.tmp / 'broker.db'}", "--data-dir", str(self.tmp / f"b{i}"),
                "--admin-token", self.admin, "--node-token", self.node_token, "--secret", self.secret,
                "--host-lease-ttl-s", str(LEASE_S), "--reaper-interval-s", "0.2", "--autoscale-interval-s", "0",
                "--sample-interval-s", "3600"])
            await self.until(functools.partial(self._ready, self.urls[i]), f"broker {i} not ready", 60)

    async def _ready(self, url: str) -> bool:
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with self.api.get(url + "/readyz") as r:
                return r.status == 200
        return False

    async def until(self, check: Callable[[], Awaitable[bool]], what: str,
                    timeout_s: float = DETECT_TIMEOUT_S) -> float:
        """Poll ``check`` every ``POLL_S`` until true; seconds it took.  Raises TimeoutError naming ``what``."""
        t0 = time.monotonic()
        while not await check():
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(what)
            await asyncio.sleep(POLL_S)
        return time.monotonic() - t0

    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin}"}

    async def call(self, method: str, path: str, url: str | None = None, token: str | None = None,
                   body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token or self.admin}"}
        async with self.api.request(method, (url or self.urls[0]) + "/api/v1" + path, json=body,
                                    headers=headers) as r:
            return r.status, await r.json(content_type=None)

    async def pool(self, name: str) -> None:
        status, body = await self.call("PUT", f"/pools/{name}", body={
            "kind": "game", "max_sessions_per_gpu": SEATS, "vram_per_session_mb": 1})
        assert status in (200, 201), body

    def node_process(self, host_id: str, pool: str, url: str) -> subprocess.Popen[bytes]:
        return self._spawn(host_id, [
            sys.executable, "-m", "streamer", "--broker-url", url, f"--node-token={self.node_token}", "--pool", pool,
            "--host-id", host_id, "--seats", str(SEATS), "--advertise-addresses", "127.0.0.1",
            "--heartbeat-interval-s", str(HEARTBEAT_S), "--shutdown-grace-s", "0", "--selftest-interval-s", "0",
            "--game-renderer", "cpu"])

    async def node_agent(self, host_id: str, pool: str, url: str) -> NodeAgent:
        agent = NodeAgent(NodeSettings(
            broker_url=url, node_token=self.node_token, host_id=host_id, pool=pool, seats=SEATS,
            advertise_addresses=["127.0.0.1"], heartbeat_interval_s=HEARTBEAT_S, shutdown_grace_s=0,
            selftest_interval_s=0, game_renderer="cpu", watchdog_healthy_hold_s=3600))
        self.agents.append((agent, asyncio.create_task(agent.run())))
        await asyncio.wait_for(agent.registered.wait(), 30)
        return agent

    async def host(self, host_id: str, url: str | None = None) -> dict[str, Any]:
        status, body = await self.call("GET", f"/hosts/{host_id}", url)
        return body if status == 200 else {}

    async def wait_hosts_up(self, ids: list[str], url: str | None = None) -> None:
        async def up() -> bool:
            return all([(await self.host(h, url)).get("state") == "up" for h in ids])
        await self.until(up, f"hosts {ids} not up", 60)

    async def seat(self, pool: str, n: int, tag: str, url: str | None = None) -> list[str]:
        """``n`` sessions in ``pool`` (one user each), waited until the nodes run them; their ids."""
        ids = []
        for i in range(n):
            _, tok = await self.call("POST", "/tokens", url, body={"user": f"{tag}-u{i}"})
            status, body = await self.call("POST", "/sessions", url, tok["token"],
                                           {"pool": pool, "profile": PROFILE})
            assert status in (200, 201), body
            ids.append(body["id"])

        async def running() -> bool:
            # started: the node runs it (with no viewer its heartbeats report it disconnected)
            return all([(await self.session(s, url)).get("state") in ("running", "disconnected") for s in ids])
        await self.until(running, f"sessions of {tag} not started", 90)
        return ids

    async def session(self, sid: str, url: str | None = None) -> dict[str, Any]:
        status, body = await self.call("GET", f"/sessions/{sid}", url)
        return body if status == 200 else {}

    async def scrape(self, url: str) -> dict[str, Series]:
        async with self.api.get(url + "/metrics") as r:
            return parse_metrics(await r.text())

    async def audit_drains(self, url: str, hosts: set[str]) -> dict[str, str]:
        _, body = await self.call("GET", "/audit?action=host.drain", url)
        return {e["target"]: (e.get("detail") or {}).get("reason", "") for e in body.get("entries", [])
                if e["target"] in hosts}

    async def tally(self, res: DrillResult, sessions: dict[str, str], url: str) -> None:
        """Sessions lost (by host), what drained and what fires, after ``SETTLE_S``."""
        await asyncio.sleep(SETTLE_S)  # the drill's measured window: collateral shows within it
        for sid, host in sessions.items():
            if (await self.session(sid, url)).get("state") in ("ended", None):
                if host == res.victim:
                    res.lost_on_victim += 1
                else:
                    res.lost_elsewhere += 1
        res.sessions = len(sessions)
        res.drained = await self.audit_drains(url, set(sessions.values()) | {res.victim})
        metrics = await self.scrape(url)
        res.fired = [name for name, (metric, cond) in ALERTS.items()
                     if any(cond(lab, v) for lab, v in metrics.get(metric, ()) if lab.get("pool") == res.pool)]
        res.encoder_errors = next((v for lab, v in metrics.get("render_broker_encoder_errors_total", ())
                                   if lab.get("host") == res.victim), None)
        res.seats_leaked = await self.seats_leaked(res.pool, url)

    def restart_redis(self) -> subprocess.Popen[bytes]:
        """A new, empty redis-server on the same port (the old one must be dead): what a Redis without
        persistence, or a failover that lost its writes, looks like to the brokers."""
        return self._spawn("redis", ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
                                     "--save", "", "--appendonly", "no", "--dir", str(self.tmp)])

    async def traffic(self, res: DrillResult, pool: str, sessions: list[str], url: str) -> None:
        """A client's reads while the drill runs (pool view, its sessions): counted in ``res``, 5xx apart."""
        i = 0
        while True:
            path = f"/pools/{pool}" if i % 2 == 0 or not sessions else f"/sessions/{sessions[i % len(sessions)]}"
            i += 1
            res.requests += 1
            try:
                async with self.api.get(url + "/api/v1" + path, headers=self.admin_headers()) as r:
                    await r.read()
                    if r.status >= 500:
                        res.errors_5xx += 1
            except (aiohttp.ClientError, OSError, TimeoutError):
                res.errors_5xx += 1
            await asyncio.sleep(0.05)

    async def seats_leaked(self, pool: str, url: str) -> int:
        """The pool's seats in use (its counters) minus its live seated sessions (a listing)."""
        status, view = await self.call("GET", f"/pools/{pool}", url)
        _, listing = await self.call("GET", f"/sessions?pool={pool}", url)
        if status != 200:
            return -1
        seated = sum(1 for s in listing.get("sessions", []) if s.get("host"))
        return int(view.get("seats_used", 0)) - seated

    async def close(self) -> None:
        for agent, task in self.agents:
            agent.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 30)
        # nodes first, then brokers, Redis last; a name is matched whole ("redis-lost-a" is a node)
        brokers = [p for n, p in self.procs.items() if n in {f"broker{i}" for i in range(len(self.ports))}]
        nodes = [p for n, p in self.procs.items() if n != "redis" and p not in brokers]
        for proc in [*nodes, *brokers, self.procs.get("redis")]:
            if proc is not None:
                await stop_group(proc)
        if self.http is not None:
            await self.http.close()
        for log in self.logs:
            log.close()


async def stop_group(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM the process group ``proc`` leads, SIGKILL it after ``timeout_s``, and reap it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            await asyncio.to_thread(proc.wait, timeout_s)
            return
        except subprocess.TimeoutExpired:
            continue


async def _placed(lab: Lab, ids: list[str]) -> dict[str, str]:
    return {sid: (await lab.session(sid)).get("host") or "" for sid in ids}


async def drill_node_killed(lab: Lab) -> DrillResult:
    pool = "d-kill"
    await lab.pool(pool)
    victim, other = "kill-victim", "kill-other"
    for h in (victim, other):
        lab.node_process(h, pool, lab.urls[1])
    await lab.wait_hosts_up([victim, other])
    placed = await _placed(lab, await lab.seat(pool, 2 * SEATS, "kill"))
    res = DrillResult("node-killed", victim, pool)
    os.killpg(lab.procs[victim].pid, signal.SIGKILL)
    res.detect_s = round(await lab.until(lambda: _state_is(lab, victim, "down"), "killed node not down"), 2)
    res.detected = f"host {victim} down (lease {LEASE_S:g} s expired)"
    await lab.tally(res, placed, lab.urls[0])
    return res


async def _state_is(lab: Lab, host: str, state: str, url: str | None = None) -> bool:
    return (await lab.host(host, url)).get("state") == state


async def drill_hot_gpu(lab: Lab) -> DrillResult:
    pool = "d-hot"
    await lab.pool(pool)
    victim, other = "hot-victim", "hot-other"
    agent = await lab.node_agent(victim, pool, lab.urls[1])
    lab.node_process(other, pool, lab.urls[1])
    await lab.wait_hosts_up([victim, other])
    placed = await _placed(lab, await lab.seat(pool, 2 * SEATS, "hot"))
    res = DrillResult("hot-gpu", victim, pool)
    real = agent.read_gpus

    async def hot() -> list[dict[str, Any]]:  # what NVML reports for an overheating card
        return [{**row, "temperature_c": 95.0, "throttle_reasons": ["hw_thermal"]} for row in await real()]

    agent.read_gpus = hot  # type: ignore[method-assign]
    res.detect_s = round(await lab.until(lambda: _state_is(lab, victim, "draining"), "hot node not drained"), 2)
    res.detected = f"host {victim} draining (its watchdog)"
    await lab.tally(res, placed, lab.urls[0])
    return res


async def drill_vram_leak(lab: Lab) -> DrillResult:
    pool = "d-leak"
    await lab.pool(pool)
    victim, other = "leak-victim", "leak-other"
    agent = await lab.node_agent(victim, pool, lab.urls[1])
    lab.node_process(other, pool, lab.urls[1])
    await lab.wait_hosts_up([victim, other])
    placed = await _placed(lab, await lab.seat(pool, 2 * SEATS, "leak"))
    res = DrillResult("vram-leak", victim, pool)
    real = agent.read_gpus
    readings = 0

    async def leaking() -> list[dict[str, Any]]:  # NVML's memory reading: 1 GiB, then 4 GiB, sessions unchanged
        nonlocal readings
        readings += 1
        used = 1024.0 if readings == 1 else 4096.0
        return [{**row, "vram_used_mb": used, "vram_total_mb": 24_576.0} for row in await real()]

    agent.read_gpus = leaking  # type: ignore[method-assign]
    res.detect_s = round(await lab.until(lambda: _state_is(lab, victim, "draining"), "leaking node not drained"), 2)
    res.detected = f"host {victim} draining (its watchdog)"
    await lab.tally(res, placed, lab.urls[0])
    return res


class FailingEncoder:
    """The host's encoder gone bad: every frame raises, as a wedged NVENC session or a broken driver would."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def encode(self, frame: Any) -> Any:
        raise RuntimeError("drill: the encoder fails every frame")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def drill_encoder_failing(lab: Lab) -> DrillResult:
    pool = "d-enc"
    await lab.pool(pool)
    victim, other = "enc-victim", "enc-other"
    lab.node_process(other, pool, lab.urls[1])
    await lab.wait_hosts_up([other])
    placed = await _placed(lab, await lab.seat(pool, SEATS, "enc"))  # on the other node: the victim stays idle
    agent = await lab.node_agent(victim, pool, lab.urls[1])
    await lab.wait_hosts_up([victim])
    res = DrillResult("encoder-failing", victim, pool)
    agent.selftest.config = replace(agent.selftest.config, seconds=1.0, loss_ms=0)
    agent.selftest.wrap_encoder = FailingEncoder  # type: ignore[assignment]
    t0 = time.monotonic()
    report = await agent.selftest.run_once()  # what the interval would start on an idle node
    res.notes = f"self-test: {report.reason if report is not None else 'did not run'}"
    await lab.until(lambda: _state_is(lab, victim, "draining"), "node with a failing encoder not drained")
    res.detect_s = round(time.monotonic() - t0, 2)
    res.detected = f"host {victim} draining (stream self-test failed)"
    await lab.tally(res, placed, lab.urls[0])
    return res


async def drill_broker_killed(lab: Lab) -> DrillResult:
    pool = "d-broker"
    await lab.pool(pool)
    hosts = ["brk-a", "brk-b"]
    for h in hosts:
        lab.node_process(h, pool, lab.urls[1])  # nodes reach the replica that stays
    await lab.wait_hosts_up(hosts)
    placed = await _placed(lab, await lab.seat(pool, SEATS, "brk", lab.urls[0]))
    res = DrillResult("broker-killed", "broker0", pool)
    os.killpg(lab.procs["broker0"].pid, signal.SIGKILL)

    async def gone() -> bool:
        return not await lab._ready(lab.urls[0])
    res.detect_s = round(await lab.until(gone, "killed replica still answers"), 2)
    res.detected = "replica broker0 does not answer (RenderBrokerDown: its scrape fails)"
    new = await lab.seat(pool, 1, "brk-after", lab.urls[1])  # the surviving replica seats a new session
    res.notes = f"replica broker1 seated a new session after the kill ({new[0]})"
    await lab.tally(res, placed, lab.urls[1])
    res.fired = ["RenderBrokerDown", *res.fired]
    return res


async def _redis_drill(lab: Lab, name: str, lose: bool) -> DrillResult:
    """Freeze Redis (``lose`` False) or kill it and start an empty one (True) under two nodes with sessions."""
    pool = "d-" + name
    await lab.pool(pool)
    hosts = [f"{name}-a", f"{name}-b"]
    for h in hosts:
        lab.node_process(h, pool, lab.urls[1])
    await lab.wait_hosts_up(hosts)
    ids = await lab.seat(pool, 2 * SEATS - 1, name)  # one seat left for the new session after recovery
    placed = await _placed(lab, ids)
    res = DrillResult(name, "redis", pool)
    load = asyncio.create_task(lab.traffic(res, pool, ids, lab.urls[0]))
    redis = lab.procs["redis"]
    t0 = time.monotonic()
    if lose:
        os.killpg(redis.pid, signal.SIGKILL)
        await asyncio.to_thread(redis.wait)
    else:
        os.killpg(redis.pid, signal.SIGSTOP)

    async def unready() -> bool:
        return not await lab._ready(lab.urls[0])
    try:
        res.detect_s = round(await lab.until(unready, "brokers still ready without Redis"), 2)
        res.detected = "/readyz 503 (Redis unavailable)"
        if lose:
            lab.restart_redis()
        else:
            await asyncio.sleep(max(0.0, REDIS_FREEZE_S - (time.monotonic() - t0)))
            os.killpg(redis.pid, signal.SIGCONT)
        t_back = time.monotonic()

        async def recovered() -> bool:  # both replicas ready, every drill session back on its host, a new seat works
            if not all([await lab._ready(u) for u in lab.urls]):
                return False
            views = [await lab.session(sid) for sid in ids]
            return all(v.get("host") == placed[sid] and v.get("state") in ("running", "disconnected")
                       for sid, v in zip(ids, views, strict=True))
        await lab.until(recovered, "sessions not back after Redis returned", 60)
        await lab.seat(pool, 1, f"{name}-after")
        res.recover_s = round(time.monotonic() - t_back, 2)
    finally:
        load.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await load
        if not lose:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(redis.pid, signal.SIGCONT)
    res.notes = (f"Redis frozen (SIGSTOP) for {REDIS_FREEZE_S:.1f} s" if not lose else
                 "Redis killed and restarted empty: pools restored from SQL, sessions re-adopted from the nodes")
    await lab.tally(res, placed, lab.urls[0])
    return res


async def drill_redis_frozen(lab: Lab) -> DrillResult:
    return await _redis_drill(lab, "redis-frozen", lose=False)


async def drill_redis_lost(lab: Lab) -> DrillResult:
    return await _redis_drill(lab, "redis-lost", lose=True)


RUNNERS: dict[str, Callable[[Lab], Awaitable[DrillResult]]] = {
    "node-killed": drill_node_killed, "hot-gpu": drill_hot_gpu, "vram-leak": drill_vram_leak,
    "encoder-failing": drill_encoder_failing, "redis-frozen": drill_redis_frozen, "redis-lost": drill_redis_lost,
    "broker-killed": drill_broker_killed,
}


async def run(drills: list[str]) -> list[DrillResult]:
    with tempfile.TemporaryDirectory(prefix="rb-drill-") as tmp:
        lab = Lab(Path(tmp))
        try:
            await lab.start()
            return [await RUNNERS[d](lab) for d in drills]
        finally:
            await lab.close()


def print_results(results: list[DrillResult]) -> None:
    for r in results:
        print(f"drill {r.drill}: victim {r.victim}")
        print(f"  detected: {r.detected} after {r.detect_s} s")
        print(f"  fired (condition true now, before its for: hold): {', '.join(r.fired) or 'nothing'}")
        if r.encoder_errors:
            print(f"  encoder errors counted by the victim: {r.encoder_errors:g} "
                  "(RenderBrokerEncoderErrors: a ticket past 1/min for 10 min)")
        print("  drained: " + ("; ".join(f"{h}: {why}" for h, why in r.drained.items()) or "nothing"))
        print(f"  sessions: {r.sessions}; lost on the victim {r.lost_on_victim}, elsewhere {r.lost_elsewhere} "
              f"(goal 0); seats leaked {r.seats_leaked} (goal 0)")
        if r.requests:
            print(f"  client requests during the drill: {r.requests}, 5xx or unanswered {r.errors_5xx}")
        if r.recover_s is not None:
            print(f"  recovered {r.recover_s} s after the fault ended (both replicas ready, sessions back, a new "
                  "seat works)")
        if r.notes:
            print(f"  {r.notes}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--drill", choices=[*DRILLS, "all"], default="all")
    parser.add_argument("--json", action="store_true")
    ns = parser.parse_args(argv)
    drills = list(DRILLS) if ns.drill == "all" else [ns.drill]
    load = os.getloadavg()
    results = asyncio.run(run(drills))
    if ns.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
    else:
        print(f"load average at start: {load[0]:.2f}")
        print_results(results)
    return 0 if all(r.lost_elsewhere == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
