"""Child programs of ``bench/bench_abr.py``: one video sender and one viewer, each in its own process.

Run by the benchmark (inside a ``tests.netem.lab.Lab`` namespace through ``Lab.popen``, or
side by side on 127.0.0.1 without a Lab), never by hand:

  ``python bench/abr_peers.py sender --mode ours|fixed|stock --advertise IP [--width W ...]``
  ``python bench/abr_peers.py viewer --advertise IP [--browser chromium]``
  ``python bench/abr_peers.py echo --port P`` / ``rttprobe --dst IP --port P --count N``

Signaling and control are JSON lines over stdin/stdout, relayed by the parent (the two
namespaces share no network, the parent holds both pipes): a child prints
``{"sig": {...}}`` for the other side (offer, answer) and ``{"ready": true}`` /
``{"first_frame": t}`` for the parent; it reads ``{"sig": {...}}`` and ``{"cmd": "stop"}``.
After ``stop`` (or EOF on stdin) each child prints one ``{"result": {...}}`` line and exits.
Logs go to stderr.  ICE uses no STUN server (``RTCConfiguration(iceServers=[])``) and offers
exactly ``--advertise`` as host candidate (``streamer.media.peer.advertise_host_addresses``): the
veth address in a namespace, 127.0.0.1 on loopback (aioice skips loopback by itself).

Senders (all send the same picture: ``BusyGame``, the built-in game whose frames carry the
game stamp -- frame number and render time -- with a moving block of fresh noise over a
quarter of the play area, so x264 can fill any bitrate the benchmark asks for; H.264):
  * ``ours``: the node's real path, ``streamer.media.session.SessionRuntime`` as a game session
    (frame thread -> ``VideoEncoder`` -> ``EncodedVideoTrack``, ``FeedbackSender``, the
    control loop applying ``StreamController`` every ``stats_interval_ms``), game profile
    (1-25 Mbps) and game ladder;
  * ``fixed``: the same runtime with a profile whose min = max = start = ``--fixed-bps``,
    so the controller can never move the target and the ladder never leaves the top rung
    (no ``set_bitrate`` call ever happens: the encoder runs at the fixed rate);
  * ``stock``: aiortc's own path: a raw-frame ``VideoStreamTrack`` of the same picture,
    encoded by aiortc's H.264 encoder, whose bitrate aiortc sets from each REMB itself
    (clamped to 0.5-3 Mbps, a new encoder and keyframe on every change over 10 %).
Every sender answers the viewer's input pings through ``streamer.desktop.inputsink.InputRouter``
(``{"t": "ping"}`` -> ``{"t": "pong"}`` at once, on the event loop).

The viewer (aiortc) decodes, reads each frame's stamp (``streamer.desktop.game.read_stamp`` on the
luma plane) and records per frame (arrival wall time, delay = arrival - stamp time in ms,
frame number, size): the namespaces share the machine clock.  Arrival is when aiortc's
receiver hands out the decoded frame (it holds each frame until the next one starts, about
one frame interval).  It counts video RTP payload bytes per 100 ms of wall time (goodput,
retransmissions included) and sends an input ping every ``--ping-ms`` on the data channel.
``viewer --browser chromium`` is headless Chromium instead (``bench/abr_chromium.py``: same
messages, same result keys; ``--advertise`` is then only checked against Chromium's offer).

The sender records every 100 ms (wall time): target bitrate, measured send rate (RTP
payload, outbound-rtp bytesSent per control period), encoded size/fps and the REMB it saw.

Concurrency model: one asyncio loop per child; stdin is read by a reader thread feeding the
loop; the runtime's own threads (frames, encode) as in a node.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's streamer/encoder

import av
import numpy as np
import numpy.typing as npt
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCDataChannel,
    RTCPeerConnection,
    RTCSessionDescription,
    VideoStreamTrack,
)
from aiortc.mediastreams import MediaStreamError

from bench.common import PEERS_LOG_LEVEL_ENV
from broker.protocol import INPUT_CHANNEL_LABEL
from rbcommon.ice import advertise_host_addresses
from streamer.abr.bitrate import GAME_PROFILE, BitrateProfile
from streamer.desktop.game import Game, read_stamp, stamp_height
from streamer.desktop.inputs import InputEvent
from streamer.desktop.inputsink import InputRouter, wall_clock_ms
from streamer.media.peer import codec_preferences
from streamer.media.session import RuntimeConfig, SessionRuntime, SessionSpec
from tests.streamer.viewer import answer_probes

log = logging.getLogger("abr_peers")

SAMPLE_PERIOD_S = 0.1  # sender telemetry sample period
BIN_S = 0.1  # viewer goodput bins (wall time)
STOCK_SEND_RATE_WINDOW_S = 0.2  # stock sender: send rate measured over this window (ours: its control period)
DEFAULT_FIXED_BPS = 6_000_000


def emit(obj: dict[str, Any]) -> None:
    """One JSON line to the parent (stdout is the signaling/control pipe)."""
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def stdin_queue(loop: asyncio.AbstractEventLoop) -> asyncio.Queue[dict[str, Any] | None]:
    """Parsed stdin lines on the loop; None at EOF (a reader thread: stdin may be a pipe in a namespace)."""
    queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    def read() -> None:
        for line in sys.stdin:
            line = line.strip()
            if line:
                try:
                    loop.call_soon_threadsafe(queue.put_nowait, json.loads(line))
                except json.JSONDecodeError:
                    log.warning("bad control line: %r", line[:200])
        loop.call_soon_threadsafe(queue.put_nowait, None)

    threading.Thread(target=read, name="stdin", daemon=True).start()
    return queue


async def parent_signals(queue: asyncio.Queue[dict[str, Any] | None]) -> AsyncIterator[dict[str, Any]]:
    """The ``sig`` payloads the parent relays, until it says stop or closes stdin."""
    while (msg := await queue.get()) is not None and msg.get("cmd") != "stop":
        if msg.get("sig"):
            yield msg["sig"]


# --- the picture ------------------------------------------------------------------------------


class BusyGame(Game):
    """The built-in game plus a moving block of fresh noise every frame (the stamp strip untouched).

    The block covers half the width and half the play area's height and wanders on a
    Lissajous path; its content is a random window of a fixed noise texture, a new window
    every frame, so no motion search finds it: the encoder's rate control alone decides
    the frame sizes, and any bitrate up to well beyond 8 Mbps is used.
    """

    def __init__(self, width: int, height: int, seed: int = 7) -> None:
        super().__init__(width, height)
        rng = np.random.default_rng(seed)
        noise = rng.integers(0, 256, size=(2 * height, 2 * width, 4), dtype=np.uint8)
        noise[..., 3] = 255
        self._noise = noise
        self._rng = np.random.default_rng(seed + 1)

    def render(self, now_ms: int) -> npt.NDArray[np.uint8]:
        buf = super().render(now_ms)
        top = stamp_height(self.width)
        play_h = self.height - top
        bh, bw = play_h // 2, self.width // 2
        t = now_ms / 1000.0
        x = int((0.5 + 0.5 * math.sin(t * 0.9)) * (self.width - bw))
        y = top + int((0.5 + 0.5 * math.cos(t * 0.6)) * (play_h - bh))
        ny = int(self._rng.integers(0, self._noise.shape[0] - bh))
        nx = int(self._rng.integers(0, self._noise.shape[1] - bw))
        buf[y : y + bh, x : x + bw] = self._noise[ny : ny + bh, nx : nx + bw]
        return buf


# --- senders ------------------------------------------------------------------------------------


async def run_runtime_sender(args: argparse.Namespace) -> dict[str, Any]:
    """``ours`` / ``fixed``: a real ``SessionRuntime`` game session with the busy picture."""
    if args.mode == "ours":
        profile = GAME_PROFILE
    else:
        profile = BitrateProfile("fixed", args.fixed_bps, args.fixed_bps, args.fixed_bps)
    config = RuntimeConfig(advertise_addresses=(args.advertise,), bitrate_profile=profile)
    spec = SessionSpec(id=f"bench-{args.mode}", kind="game", width=args.width, height=args.height, fps=args.fps)
    runtime = SessionRuntime(spec, config, game_factory=BusyGame)
    await runtime.start()
    samples: list[list[Any]] = []
    decisions: dict[int, dict[str, Any]] = {}  # every control step of the run, by its now_ms

    async def sample() -> None:
        while True:
            s = runtime.stats()
            decisions.update((d["now_ms"], d) for d in s["decisions"])
            samples.append([round(time.time(), 3), s["target_bps"], s["bitrate_bps"], s["width"], s["height"],
                            s["target_fps"], s["bitrate_reason"], s["ladder_reason"], s["remb_bps"]])  # fmt: skip
            await asyncio.sleep(SAMPLE_PERIOD_S)

    queue = stdin_queue(asyncio.get_running_loop())
    emit({"ready": True})
    sampler = asyncio.ensure_future(sample())
    try:
        async for sig in parent_signals(queue):
            for reply in await runtime.handle_signal(sig):
                emit({"sig": reply})
        stats = runtime.stats()
    finally:
        sampler.cancel()
        await runtime.stop()
    return {
        "mode": args.mode,
        "samples": samples,
        "frames": stats["frames"],
        "skipped_late": stats["skipped_late"],
        "skipped_backpressure": stats["skipped_backpressure"],
        "keyframes_requested": stats["keyframe_requests"],
        "retransmits": stats["retransmits"],
        "encode_ms": stats["encode_ms"],
        "decision_counts": stats["decision_counts"],
        "decisions": [decisions[k] for k in sorted(decisions)],
    }


class RawGameTrack(VideoStreamTrack):
    """Raw frames of the busy game at 30 fps (``VideoStreamTrack`` pacing), rendered off the loop."""

    def __init__(self, game: Game) -> None:
        super().__init__()
        self._game = game

    async def recv(self) -> av.VideoFrame:
        pts, time_base = await self.next_timestamp()
        frame = await asyncio.to_thread(self._render)
        frame.pts, frame.time_base = pts, time_base
        return frame

    def _render(self) -> av.VideoFrame:
        return av.VideoFrame.from_ndarray(self._game.render(wall_clock_ms()), format="bgra")


class _NoInput:
    """Input sink of the stock sender: pings are answered by the router, other input is dropped."""

    def submit(self, event: InputEvent) -> None:
        pass

    def release_all(self) -> None:
        pass


async def run_stock_sender(args: argparse.Namespace) -> dict[str, Any]:
    """``stock``: aiortc encodes raw frames itself and follows REMB its own way."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    track = RawGameTrack(BusyGame(args.width, args.height))
    router = InputRouter(_NoInput())

    def on_channel(channel: RTCDataChannel) -> None:
        channel.on("message", lambda raw: router.handle(raw, lambda p: channel.send(json.dumps(p))))

    pc.on("datachannel", on_channel)
    samples: list[list[Any]] = []

    async def sample() -> None:
        last_bytes, last_t, rate = 0, time.monotonic(), None
        while True:
            await asyncio.sleep(SAMPLE_PERIOD_S)
            senders = [s for s in pc.getSenders() if s.track is not None]
            if not senders:
                continue
            sender = senders[0]
            now = time.monotonic()
            if now - last_t >= STOCK_SEND_RATE_WINDOW_S:
                sent = sum(int(s.bytesSent) for s in (await sender.getStats()).values() if s.type == "outbound-rtp")
                rate, last_bytes, last_t = round((sent - last_bytes) * 8 / (now - last_t)), sent, now
            encoder = getattr(sender, "_RTCRtpSender__encoder", None)  # bench-only peek at aiortc's encoder
            target = getattr(encoder, "target_bitrate", None)
            row = [round(time.time(), 3), target, rate, args.width, args.height, 30, "aiortc_remb", None, None]
            samples.append(row)

    queue = stdin_queue(asyncio.get_running_loop())
    emit({"ready": True})
    sampler = asyncio.ensure_future(sample())
    try:
        async for sig in parent_signals(queue):
            if sig.get("type") == "offer":
                await pc.setRemoteDescription(RTCSessionDescription(sdp=sig["sdp"], type="offer"))
                pc.addTrack(track)
                for transceiver in pc.getTransceivers():
                    if transceiver.kind == "video":
                        transceiver.setCodecPreferences(codec_preferences("H264"))  # same codec as ours
                advertise_host_addresses(pc, (args.advertise,))
                await pc.setLocalDescription(await pc.createAnswer())
                emit({"sig": {"type": "answer", "sdp": pc.localDescription.sdp}})
    finally:
        sampler.cancel()
        await pc.close()
    return {"mode": "stock", "samples": samples}


# --- viewer ---------------------------------------------------------------------------------------


async def run_viewer(args: argparse.Namespace) -> dict[str, Any]:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    transceiver = pc.addTransceiver("video", direction="recvonly")
    channel = pc.createDataChannel(INPUT_CHANNEL_LABEL)
    frames: list[list[Any]] = []
    bins: dict[int, int] = {}
    unreadable = 0
    # as the web client does: the node's delay probes, with the frames decoded so far
    answer_probes(pc, transceiver.receiver, lambda: len(frames) + unreadable)
    ping_sent: dict[int, float] = {}  # id -> wall time sent
    pings: list[list[float]] = []  # [sent wall time, rtt ms]
    receiver = transceiver.receiver
    handle_rtp = receiver._handle_rtp_packet  # bench-only: count payload bytes as they arrive

    async def counting(packet: Any, arrival_time_ms: int) -> None:
        key = int(time.time() / BIN_S)
        bins[key] = bins.get(key, 0) + len(packet.payload)
        await handle_rtp(packet, arrival_time_ms)

    receiver._handle_rtp_packet = counting  # type: ignore[method-assign]

    async def read(track: MediaStreamTrack) -> None:
        nonlocal unreadable
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                now = time.time()
                assert isinstance(frame, av.VideoFrame)
                luma = frame.to_ndarray(format="yuv420p") if frame.format.name != "yuv420p" else frame.to_ndarray()
                stamp = read_stamp(luma[: stamp_height(frame.width) + 1])
                if stamp is None:
                    unreadable += 1
                    continue
                if not frames:
                    emit({"first_frame": now})
                frames.append([round(now, 4), round(now * 1000 - stamp.ts_ms, 1), stamp.frame_no,
                               frame.width, frame.height])  # fmt: skip

    readers: list[asyncio.Task[None]] = []
    pc.on("track", lambda track: readers.append(asyncio.ensure_future(read(track))))

    def on_message(raw: str | bytes) -> None:
        try:
            msg = json.loads(raw)
        except (ValueError, TypeError):
            return
        if msg.get("t") == "pong" and (sent := ping_sent.pop(msg.get("id"), None)) is not None:
            pings.append([round(sent, 4), round((time.time() - sent) * 1000, 2)])

    channel.on("message", on_message)

    async def ping() -> None:
        next_id = 1
        while True:
            await asyncio.sleep(args.ping_ms / 1000)
            if channel.readyState == "open":
                now = time.time()
                ping_sent[next_id] = now
                channel.send(json.dumps({"t": "ping", "id": next_id, "ts": round(now * 1000, 1)}))
                next_id += 1

    queue = stdin_queue(asyncio.get_running_loop())
    offer = await pc.createOffer()
    advertise_host_addresses(pc, (args.advertise,))
    await pc.setLocalDescription(offer)
    emit({"sig": {"type": "offer", "sdp": pc.localDescription.sdp}})
    pinger = asyncio.ensure_future(ping())
    try:
        async for sig in parent_signals(queue):
            if sig.get("type") == "answer":
                await pc.setRemoteDescription(RTCSessionDescription(sdp=sig["sdp"], type="answer"))
            elif sig.get("type") == "error":
                log.error("sender refused the offer: %s", sig)
    finally:
        pinger.cancel()
        await pc.close()
        for task in readers:
            task.cancel()
    return {
        "frames": frames,
        "unreadable_stamps": unreadable,
        "bins": sorted(bins.items()),
        "bin_s": BIN_S,
        "pings": pings,
        "pings_unanswered": sorted(ping_sent.values()),
    }


async def run_browser_viewer(args: argparse.Namespace) -> dict[str, Any]:
    """``viewer --browser chromium``: headless Chromium in this namespace (``bench/abr_chromium.py``)."""
    from bench.abr_chromium import run_chromium_viewer  # Playwright only where it is used

    queue = stdin_queue(asyncio.get_running_loop())
    return await run_chromium_viewer(advertise=args.advertise, ping_ms=args.ping_ms, bin_s=BIN_S,
                                     signals=parent_signals(queue), emit=emit)  # fmt: skip


# --- path RTT probe (UDP echo) ------------------------------------------------------------------------


def run_echo(args: argparse.Namespace) -> None:
    """Echo UDP datagrams back to their sender until stdin closes (started before the probe)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("0.0.0.0", args.port))
    sock.settimeout(0.2)
    emit({"ready": True})
    stop = threading.Event()

    def wait_eof() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait_eof, daemon=True).start()
    while not stop.is_set():
        try:
            data, addr = sock.recvfrom(2048)
        except TimeoutError:
            continue
        sock.sendto(data, addr)


def run_rttprobe(args: argparse.Namespace) -> dict[str, Any]:
    """``count`` small UDP pings ``interval_ms`` apart to the echo; round trips in ms (lost ones left out)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.settimeout(1.0)
    rtts: list[float] = []
    for seq in range(args.count):
        start = time.monotonic()
        sock.sendto(seq.to_bytes(4, "big") + b"\0" * 96, (args.dst, args.port))
        with contextlib.suppress(TimeoutError):
            while True:
                data, _ = sock.recvfrom(2048)
                if int.from_bytes(data[:4], "big") == seq:
                    rtts.append(round((time.monotonic() - start) * 1000, 3))
                    break
        time.sleep(max(0.0, args.interval_ms / 1000 - (time.monotonic() - start)))
    return {"rtts_ms": rtts, "sent": args.count}


# --- main ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="role", required=True)
    p_send = sub.add_parser("sender")
    p_send.add_argument("--mode", choices=("ours", "fixed", "stock"), required=True)
    p_send.add_argument("--advertise", required=True, help="host candidate address to offer")
    p_send.add_argument("--width", type=int, default=960)
    p_send.add_argument("--height", type=int, default=540)
    p_send.add_argument("--fps", type=int, default=30)
    p_send.add_argument("--fixed-bps", type=int, default=DEFAULT_FIXED_BPS)
    p_view = sub.add_parser("viewer")
    p_view.add_argument("--advertise", required=True)
    p_view.add_argument("--ping-ms", type=float, default=50.0, help="input ping period")
    p_view.add_argument("--browser", choices=("chromium",), help="view in this browser instead of aiortc")
    p_echo = sub.add_parser("echo")
    p_echo.add_argument("--port", type=int, required=True)
    p_probe = sub.add_parser("rttprobe")
    p_probe.add_argument("--dst", required=True)
    p_probe.add_argument("--port", type=int, required=True)
    p_probe.add_argument("--count", type=int, default=40)
    p_probe.add_argument("--interval-ms", type=float, default=50.0)
    args = parser.parse_args(argv)
    log_format = f"{args.role} %(levelname)s %(name)s: %(message)s"
    level = os.environ.get(PEERS_LOG_LEVEL_ENV, "WARNING").upper()
    logging.basicConfig(level=level, stream=sys.stderr, format=log_format)

    if args.role == "echo":
        run_echo(args)
        return 0
    if args.role == "rttprobe":
        emit({"result": run_rttprobe(args)})
        return 0
    if args.role == "viewer" and args.browser == "chromium":
        result = asyncio.run(run_browser_viewer(args))
    elif args.role == "viewer":
        result = asyncio.run(run_viewer(args))
    elif args.mode == "stock":
        result = asyncio.run(run_stock_sender(args))
    else:
        result = asyncio.run(run_runtime_sender(args))
    emit({"result": result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
