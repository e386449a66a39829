"""Streaming benchmark: frame cost, node CPU per stream and concurrent streams per machine.

Run: ``python bench/bench_stream.py`` (``--quick`` for short windows and at most 3
sessions; ``--profiles 720p30 1080p30``, ``--kinds game``, ``--max-sessions N`` and
``--window-s S`` narrow or lengthen a run).  The full run takes about 3-4 minutes on
the 2-core development machine.  For the resolution profiles 720p30, 1080p30 and
1080p60 it prints:

1. frame cost, one stream, paced at the profile's frame rate, ms per frame p50/p95:
   capture (PyAV x11grab of an Xvfb desktop: ``streamer.desktop.display.VirtualDisplay`` +
   ``streamer.desktop.capture.open_capture``) or render (the built-in game,
   ``streamer.desktop.capture.GameCapture``), then conversion + encode with the encoder the
   node picks on this machine (``streamer.abr.control.choose_backend`` over the probe:
   libx264 where no GPU exists);
2. one session streaming to one aiortc viewer over loopback, per kind (``desktop``:
   Xvfb + openbox + a maximized xterm whose output scrolls 40 lines a second;
   ``game``: the built-in renderer): frames the viewer received per second, and the
   node's CPU per stream = (CPU seconds of this process, all threads, + the session's
   Xvfb) / wall seconds, 100 % = one core.  The app (openbox, xterm and what runs in
   it) and the viewer are shown apart: they are not node work;
3. concurrent sessions: 1, 2, 3, ... ``streamer.media.session.SessionRuntime``s in this one
   process and asyncio loop (as a render node runs them), each with its own viewer,
   until a viewer receives less than 95 % of the profile's frame rate over the
   measurement window or the cap (``--max-sessions``, 8) is reached; the largest N
   where every viewer kept up is the number of streams this machine sustains.

Every session uses the node's real code path (``SessionRuntime.start`` /
``handle_signal`` / ``stop``: capture, frame thread, encoder, aiortc peer, control
loop).  One thing is pinned: the bitrate profile's minimum is raised to the requested
rung's floor, so the quality ladder never steps resolution or frame rate down and the
figures are for the requested size and rate (the default profiles would *start* a
1080p60 game at 720p60 and a 1080p60 desktop at 30 fps; the header says where).

Viewers are ``tests.streamer.viewer.Viewer``s (decode only), each in its own child
process (this script with ``--viewer-worker``, driven over a JSON-lines pipe), so
their decoding is neither counted as node CPU nor competes for the node's GIL; they
still share the machine's cores, as every other process here does.  Received frames
are counted by decode time (``time.monotonic``, one clock for all processes).

Every session, display and viewer process started is stopped on the way out, also on
Ctrl-C or an error (and the kernel kills Xvfb and viewers if this process is killed).

Size: one file of about 900 lines on purpose: a benchmark is run as one script on machines
where only the checkout exists (the GPU machine gets it with carried wheels), and its three
measurements share the viewer-process protocol, the CPU accounting and the table printing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # measure this checkout's streamer

from bench.common import machine_busy_cpu_s, own_cpu_s, print_table
from encoder import AIORTC_VIDEO_CODECS, EncoderConfig, ProbeResult, Selection, VideoEncoder, probe_all_async
from encoder.backends import Backend
from encoder.stats import percentile
from streamer.abr import ladder as ladder_policy
from streamer.abr.bitrate import DESKTOP_PROFILE, GAME_PROFILE, BitrateProfile
from streamer.abr.control import SENDABLE_BACKENDS, choose_backend
from streamer.desktop.capture import FrameSource, GameCapture, GameRendererKind, open_capture
from streamer.desktop.display import DisplayConfig, VirtualDisplay, die_with_parent
from streamer.desktop.game import Game
from streamer.desktop.inputsink import wall_clock_ms
from streamer.media.session import RuntimeConfig, SessionRuntime, SessionSpec

SUSTAIN_RATIO: Final = 0.95  # a viewer keeps up when it receives >= 95 % of the target fps
DEFAULT_MAX_SESSIONS: Final = 8
QUICK_MAX_SESSIONS: Final = 3
WARMUP_FRAMES: Final = 5  # frame cost: first keyframe and allocations, not measured
MOTION_DEADLINE_S: Final = 15.0  # the desktop must show changing pixels within this
FIRST_FRAME_DEADLINE_S: Final = 30.0  # a new viewer's first decoded frame (child start included)
VIEWER_REPLY_TIMEOUT_S: Final = 30.0  # one request to a viewer process
VIEWER_EXIT_TIMEOUT_S: Final = 5.0
TICKER_LINES_PER_S: Final = 40
TICKER_PREFILL_LINES: Final = 200  # more than a 1080p xterm shows: it scrolls from the start
# The desktop app's busy part: numbered lines of varying length, TICKER_LINES_PER_S a second.
TICKER: Final = (
    "import itertools, time\n"
    "for i in itertools.count():\n"
    f"    print(i, f'{{time.time():.3f}}', '#' * (i % 97), flush=True)\n"
    f"    if i >= {TICKER_PREFILL_LINES}:\n"
    f"        time.sleep({1 / TICKER_LINES_PER_S})\n"
)
_CLK_TCK: Final = os.sysconf("SC_CLK_TCK")
T = TypeVar("T")
_SCRIPT: Final = str(Path(__file__).resolve())  # viewer processes run this file


class BenchError(Exception):
    """The benchmark could not measure what it was asked to."""


@dataclass(frozen=True)
class Profile:
    """A resolution profile: what a session asks for."""

    name: str
    width: int
    height: int
    fps: int


PROFILES: Final = (
    Profile("720p30", 1280, 720, 30),
    Profile("1080p30", 1920, 1080, 30),
    Profile("1080p60", 1920, 1080, 60),
)
KINDS: Final = ("desktop", "game")


def desktop_app() -> tuple[str, ...]:
    """The desktop session's app: a maximized xterm whose output keeps scrolling."""
    return ("xterm", "-maximized", "-e", sys.executable, "-c", TICKER)


# --- node settings ---------------------------------------------------------------------


def _default_profile(kind: str) -> BitrateProfile:
    return GAME_PROFILE if kind == "game" else DESKTOP_PROFILE


def _ladder(kind: str, profile: Profile) -> ladder_policy.Ladder:
    make = ladder_policy.game_ladder if kind == "game" else ladder_policy.desktop_ladder
    return make(profile.width, profile.height, profile.fps)


def pinned_bitrate_profile(kind: str, profile: Profile) -> BitrateProfile:
    """The kind's bitrate profile with min and start raised to the top rung's floor (no step-down)."""
    default = _default_profile(kind)
    floor = _ladder(kind, profile).rungs[0].floor_bps
    start = max(default.start_bps, floor)
    return BitrateProfile(
        f"{default.name}-bench",
        min_bps=max(default.min_bps, floor),
        max_bps=max(default.max_bps, start),
        start_bps=start,
    )


def default_start_rung(kind: str, profile: Profile) -> ladder_policy.Rung:
    """The rung a node with the default bitrate profile starts this profile at."""
    return ladder_policy.initial_state(_ladder(kind, profile), _default_profile(kind).start_bps).rung


@dataclass(frozen=True)
class GpuSetup:
    """Where game sessions render: ``renderer`` (RuntimeConfig.game_renderer) and the seat's ``gpu``
    (None: a CPU host; set, the sessions run as on a host with NVIDIA GPUs)."""

    renderer: str = "auto"
    gpu: int | None = None


def runtime_config(kind: str, profile: Profile, setup: GpuSetup = GpuSetup()) -> RuntimeConfig:
    return RuntimeConfig(advertise_addresses=("127.0.0.1",), bitrate_profile=pinned_bitrate_profile(kind, profile),
                         gpu_render=setup.gpu is not None, game_renderer=setup.renderer)


async def node_encoder() -> tuple[Selection, tuple[ProbeResult, ...]]:
    """The encoder a node on this machine picks for an aiortc viewer, and the probe behind it."""
    probes = await probe_all_async(SENDABLE_BACKENDS)
    selection = choose_backend(
        probes, encoder_preference="auto", codec_preference="auto", peer_codecs=AIORTC_VIDEO_CODECS
    )
    return selection, probes


# --- CPU accounting ----------------------------------------------------------------------


def _proc_stats() -> dict[int, tuple[int, float]]:
    """pid -> (ppid, CPU seconds user+sys) of every process now (Linux /proc)."""
    out: dict[int, tuple[int, float]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited meanwhile
        out[int(entry.name)] = (int(rest[1]), (int(rest[11]) + int(rest[12])) / _CLK_TCK)
    return out


def tree_cpu_seconds(roots: Sequence[int], stats: dict[int, tuple[int, float]] | None = None) -> float:
    """CPU seconds (user+sys, all threads) of the processes ``roots`` and all their descendants."""
    stats = _proc_stats() if stats is None else stats
    children: dict[int, list[int]] = {}
    for pid, (ppid, _cpu) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo, seen = 0.0, list(roots), set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in stats:
            continue
        seen.add(pid)
        total += stats[pid][1]
        todo.extend(children.get(pid, ()))
    return total


def _machine_cpu() -> tuple[float, float] | None:
    """(busy CPU seconds of the whole machine, CPU seconds of this process and its reaped children)."""
    busy = machine_busy_cpu_s()
    if busy is None:
        return None
    own = os.times()
    return busy, own.user + own.system + own.children_user + own.children_system


# --- 1. frame cost -----------------------------------------------------------------------


@dataclass(frozen=True)
class FrameCost:
    """One source at one profile: per-frame cost in ms, paced at the profile's fps."""

    source: str  # "desktop" (x11grab of Xvfb) | "game" (render)
    capture: str  # the FrameSource backend: x11grab, mss, game
    profile: str
    width: int
    height: int
    fps: int
    encoder: str
    frames: int
    capture_p50: float
    capture_p95: float
    convert_p50: float  # colour conversion, part of encode
    encode_p50: float  # conversion + encode, as the node's stats count it
    encode_p95: float
    achieved_fps: float  # frames / wall time, paced at fps (lower: grab + encode did not fit)


def measure_frame_cost(
    source: FrameSource,
    backend: Backend,
    *,
    source_name: str,
    profile: Profile,
    frames: int,
    bitrate_bps: int,
    stop: threading.Event | None = None,
) -> FrameCost:
    """Grab and encode ``frames`` frames paced at ``profile.fps`` (blocking: run it in a thread)."""
    config = EncoderConfig(
        profile.width,
        profile.height,
        float(profile.fps),
        bitrate_bps,
        source_format="bgr0" if source.backend == "x11grab" else "bgra",  # as SessionRuntime opens it
    )
    capture_ms: list[float] = []
    convert_ms: list[float] = []
    total_ms: list[float] = []
    period_s = 1.0 / profile.fps
    with VideoEncoder(backend, config) as enc:
        for _ in range(WARMUP_FRAMES):
            enc.encode(source.grab())
        start = next_tick = time.monotonic()
        for _ in range(frames):
            if stop is not None and stop.is_set():
                break
            now = time.monotonic()
            if now < next_tick:
                time.sleep(next_tick - now)
                now = next_tick
            late = int((now - next_tick) / period_s)  # whole intervals behind are not made up (as FramePipeline)
            next_tick += (late + 1) * period_s
            t0 = time.perf_counter()
            frame = source.grab()
            capture_ms.append((time.perf_counter() - t0) * 1000.0)
            enc.encode(frame)
            last = enc.stats.last
            assert last is not None
            convert_ms.append(last.convert_ms)
            total_ms.append(last.total_ms)
        wall = time.monotonic() - start
    return FrameCost(
        source=source_name,
        capture=source.backend,
        profile=profile.name,
        width=profile.width,
        height=profile.height,
        fps=profile.fps,
        encoder=backend.name,
        frames=len(total_ms),
        capture_p50=percentile(capture_ms, 50),
        capture_p95=percentile(capture_ms, 95),
        convert_p50=percentile(convert_ms, 50),
        encode_p50=percentile(total_ms, 50),
        encode_p95=percentile(total_ms, 95),
        achieved_fps=len(total_ms) / wall if wall > 0 else 0.0,
    )


async def _in_thread(fn: Callable[[threading.Event], T]) -> T:
    """Run ``fn(stop)`` in a thread; on cancellation set ``stop`` and wait for the thread before re-raising."""
    stop = threading.Event()
    future = asyncio.ensure_future(asyncio.to_thread(fn, stop))
    try:
        return await asyncio.shield(future)
    finally:
        stop.set()
        await asyncio.wait({future})  # the thread owns the capture: nobody closes it under a grab


def _wait_for_motion(source: FrameSource, stop: threading.Event) -> None:
    """Block until the screen changes between two grabs (the app is up and scrolling)."""
    deadline = time.monotonic() + MOTION_DEADLINE_S
    first = bytes(source.grab().planes[0])
    while not stop.is_set():
        if bytes(source.grab().planes[0]) != first:
            return
        if time.monotonic() > deadline:
            raise BenchError(f"the desktop did not change within {MOTION_DEADLINE_S:.0f} s")
        time.sleep(0.05)


async def desktop_frame_cost(profile: Profile, backend: Backend, frames: int) -> FrameCost:
    """x11grab of an Xvfb desktop (openbox + the scrolling xterm), encoded as the node would."""
    display = VirtualDisplay(DisplayConfig(width=profile.width, height=profile.height, app=desktop_app()))
    async with display:
        source = await asyncio.to_thread(open_capture, display.name, profile.width, profile.height)
        try:
            await _in_thread(lambda stop: _wait_for_motion(source, stop))
            bitrate = pinned_bitrate_profile("desktop", profile).start_bps
            return await _in_thread(
                lambda stop: measure_frame_cost(
                    source, backend, source_name="desktop", profile=profile, frames=frames, bitrate_bps=bitrate,
                    stop=stop,
                )
            )  # fmt: skip
        finally:
            await asyncio.to_thread(source.close)


async def game_frame_cost(profile: Profile, backend: Backend, frames: int, setup: GpuSetup = GpuSetup()) -> FrameCost:
    """The built-in game's render (numpy, or OpenGL with ``--game-renderer gl``), encoded as the node would."""
    renderer: GameRendererKind = "gl" if setup.renderer == "gl" else "cpu"
    source = GameCapture(Game(profile.width, profile.height), wall_clock_ms, renderer=renderer, gl_device=setup.gpu)
    bitrate = pinned_bitrate_profile("game", profile).start_bps
    return await _in_thread(
        lambda stop: measure_frame_cost(
            source, backend, source_name="game", profile=profile, frames=frames, bitrate_bps=bitrate, stop=stop
        )
    )


# --- viewers in child processes ----------------------------------------------------------


class ViewerProcess:
    """A ``tests.streamer.viewer.Viewer`` in a child process, driven over JSON lines on stdin/stdout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        self._lock = asyncio.Lock()  # one request at a time
        self.pid = proc.pid

    @classmethod
    async def spawn(cls) -> ViewerProcess:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            _SCRIPT,
            "--viewer-worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            preexec_fn=die_with_parent,  # a killed benchmark leaves no viewer behind
        )
        return cls(proc)

    async def _send(self, msg: dict[str, Any]) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write((json.dumps(msg) + "\n").encode())
        await self._proc.stdin.drain()

    async def _receive(self) -> dict[str, Any]:
        assert self._proc.stdout is not None
        try:
            line = await asyncio.wait_for(self._proc.stdout.readline(), VIEWER_REPLY_TIMEOUT_S)
        except TimeoutError:
            raise BenchError(f"viewer process {self.pid} did not answer in {VIEWER_REPLY_TIMEOUT_S:.0f} s") from None
        if not line:
            raise BenchError(f"viewer process {self.pid} exited (status {await self._proc.wait()})")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise BenchError(f"viewer process {self.pid}: {reply['error']}")
        return reply

    async def connect(self, runtime: SessionRuntime) -> None:
        """Offer to ``runtime`` through the child's ``Viewer.connect``; returns once its data channel is open."""
        async with self._lock:
            await self._send({"cmd": "connect"})
            offer = await self._receive()
            replies = await runtime.handle_signal(offer)
            await self._send({"replies": replies})
            await self._receive()

    async def frames(self, since: float = 0.0, until: float = float("inf")) -> dict[str, Any]:
        """Frames decoded with ``since <= at < until`` (monotonic s): count, total, last size."""
        async with self._lock:
            await self._send({"cmd": "frames", "since": since, "until": until if until != float("inf") else None})
            return await self._receive()

    async def close(self) -> None:
        """Ask the child to close its peer and exit; kill it if it does not."""
        proc = self._proc
        if proc.returncode is None:
            with contextlib.suppress(OSError, BenchError, RuntimeError):
                async with self._lock:
                    await self._send({"cmd": "quit"})
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), VIEWER_EXIT_TIMEOUT_S)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def _viewer_worker() -> None:
    """The child side of ``ViewerProcess``: one decode-only Viewer, commands from stdin."""
    from tests.streamer.viewer import Viewer  # here, so the node process never imports test code it needs not

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def write(msg: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()

    async def relay(offer: dict[str, Any]) -> list[dict[str, Any]]:
        write(offer)
        reply = json.loads(await reader.readline())
        return list(reply["replies"])

    viewer = Viewer(keep_images=False)
    try:
        while line := await reader.readline():
            msg = json.loads(line)
            try:
                if msg["cmd"] == "connect":
                    await viewer.connect(relay)
                    write({"ok": True})
                elif msg["cmd"] == "frames":
                    since, until = msg["since"], msg["until"]
                    frames = viewer.frames
                    count = sum(1 for f in frames if f.at >= since and (until is None or f.at < until))
                    last = frames[-1] if frames else None
                    write({
                        "count": count,
                        "total": len(frames),
                        "width": last.width if last else None,
                        "height": last.height if last else None,
                        "first_keyframe": frames[0].key_frame if frames else None,
                    })  # fmt: skip
                elif msg["cmd"] == "quit":
                    return
                else:
                    write({"error": f"unknown command {msg['cmd']!r}"})
            except Exception as exc:  # boundary: report to the parent, keep serving
                write({"error": repr(exc)})
    finally:
        await viewer.close()


# --- 2./3. sessions streaming to viewers ---------------------------------------------------


@dataclass
class Stream:
    """One session of the node and its viewer."""

    runtime: SessionRuntime
    viewer: ViewerProcess
    ended: list[dict[str, Any]] = field(default_factory=list)  # "ended" events: the session stopped itself

    @property
    def xvfb_pid(self) -> int | None:
        return self.runtime.pids.get("xvfb")

    @property
    def app_pids(self) -> list[int]:
        return [pid for role, pid in self.runtime.pids.items() if role != "xvfb"]


@dataclass(frozen=True)
class StreamSample:
    """One session over one measurement window."""

    session_id: str
    received_fps: float  # frames the viewer decoded per second
    received: int  # frames the viewer decoded in the window
    width: int | None  # of the newest decoded frame
    height: int | None
    sent_fps: float  # frames the node's frame thread encoded and handed to the track, per second
    target_fps: int | None  # the frame thread's pacing rate
    encode_p50: float | None  # conversion + encode, ms (the encoder's rolling window)
    encode_p95: float | None
    grab_p50: float | None  # capture or render, ms
    bitrate_bps: int | None  # measured RTP payload rate
    late: int  # frame-thread ticks lost in the window because a frame took longer than its interval
    backpressure: int  # ticks skipped in the window because the sender had not taken the last packets
    encoder: str | None


@dataclass(frozen=True)
class RampStep:
    """N sessions streaming at once, measured over one window."""

    kind: str
    profile: str
    fps: int
    sessions: int
    window_s: float
    streams: tuple[StreamSample, ...]
    process_cpu: float  # this process (node: all threads), CPU seconds / wall seconds (1.0 = one core)
    xvfb_cpu: float  # the sessions' Xvfb servers
    app_cpu: float  # window manager + app trees (not node work)
    viewer_cpu: float  # viewer processes (not node work)
    other_cpu: float  # every other process of the machine: load that competes with the node

    @property
    def node_cpu(self) -> float:
        """Node CPU of all N sessions: this process + their Xvfb servers (1.0 = one core)."""
        return self.process_cpu + self.xvfb_cpu

    @property
    def cpu_per_stream(self) -> float:
        return self.node_cpu / self.sessions

    @property
    def min_fps(self) -> float:
        return min(s.received_fps for s in self.streams)

    @property
    def mean_fps(self) -> float:
        return sum(s.received_fps for s in self.streams) / len(self.streams)

    @property
    def ok(self) -> bool:
        """Every viewer received at least SUSTAIN_RATIO of the target frame rate."""
        return all(s.received_fps >= SUSTAIN_RATIO * self.fps for s in self.streams)


@dataclass(frozen=True)
class RampResult:
    """Sessions added one at a time until one viewer fell behind or the cap was reached."""

    kind: str
    profile: Profile
    max_sessions: int
    steps: tuple[RampStep, ...]
    pids: tuple[int, ...]  # every process the ramp started (sessions' Xvfb/WM/app, viewers)
    session_ids: tuple[str, ...]

    @property
    def sustained(self) -> int:
        """The largest N at which every viewer kept up (0: not even one)."""
        n = 0
        for step in self.steps:
            if not step.ok:
                break
            n = step.sessions
        return n

    @property
    def capped(self) -> bool:
        """True when the cap stopped the ramp, not a failure."""
        return self.sustained == self.max_sessions


async def _open_stream(
    stack: contextlib.AsyncExitStack, kind: str, profile: Profile, session_id: str, desktop_app_argv: Sequence[str],
    setup: GpuSetup = GpuSetup(),
) -> Stream:
    """Start a viewer process and a session, connect them; both are stopped when ``stack`` closes."""
    viewer = await ViewerProcess.spawn()  # imports aiortc while the session starts
    stack.push_async_callback(viewer.close)
    spec = SessionSpec(
        id=session_id,
        kind=kind,
        width=profile.width,
        height=profile.height,
        fps=profile.fps,
        app_command=tuple(desktop_app_argv),
        gpu=setup.gpu,
    )
    ended: list[dict[str, Any]] = []

    async def on_event(name: str, info: dict[str, Any]) -> None:
        if name == "ended":  # the session stopped itself (app exited, capture failed)
            ended.append(info)

    stream = Stream(SessionRuntime(spec, runtime_config(kind, profile, setup), on_event=on_event), viewer, ended)
    stack.push_async_callback(stream.runtime.stop)  # LIFO: the runtime stops after its viewer closed
    await stream.runtime.start()
    await viewer.connect(stream.runtime)
    return stream


async def _wait_first_frames(streams: Sequence[Stream]) -> None:
    deadline = time.monotonic() + FIRST_FRAME_DEADLINE_S
    for stream in streams:
        while (await stream.viewer.frames())["total"] == 0:
            _check_running(stream)
            if time.monotonic() > deadline:
                raise BenchError(f"{stream.runtime.spec.id}: no frame decoded in {FIRST_FRAME_DEADLINE_S:.0f} s")
            await asyncio.sleep(0.05)


def _check_running(stream: Stream) -> None:
    if stream.ended or stream.runtime.state != "running":
        raise BenchError(f"session {stream.runtime.spec.id} is {stream.runtime.state}: {stream.ended}")


def _cpu_snapshot(streams: Sequence[Stream]) -> tuple[float, float, float, float, float]:
    """(this process, Xvfb servers, WM + app trees, viewer trees, whole machine busy) CPU seconds now."""
    busy = machine_busy_cpu_s()
    if busy is None:
        raise BenchError("the machine's CPU time is read from /proc/stat (Linux only)")
    stats = _proc_stats()
    xvfb = [s.xvfb_pid for s in streams if s.xvfb_pid is not None]
    apps = [pid for s in streams for pid in s.app_pids]
    return (
        own_cpu_s(),
        tree_cpu_seconds(xvfb, stats),
        tree_cpu_seconds(apps, stats),
        tree_cpu_seconds([s.viewer.pid for s in streams], stats),
        busy,
    )


async def measure_streams(streams: Sequence[Stream], kind: str, profile: Profile, window_s: float) -> RampStep:
    """Count every viewer's decoded frames and the CPU of node, Xvfb, apps and viewers over ``window_s``."""
    for stream in streams:
        _check_running(stream)
    before = [s.runtime.stats() for s in streams]
    cpu0, t0 = _cpu_snapshot(streams), time.monotonic()
    await asyncio.sleep(window_s)
    cpu1, t1 = _cpu_snapshot(streams), time.monotonic()
    after = [s.runtime.stats() for s in streams]
    wall = t1 - t0
    counts = await asyncio.gather(*(s.viewer.frames(t0, t1) for s in streams))
    samples = []
    for stream, got, stats0, stats in zip(streams, counts, before, after, strict=True):
        _check_running(stream)
        samples.append(
            StreamSample(
                session_id=stream.runtime.spec.id,
                received_fps=got["count"] / wall,
                received=got["count"],
                width=got["width"],
                height=got["height"],
                sent_fps=(stats["frames"] - stats0["frames"]) / wall,
                target_fps=stats["target_fps"],
                encode_p50=stats["encode_ms"],
                encode_p95=stats["encode_ms_p95"],
                grab_p50=stats["grab_ms"],
                bitrate_bps=stats["bitrate_bps"],
                late=stats["skipped_late"] - stats0["skipped_late"],
                backpressure=stats["skipped_backpressure"] - stats0["skipped_backpressure"],
                encoder=stats["encoder"],
            )
        )
    process, xvfb, app, viewer, busy = ((b - a) / wall for a, b in zip(cpu0, cpu1, strict=True))
    other = max(0.0, busy - process - xvfb - app - viewer)
    return RampStep(
        kind, profile.name, profile.fps, len(streams), wall, tuple(samples), process, xvfb, app, viewer, other
    )


async def run_ramp(
    kind: str,
    profile: Profile,
    *,
    max_sessions: int,
    warmup_s: float,
    window_s: float,
    desktop_app_argv: Sequence[str] | None = None,
    progress: Callable[[RampStep], None] | None = None,
    setup: GpuSetup = GpuSetup(),
) -> RampResult:
    """Add sessions (each with a viewer) one at a time; measure all after each; stop at a failure or the cap.

    Everything started is stopped before this returns or raises (also when cancelled).
    """
    app = tuple(desktop_app_argv) if desktop_app_argv is not None else desktop_app()
    streams: list[Stream] = []
    steps: list[RampStep] = []
    pids: list[int] = []
    ids: list[str] = []
    async with contextlib.AsyncExitStack() as stack:
        for n in range(1, max_sessions + 1):
            session_id = f"bench-{kind}-{profile.name}-{n}"
            ids.append(session_id)
            stream = await _open_stream(stack, kind, profile, session_id, app, setup)
            streams.append(stream)
            pids.extend([*stream.runtime.pids.values(), stream.viewer.pid])
            await _wait_first_frames(streams)
            await asyncio.sleep(warmup_s)  # the new stream's first keyframe and ramp-up stay out of the window
            step = await measure_streams(streams, kind, profile, window_s)
            steps.append(step)
            if progress is not None:
                progress(step)
            if not step.ok:
                break
    return RampResult(kind, profile, max_sessions, tuple(steps), tuple(pids), tuple(ids))


# --- printing ----------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _pct(value: float) -> str:
    return f"{value * 100:.0f} %"


def print_frame_costs(costs: Sequence[FrameCost]) -> None:
    print_table(
        ["source", "capture", "profile", "size", "capture p50", "p95", "encode p50", "p95", "(conv p50)",
         "budget", "fps", "fits?"],
        [
            [c.source, c.capture, c.profile, f"{c.width}x{c.height}", _ms(c.capture_p50), _ms(c.capture_p95),
             _ms(c.encode_p50), _ms(c.encode_p95), _ms(c.convert_p50), _ms(1000 / c.fps),
             f"{c.achieved_fps:.1f}", "yes" if c.capture_p95 + c.encode_p95 < 1000 / c.fps else "no"]
            for c in costs
        ],
    )  # fmt: skip
    print(
        "  (ms per frame; encode = conversion + encode; budget = 1000/fps; fits? = capture p95 + encode p95 "
        "under budget; fps = frames / wall time, paced)"
    )


def print_single_streams(results: Sequence[RampResult]) -> None:
    firsts = [(r, r.steps[0]) for r in results if r.steps]
    base = {r.kind: s.node_cpu for r, s in firsts if r.profile.name == PROFILES[0].name}
    rows = []
    for result, step in firsts:
        s = step.streams[0]
        ratio = step.node_cpu / base[result.kind] if base.get(result.kind) else None
        rows.append([
            result.kind, result.profile.name, f"{s.width}x{s.height}", f"{s.received_fps:.1f}/{step.fps}",
            _pct(step.node_cpu), _pct(step.process_cpu), _pct(step.xvfb_cpu) if result.kind == "desktop" else "-",
            "-" if ratio is None else f"{ratio:.2f}", _ms(s.encode_p50), _ms(s.encode_p95), _ms(s.grab_p50),
            "-" if s.bitrate_bps is None else f"{s.bitrate_bps / 1e6:.1f}",
            _pct(step.app_cpu) if result.kind == "desktop" else "-", _pct(step.viewer_cpu),
        ])  # fmt: skip
    print_table(
        ["kind", "profile", "received", "fps", "node CPU", "process", "Xvfb", f"vs {PROFILES[0].name}",
         "enc p50", "p95", "grab p50", "Mbps", "app CPU", "viewer CPU"],
        rows,
    )  # fmt: skip
    print(
        "  (node CPU = this process, all threads, + the session's Xvfb; 100 % = one core; enc/grab ms from the "
        "node's own stats while streaming; app = openbox + xterm + its output loop; viewer = aiortc decode)"
    )


def print_ramps(results: Sequence[RampResult]) -> None:
    rows = []
    for result in results:
        for step in result.steps:
            rows.append([
                result.kind, result.profile.name, str(step.sessions), str(step.fps), f"{step.min_fps:.1f}",
                f"{step.mean_fps:.1f}", f"{min(s.sent_fps for s in step.streams):.1f}",
                str(sum(s.late for s in step.streams)), _ms(max(s.encode_p95 or 0.0 for s in step.streams)),
                _pct(step.node_cpu), _pct(step.cpu_per_stream), _pct(step.app_cpu + step.viewer_cpu),
                _pct(step.other_cpu), "ok" if step.ok else "FAIL",
            ])  # fmt: skip
    print_table(
        ["kind", "profile", "N", "target", "min fps", "mean fps", "min sent", "late", "enc p95",
         "node CPU", "per stream", "apps+viewers", "others", f">= {SUSTAIN_RATIO:.0%}"],
        rows,
    )  # fmt: skip
    print("  (min/mean fps: frames each viewer decoded per second over the window; min sent: frames the slowest")
    print("   session's frame thread encoded per second; late: frame-thread ticks lost in the window, all sessions,")
    print("   because a frame took longer than its interval; enc p95: worst session, ms; apps+viewers: desktop apps")
    print("   and viewer processes; others: every other process on the machine, which competes with the node)")
    print(f"\n   Streams one machine ({os.cpu_count()} CPUs) sustains at full frame rate")
    profiles = list(dict.fromkeys(r.profile.name for r in results))
    kinds = list(dict.fromkeys(r.kind for r in results))
    by = {(r.kind, r.profile.name): r for r in results}
    print_table(
        ["kind", *profiles],
        [[kind, *(_sustained(by[(kind, p)]) if (kind, p) in by else "-" for p in profiles)] for kind in kinds],
    )
    print(f"  (N+ = the cap of {results[0].max_sessions if results else 0} sessions was reached without a failure)")


def _sustained(result: RampResult) -> str:
    return f"{result.sustained}{'+' if result.capped else ''}"


# --- main --------------------------------------------------------------------------------


def _note(text: str) -> None:
    """Progress on stderr, after what the tables printed so far."""
    sys.stdout.flush()
    print(f"  .. {text}", file=sys.stderr, flush=True)


async def amain(args: argparse.Namespace) -> int:
    profiles = [p for p in PROFILES if p.name in args.profiles]
    kinds = [k for k in KINDS if k in args.kinds]
    frames = 45 if args.quick else 150
    warmup_s = 1.0 if args.quick else 2.0
    window_s = args.window_s or (3.0 if args.quick else 6.0)
    max_sessions = args.max_sessions or (QUICK_MAX_SESSIONS if args.quick else DEFAULT_MAX_SESSIONS)
    setup = GpuSetup(args.game_renderer, args.gpu)
    print(f"game renderer: {setup.renderer}; seat GPU: {setup.gpu if setup.gpu is not None else 'none (CPU host)'}")

    machine_before, wall_before = _machine_cpu(), time.perf_counter()
    selection, probes = await node_encoder()
    backend = selection.backend
    print(f"machine: {os.cpu_count()} CPUs; node encoder: {backend.name} ({backend.webrtc_codec})")
    print(f"  selection: {'; '.join(selection.reasons)}")
    for p in probes:
        if not p.ok:
            print(f"  unavailable: {p.name}: {p.reason}")
    for kind in kinds:
        for profile in profiles:
            rung = default_start_rung(kind, profile)
            if (rung.width, rung.height, rung.fps) != (profile.width, profile.height, profile.fps):
                print(
                    f"  note: with its default bitrate profile a node starts a {kind} {profile.name} at "
                    f"{rung.width}x{rung.height}@{rung.fps} (start {_default_profile(kind).start_bps / 1e6:g} Mbps "
                    f"< floor {_ladder(kind, profile).rungs[0].floor_bps / 1e6:.2f} Mbps); pinned here"
                )

    print(f"\n1. Frame cost, one stream paced at the profile's fps, {frames} frames, {backend.name}")
    costs = []
    for profile in profiles:
        for kind in kinds:
            _note(f"frame cost {kind} {profile.name}")
            if kind == "desktop":
                costs.append(await desktop_frame_cost(profile, backend, frames))
            else:
                costs.append(await game_frame_cost(profile, backend, frames, setup))
    print_frame_costs(costs)

    def progress(step: RampStep) -> None:
        _note(
            f"{step.kind} {step.profile} N={step.sessions}: min {step.min_fps:.1f} fps received, "
            f"min {min(x.sent_fps for x in step.streams):.1f} sent, node CPU {_pct(step.node_cpu)}, "
            f"others {_pct(step.other_cpu)}: {'ok' if step.ok else 'FAIL'}"
        )

    results = []
    for kind in kinds:
        for profile in profiles:
            results.append(
                await run_ramp(
                    kind, profile, max_sessions=max_sessions, warmup_s=warmup_s, window_s=window_s, progress=progress,
                    setup=setup,
                )
            )
    print(f"\n2. One session streaming to one aiortc viewer over loopback ({window_s:g} s window)")
    print_single_streams(results)
    print(
        f"\n3. Concurrent sessions in this one node process, each with its own viewer process "
        f"({window_s:g} s window after {warmup_s:g} s warm-up, cap {max_sessions})"
    )
    print_ramps(results)

    machine_after = _machine_cpu()
    wall = time.perf_counter() - wall_before
    if machine_before is not None and machine_after is not None:
        others = (machine_after[0] - machine_before[0]) - (machine_after[1] - machine_before[1])
        share = max(0.0, others) / (wall * (os.cpu_count() or 1))
        print(
            f"\nother processes used {share:.0%} of this machine's CPU during the {wall:.0f} s run "
            "(they compete with the node and skew every figure)"
        )
    else:
        print(f"\nrun took {wall:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short windows, at most 3 sessions (noisier numbers)")
    parser.add_argument("--profiles", nargs="+", choices=[p.name for p in PROFILES], default=[p.name for p in PROFILES])
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--max-sessions", type=int, default=0, help=f"cap of the ramp (default {DEFAULT_MAX_SESSIONS})")
    parser.add_argument("--window-s", type=float, default=0.0, help="measurement window (default 6, quick 3)")
    parser.add_argument("--game-renderer", choices=("auto", "cpu", "gl"), default="auto",
                        help="the built-in game's renderer (the node's --game-renderer)")
    parser.add_argument("--gpu", type=int, default=None,
                        help="seat the sessions on this GPU, as on a host with NVIDIA GPUs (default: a CPU host)")
    parser.add_argument("--viewer-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.viewer_worker:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent closes us; Ctrl-C is for the parent
        asyncio.run(_viewer_worker())
        return 0
    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 (probed): errors only on stderr
    try:
        return asyncio.run(amain(args))
    except KeyboardInterrupt:
        print("\ninterrupted: every session, display and viewer started was stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
