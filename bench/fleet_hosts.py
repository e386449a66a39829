"""Simulated render hosts for ``bench/bench_fleet.py``: in the benchmark's process, or split over workers.

A ``HostGroup`` is the simulated hosts of one generator process (host ``i`` lives in worker
``i mod K``) with their command sockets, heartbeat loops and session start/stop, and the SSE
readers it is given.  The benchmark's main process drives every group through the same small
request/reply protocol (``HostGroup.handle``): in-process with ``--gen-procs 1`` (``LocalGen``),
else one worker process per group (``ProcGen``), which runs this file and exchanges one JSON
object per line over its stdin (requests) and stdout (replies, each with the request's ``id``):

    {"op": "init", "cfg": {...}, "bases": [...], "node_token": "...", "worker": k, "procs": K}  (first line)
    start                        register this group's hosts, open command sockets, start heartbeats
    streams  items=[[url, token]]  open these SSE readers
    running                      -> {"running": sessions the hosts run}
    record   on=bool             latency recording and loop-lag sampling on/off
    ended    host=i session=id   the benchmark ends this session itself (not a stop "unasked")
    pause / resume               heartbeats held (the quiet window; pause answers once none is in flight)
    heartbeat host=i             one heartbeat of host i now -> {"status": http status}
    stats                        -> latencies, errors, stops unasked, re-registrations, loop lag p99
    stop                         close everything; the worker exits

A worker whose stdin closes (the benchmark died) stops too.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

POOL = "fleet"
REQUEST_TIMEOUT_S = 60.0
GPU_MODEL = "NVIDIA L40S"
PIPE_LIMIT = 1 << 26  # one reply line carries a worker's latency lists
WORKER_SCRIPT = str(Path(__file__).resolve())


@dataclass(frozen=True)
class FleetConfig:
    hosts: int
    replicas: int = 1
    gpus_per_host: int = 4
    seats_per_gpu: int = 3  # 12 seats a host: 10 taken by the fleet, room for the seatings
    sessions_per_host: int = 10
    heartbeat_s: float = 5.0
    heartbeat_jitter: float = 0.0  # sleep heartbeat_s x (1 +- this); the real agent does not jitter (0)
    sse_every: int = 4  # one events stream per this many sessions
    steady_s: float = 20.0
    seatings: int = 200
    seat_rate: float = 10.0
    seat_hold_s: float = 2.0  # a measured seating is ended by its user this long after it was seated
    start_delay_s: tuple[float, float] = (0.05, 0.5)  # simulated session start time
    setup_concurrency: int = 32
    quiet_s: float = 2.0
    isolated: int = 12  # isolated heartbeats and seatings measured in the quiet window
    run_timeout_s: float = 900.0
    gen_procs: int = 1  # generator processes: 1 runs the hosts in the benchmark's own process


@dataclass
class Stats:
    hb_ms: list[float] = field(default_factory=list)
    seat_ms: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    heartbeats: int = 0
    recording: bool = False
    stops_unasked: int = 0  # stop commands for sessions the benchmark did not end
    gen_lag_ms: list[float] = field(default_factory=list)  # how late the generator's own loop woke up
    hb_at: list[float] = field(default_factory=list)  # time.monotonic() at each recorded heartbeat's start
    seat_from: float = 0.0  # time.monotonic() when the seatings began
    reregistered: int = 0


def pct(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


async def wait_until(done: Callable[[], bool], timeout_s: float, poll_s: float) -> bool:
    """Poll ``done`` until it holds or ``timeout_s`` passes (the simulated fleet has no event to wait on)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if done():
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(poll_s)


async def loop_lag(samples: list[float], period_s: float = 0.02) -> None:
    """Record how late this process's event loop wakes up: latencies it measures include this much."""
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time() + period_s
        await asyncio.sleep(period_s)
        samples.append((loop.time() - asked) * 1000)



# ---- simulated hosts -------------------------------------------------------------------------------
class SimHost:
    """One render host: registration, command socket, sequential heartbeats, session start/stop."""

    def __init__(self, idx: int, base: str, cfg: FleetConfig, node_token: str, stats: Stats,
                 rng: random.Random) -> None:
        self.id = f"fh{idx:05d}"
        self.base = base
        self.cfg = cfg
        self.auth = {"Authorization": f"Bearer {node_token}"}
        self.stats = stats
        self.rng = rng
        self.running: dict[str, int] = {}  # session id -> last input (epoch ms)
        self.starting: set[str] = set()
        self.ended_by_us: set[str] = set()
        self.gate: asyncio.Event | None = None
        self.in_flight = 0

    def register_body(self) -> dict[str, Any]:
        return {"id": self.id, "pool": POOL, "address": f"{self.id}.fleet.internal:7000", "version": "sim/1",
                "gpus": [{"index": g, "vram_mb": 46_068, "model": GPU_MODEL, "encoder_session_limit": 8,
                          "nvenc": True, "encode": "nvenc"} for g in range(self.cfg.gpus_per_host)]}

    async def register(self, http: aiohttp.ClientSession) -> None:
        async with http.post(f"{self.base}/api/v1/hosts", json=self.register_body(), headers=self.auth) as r:
            if r.status != 201:
                raise RuntimeError(f"register {self.id}: {r.status} {await r.text()}")
            # per-host calls carry the credential bound to this host (the node token only registers);
            # a broker from before per-host identity (a --pythonpath baseline) sends none
            cred = (await r.json()).get("node_credential")
            if cred:
                self.auth = {"Authorization": f"Bearer {cred['token']}"}

    def heartbeat_body(self) -> dict[str, Any]:
        now = int(time.time() * 1000)
        rng = self.rng
        gpus = [{"index": g, "utilization": rng.uniform(20, 90), "vram_used_mb": rng.uniform(4000, 30000),
                 "vram_total_mb": 46_068, "encoder_utilization": rng.uniform(10, 60), "encoder_sessions": 3,
                 "encoder_fps": 59.8, "encoder_latency_us": rng.uniform(800, 3000),
                 "temperature_c": rng.uniform(40, 75), "power_w": rng.uniform(90, 300), "throttle_reasons": []}
                for g in range(self.cfg.gpus_per_host)]
        sessions = []
        for sid in self.running:
            self.running[sid] = now - rng.randint(0, 4000)
            sessions.append({"id": sid, "state": "running", "last_input_ms": self.running[sid],
                             "fps": 59.9, "target_fps": 60, "encode_ms": rng.uniform(2, 6),
                             "bitrate_bps": rng.uniform(8e6, 2e7), "target_bps": 2e7, "rtt_ms": rng.uniform(5, 40),
                             "jitter_ms": rng.uniform(1, 6), "loss": rng.uniform(0, 0.01), "keyframes": 3,
                             "encoder": "h264_nvenc", "width": 1920, "height": 1080})
        return {"gpus": gpus, "sessions": sessions, "cpu_percent": rng.uniform(20, 80)}

    async def heartbeat(self, http: aiohttp.ClientSession, record: bool) -> int:
        body = self.heartbeat_body()
        t0 = time.monotonic()
        self.in_flight += 1
        try:
            async with http.put(f"{self.base}/api/v1/hosts/{self.id}/heartbeat", json=body, headers=self.auth) as r:
                data = await r.json(content_type=None)
                status = r.status
        finally:
            self.in_flight -= 1
        if record:
            self.stats.hb_ms.append((time.monotonic() - t0) * 1000)
            self.stats.hb_at.append(t0)
            self.stats.heartbeats += 1
        if status == 404 and isinstance(data, dict) and data.get("reregister"):
            self.stats.reregistered += 1
            self.stats.errors["heartbeat 404 reregister"] += 1
            await self.register(http)
            return status
        if status != 200:
            self.stats.errors[f"heartbeat {status}"] += 1
            return status
        for cmd in data.get("start", []):
            self.start(http, cmd["session"]["id"])
        for sid in data.get("stop", []):
            self.stop(sid)
        return status

    async def heartbeat_loop(self, http: aiohttp.ClientSession) -> None:
        await asyncio.sleep(self.rng.uniform(0, self.cfg.heartbeat_s))
        while True:
            if self.gate is not None:
                await self.gate.wait()
            try:
                await self.heartbeat(http, self.stats.recording)
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                self.stats.errors[f"heartbeat {type(exc).__name__}"] += 1
            j = self.cfg.heartbeat_jitter
            await asyncio.sleep(self.cfg.heartbeat_s * (self.rng.uniform(1 - j, 1 + j) if j else 1.0))

    def start(self, http: aiohttp.ClientSession, sid: str) -> None:
        if sid in self.running or sid in self.starting:
            return
        self.starting.add(sid)
        asyncio.get_running_loop().create_task(self._start(http, sid))

    async def _start(self, http: aiohttp.ClientSession, sid: str) -> None:
        await asyncio.sleep(self.rng.uniform(*self.cfg.start_delay_s))
        if sid not in self.starting:
            return  # stopped meanwhile
        self.starting.discard(sid)
        self.running[sid] = int(time.time() * 1000)  # the agent adds it before it reports running
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            async with http.put(f"{self.base}/api/v1/hosts/{self.id}/sessions/{sid}/state",
                                json={"state": "running"}, headers=self.auth) as r:
                await r.read()
                if r.status >= 400:
                    self.stats.errors[f"report running {r.status}"] += 1

    def stop(self, sid: str) -> None:
        self.starting.discard(sid)
        if self.running.pop(sid, None) is not None and sid not in self.ended_by_us:
            self.stats.stops_unasked += 1

    async def command_loop(self, http: aiohttp.ClientSession) -> None:
        url = f"{self.base}/api/v1/hosts/{self.id}/commands".replace("http", "ws", 1)
        while True:
            try:
                async with http.ws_connect(url, headers=self.auth, heartbeat=10.0) as ws:
                    async for msg in ws:
                        if msg.type != aiohttp.WSMsgType.TEXT:
                            continue
                        cmd = json.loads(msg.data)
                        if cmd.get("cmd") == "start":
                            self.start(http, cmd["session"]["id"])
                        elif cmd.get("cmd") == "stop":
                            self.stop(cmd["session_id"])
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                self.stats.errors[f"command socket {type(exc).__name__}"] += 1
            await asyncio.sleep(1.0)


async def sse_reader(http: aiohttp.ClientSession, url: str, token: str, stats: Stats) -> None:
    try:
        async with http.get(url, headers={"Authorization": f"Bearer {token}"}) as r:
            if r.status != 200:
                stats.errors[f"events {r.status}"] += 1
                return
            async for _line in r.content:
                pass
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        stats.errors[f"events {type(exc).__name__}"] += 1




def host_id(idx: int) -> str:
    return f"fh{idx:05d}"


def host_index(hid: str) -> int:
    """The index of a simulated host from its id (``fh00042`` -> 42); -1 for anything else."""
    return int(hid[2:]) if hid.startswith("fh") and hid[2:].isdigit() else -1


def config_to_json(cfg: FleetConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def config_from_json(d: dict[str, Any]) -> FleetConfig:
    return FleetConfig(**{**d, "start_delay_s": tuple(d["start_delay_s"])})


# ---- one generator process's hosts ------------------------------------------------------------------
class HostGroup:
    """The simulated hosts ``worker``, ``worker + procs``, ... and the SSE readers given to this process."""

    def __init__(self, cfg: FleetConfig, bases: Sequence[str], node_token: str, worker: int = 0,
                 procs: int = 1) -> None:
        self.cfg = cfg
        self.stats = Stats()
        self.hosts = {i: SimHost(i, bases[i % len(bases)], cfg, node_token, self.stats, random.Random(i))
                      for i in range(worker, cfg.hosts, procs)}
        self.gate = asyncio.Event()
        self.gate.set()
        self.tasks: list[asyncio.Task[Any]] = []
        self.lag_task: asyncio.Task[None] | None = None
        self.http: aiohttp.ClientSession | None = None
        self.streams: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                          timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S))
        self.streams = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                             timeout=aiohttp.ClientTimeout(total=None))
        sem = asyncio.Semaphore(self.cfg.setup_concurrency)

        async def register(h: SimHost) -> None:
            async with sem:
                assert self.http is not None
                await h.register(self.http)

        await asyncio.gather(*[register(h) for h in self.hosts.values()])
        for h in self.hosts.values():
            h.gate = self.gate
            self.tasks.append(asyncio.create_task(h.command_loop(self.streams)))
            self.tasks.append(asyncio.create_task(h.heartbeat_loop(self.http)))

    async def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Answer one request of the control protocol (see the module's docstring)."""
        op = msg["op"]
        if op == "start":
            await self.start()
            return {"hosts": len(self.hosts)}
        if op == "streams":
            assert self.streams is not None
            for url, token in msg["items"]:
                self.tasks.append(asyncio.create_task(sse_reader(self.streams, url, token, self.stats)))
            return {}
        if op == "running":
            return {"running": sum(len(h.running) for h in self.hosts.values())}
        if op == "record":
            self.stats.recording = bool(msg["on"])
            if msg["on"] and self.lag_task is None:
                self.lag_task = asyncio.create_task(loop_lag(self.stats.gen_lag_ms))
            elif not msg["on"] and self.lag_task is not None:
                self.lag_task.cancel()
                self.lag_task = None
            return {}
        if op == "ended":
            self.hosts[msg["host"]].ended_by_us.add(msg["session"])
            return {}
        if op == "pause":
            self.gate.clear()
            await wait_until(lambda: not any(h.in_flight for h in self.hosts.values()), 5, 0.05)
            return {"in_flight": sum(h.in_flight for h in self.hosts.values())}
        if op == "resume":
            self.gate.set()
            return {}
        if op == "heartbeat":
            assert self.http is not None
            return {"status": await self.hosts[msg["host"]].heartbeat(self.http, False)}
        if op == "stats":
            s = self.stats
            return {"hb_ms": s.hb_ms, "hb_at": s.hb_at, "errors": dict(s.errors), "heartbeats": s.heartbeats,
                    "stops_unasked": s.stops_unasked, "reregistered": s.reregistered,
                    "lag_p99_ms": pct(s.gen_lag_ms, .99), "lag_samples": len(s.gen_lag_ms)}
        if op == "stop":
            await self.close()
            return {}
        raise ValueError(f"unknown op {op!r}")

    async def close(self) -> None:
        tasks = [*self.tasks, *([self.lag_task] if self.lag_task else [])]
        self.tasks, self.lag_task = [], None
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for session in (self.http, self.streams):
            if session is not None:
                await session.close()
        self.http = self.streams = None


# ---- the main process's handles on the groups -----------------------------------------------------
class LocalGen:
    """A group in the benchmark's own process (``--gen-procs 1``)."""

    pid: int | None = None

    def __init__(self, group: HostGroup) -> None:
        self.group = group

    async def call(self, op: str, **args: Any) -> dict[str, Any]:
        return await self.group.handle({"op": op, **args})

    async def close(self) -> None:
        await self.group.close()


class ProcGen:
    """A group in a worker process running this file, driven over JSON lines on its stdin/stdout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.pid: int | None = proc.pid
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.seq = 0
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def spawn(cls, cfg: FleetConfig, bases: Sequence[str], node_token: str, worker: int,
                    procs: int) -> ProcGen:
        proc = await asyncio.create_subprocess_exec(sys.executable, WORKER_SCRIPT,
                                                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                                    limit=PIPE_LIMIT)
        gen = cls(proc)
        gen._send({"op": "init", "cfg": config_to_json(cfg), "bases": list(bases), "node_token": node_token,
                   "worker": worker, "procs": procs})
        return gen

    def _send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            while line := await self.proc.stdout.readline():
                reply = json.loads(line)
                fut = self.pending.pop(reply.pop("id"), None)
                if fut is not None and not fut.done():
                    fut.set_result(reply)
        finally:
            for fut in self.pending.values():
                if not fut.done():
                    fut.set_exception(RuntimeError(f"generator worker {self.pid} exited"))

    async def call(self, op: str, **args: Any) -> dict[str, Any]:
        if self.reader.done():
            raise RuntimeError(f"generator worker {self.pid} exited")
        self.seq += 1
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[self.seq] = fut
        self._send({"op": op, "id": self.seq, **args})
        reply = await fut
        if "error" in reply:
            raise RuntimeError(f"generator worker {self.pid}: {op}: {reply['error']}")
        return reply

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.call("stop"), 30)
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        self.reader.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)


async def start_gens(cfg: FleetConfig, bases: Sequence[str], node_token: str) -> list[LocalGen | ProcGen]:
    """The generator's groups, hosts registered and heartbeating; ``close_gens`` ends them."""
    gens: list[LocalGen | ProcGen] = []
    try:
        if cfg.gen_procs <= 1:
            gens.append(LocalGen(HostGroup(cfg, bases, node_token)))
        else:
            for k in range(cfg.gen_procs):
                gens.append(await ProcGen.spawn(cfg, bases, node_token, k, cfg.gen_procs))
        await asyncio.gather(*[g.call("start") for g in gens])
    except BaseException:
        await close_gens(gens)
        raise
    return gens


async def close_gens(gens: Sequence[LocalGen | ProcGen]) -> None:
    await asyncio.gather(*[g.close() for g in gens], return_exceptions=True)


# ---- worker process ------------------------------------------------------------------------------
async def worker_main() -> int:
    # Ctrl-C reaches the whole process group: the main process stops its workers itself (stop, or
    # its end closing their stdin), after its own clean-up
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=PIPE_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    init = json.loads(await reader.readline())
    group = HostGroup(config_from_json(init["cfg"]), init["bases"], init["node_token"], init["worker"],
                      init["procs"])
    out = sys.stdout.buffer
    try:
        while line := await reader.readline():
            msg = json.loads(line)
            try:
                reply = await group.handle(msg)
            except Exception as exc:  # the main process reports it with the op
                reply = {"error": repr(exc)}
            out.write(json.dumps({"id": msg["id"], **reply}).encode() + b"\n")
            out.flush()
            if msg["op"] == "stop":
                break
    finally:
        await group.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(worker_main()))
