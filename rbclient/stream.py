"""One viewer's stream: signaling, the WebRTC offer, decoded frames, input and stats.

Job: ``Stream`` follows docs/protocol.md as a client must.  It builds an ``RTCPeerConnection``
with the session's ICE servers exactly as given (never aiortc's default public STUN), a
``recvonly`` video transceiver (and audio when asked), the ``input`` channel (ordered,
reliable) and the ``probe`` channel (unordered, ``maxRetransmits`` 0) before the offer; opens
the signaling WebSocket with ``?access_token=``; sends the complete offer (aiortc puts every
candidate in the SDP); re-sends the same offer on ``not_running`` and after 10 s of silence;
applies the answer; answers each delay probe at once with ``pa``; pings once a second for the
input round trip; and hands out every decoded ``av.VideoFrame`` with its stamp, feeding
``rbclient.stats.ViewerStats``.  ``start`` is the whole flow from a pool name to a stream.

aiortc seams: frames come decoded from the public ``MediaStreamTrack.recv()`` (aiortc decodes
on its own thread); the RTP packets received (the probe answer's ``rx``, the bitrate) are
counted by wrapping the video receiver's ``_handle_rtp_packet`` (aiortc's ``getStats`` files
the RTX stream under the video's id, so its count is wrong after a retransmission), the same
seam as the project's test viewer.

Concurrency: asyncio, one event loop; aiortc callbacks only append to queues and counters.
Frames wait in a bounded queue (newest kept: a slow consumer sees fresh frames, never a
growing delay).  Invariants: channels exist before the offer; the socket stays open for the
whole stream (closing it drops the media); ``close`` sends ``bye`` first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import av
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCIceServer,
    RTCPeerConnection,
    RTCRtpSender,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError

from broker.protocol import (
    INPUT_CHANNEL_LABEL,
    PROBE_CHANNEL_LABEL,
    InputType,
    NodeEventType,
    SignalError,
    SignalType,
)
from rbclient import inputs
from rbclient.api import ApiError, Broker, SessionView
from rbclient.stamp import Stamp, read_frame
from rbclient.stats import ViewerStats
from rbcommon.ice import advertise_host_addresses

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S: Final = 60.0  # offer to open input channel, including a node that is still starting
RESEND_AFTER_S: Final = 10.0  # no reply to an offer this long: send it again (as the web client does)
NOT_RUNNING_RETRY_S: Final = 0.5  # the web client's retry delay after a not_running error
PING_INTERVAL_S: Final = 1.0
FRAME_QUEUE: Final = 4  # decoded frames waiting for the consumer; older ones are dropped
MESSAGES_KEPT: Final = 200  # node messages kept in ``Stream.messages``
AUDIO_KEPT: Final = 100  # decoded audio frames kept in ``Stream.audio`` (20 ms each: the last 2 s)


class SignalingError(Exception):
    """The node or broker refused the offer (``code`` is a ``SignalError``), or the connection failed."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code, self.detail = code, detail


@dataclass(frozen=True, slots=True)
class Frame:
    """One decoded video frame."""

    image: av.VideoFrame
    index: int  # 0, 1, 2, ... in decode order
    at_ms: float  # monotonic ms when decoded
    wall_ms: float  # epoch ms when decoded
    stamp: Stamp | None  # the built-in game's frame stamp, when the picture has one


def ice_configuration(view: SessionView) -> RTCConfiguration:
    """The session's ICE servers exactly as the broker gave them (an empty list: host candidates only)."""
    servers = []
    for entry in (view.get("signaling") or {}).get("ice_servers") or []:
        urls = entry.get("urls")
        servers.append(RTCIceServer(urls=[urls] if isinstance(urls, str) else list(urls),
                                    username=entry.get("username"), credential=entry.get("credential")))
    return RTCConfiguration(iceServers=servers)


class Stream:
    """A viewer of one seated session.  ``connect()``, then read ``frames()``, send input, ``close()``.

    ``codecs``: video codecs to offer (``("H264",)``, ``("VP8",)``; None = both); ``audio``: also
    offer a recvonly Opus section (desktop sessions send sound); ``host_addresses``: offer host
    candidates on exactly these addresses (``("127.0.0.1",)`` on a loopback-only machine; empty =
    aioice's interface addresses); ``read_stamps``: read each frame's stamp (the built-in game).
    Construct it inside a running event loop.
    """

    def __init__(self, broker: Broker, view: SessionView, *, codecs: Sequence[str] | None = None,
                 audio: bool = False, host_addresses: Sequence[str] = (), read_stamps: bool = True) -> None:
        self.broker = broker
        self.view = view
        self.session_id = str(view["id"])
        self.read_stamps = read_stamps
        self.host_addresses = tuple(host_addresses)
        self.stats = ViewerStats()
        self.messages: deque[dict[str, Any]] = deque(maxlen=MESSAGES_KEPT)  # node messages on the channels
        self.warnings: list[dict[str, Any]] = []  # ``warn`` messages: the session will end
        self.errors: list[dict[str, Any]] = []  # signaling errors after the answer (ice_failed, dtls_failed)
        self.bye_reason: str | None = None  # set when the broker said ``bye`` (the session ended)
        self.latest: Frame | None = None
        self.frames_decoded = 0  # every frame of this stream (``stats`` may be replaced to start a window)
        self.audio_frames = 0  # decoded audio frames in all
        self.audio: deque[av.AudioFrame] = deque(maxlen=AUDIO_KEPT)  # the newest decoded sound (Opus, 48 kHz)
        self.pc = RTCPeerConnection(ice_configuration(view))
        self.video = self.pc.addTransceiver("video", direction="recvonly")
        if codecs is not None:
            wanted = {c.upper() for c in codecs}
            caps = RTCRtpSender.getCapabilities("video").codecs
            self.video.setCodecPreferences([c for c in caps if c.name.upper() in wanted or c.name == "rtx"])
        if audio:
            self.pc.addTransceiver("audio", direction="recvonly")
        self.input = self.pc.createDataChannel(INPUT_CHANNEL_LABEL)  # ordered, reliable
        self.probe = self.pc.createDataChannel(PROBE_CHANNEL_LABEL, ordered=False, maxRetransmits=0)
        self.pointer = inputs.Pointer(int(view.get("profile", {}).get("width") or 1280),
                                      int(view.get("profile", {}).get("height") or 720))
        self._frames: asyncio.Queue[Frame] = asyncio.Queue(FRAME_QUEUE)
        self._decoded = asyncio.Event()  # set on every decoded frame (``wait_frames``)
        self._rx_packets = 0
        self._ping_id = 0
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._open = asyncio.Event()
        self._closed = asyncio.Event()
        self.input.on("open", self._open.set)
        self.input.on("message", self._on_input_message)
        self.probe.on("message", self._on_probe)
        self.pc.on("track", self._on_track)
        self._count_packets()

    # --- receiving ---------------------------------------------------------------------
    def _count_packets(self) -> None:
        receiver = self.video.receiver
        handle = receiver._handle_rtp_packet

        async def counting(packet: Any, arrival_time_ms: int) -> None:
            self._rx_packets += 1
            self.stats.on_packet(time.monotonic() * 1000, len(packet.payload))
            await handle(packet, arrival_time_ms)

        receiver._handle_rtp_packet = counting  # type: ignore[method-assign]

    def _on_track(self, track: MediaStreamTrack) -> None:
        reader = self._read_video(track) if track.kind == "video" else self._read_audio(track)
        self._tasks.append(asyncio.ensure_future(reader))

    async def _read_video(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                image = await track.recv()
                assert isinstance(image, av.VideoFrame)
                at_ms, wall_ms = time.monotonic() * 1000, time.time() * 1000
                stamp = read_frame(image) if self.read_stamps else None
                frame = Frame(image, self.frames_decoded, at_ms, wall_ms, stamp)
                self.frames_decoded += 1
                self.stats.on_frame(at_ms, wall_ms, image.width, image.height, stamp)
                if (image.width, image.height) != (self.pointer.width, self.pointer.height):
                    self.pointer.resize(image.width, image.height)
                self.latest = frame
                if self._frames.full():
                    self._frames.get_nowait()  # drop the oldest: the consumer wants fresh pictures
                self._frames.put_nowait(frame)
                self._decoded.set()

    async def _read_audio(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                if isinstance(frame, av.AudioFrame):
                    self.audio.append(frame)
                    self.audio_frames += 1

    def _on_input_message(self, raw: str | bytes) -> None:
        try:
            msg = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return
        if not isinstance(msg, dict):
            return
        self.messages.append(msg)
        kind = msg.get("t")
        if kind == NodeEventType.PONG and isinstance(msg.get("ts"), int | float):
            self.stats.on_pong(time.monotonic() * 1000, float(msg["ts"]))
        elif kind == NodeEventType.STATS:
            self.stats.on_node_stats(msg)
        elif kind == NodeEventType.WARNING:
            self.warnings.append(msg)

    def _on_probe(self, raw: str | bytes) -> None:
        try:
            msg = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return
        if isinstance(msg, dict) and msg.get("t") == NodeEventType.PROBE and self.probe.readyState == "open":
            self.probe.send(json.dumps({"t": InputType.PROBE_ACK.value, "id": msg.get("id"), "rx": self._rx_packets,
                                        "rx_ms": round(time.monotonic() * 1000, 1), "fd": self.frames_decoded}))

    async def frames(self) -> AsyncIterator[Frame]:
        """Decoded frames as they come (the oldest dropped when the consumer falls behind); ends on close."""
        while not self._closed.is_set():
            getter = asyncio.ensure_future(self._frames.get())
            closed = asyncio.ensure_future(self._closed.wait())
            done, _ = await asyncio.wait({getter, closed}, return_when=asyncio.FIRST_COMPLETED)
            for task in (getter, closed):
                if task not in done:
                    task.cancel()
            if getter in done:
                yield getter.result()

    async def wait_frames(self, count: int, timeout_s: float = 30.0) -> Frame:
        """Wait until ``count`` frames in all were decoded; the newest one.  Takes nothing from ``frames()``."""
        async with asyncio.timeout(timeout_s):
            while self.frames_decoded < count or self.latest is None:
                self._decoded.clear()
                await self._decoded.wait()
        assert self.latest is not None
        return self.latest

    # --- signaling ---------------------------------------------------------------------
    async def connect(self, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        """Open signaling, offer, apply the answer and wait for the input channel; ``SignalingError`` if refused."""
        signaling = self.view.get("signaling")
        if not signaling:
            raise SignalingError("not_seated", f"session {self.session_id} is {self.view.get('state')}, not seated")
        try:  # the broker answers pings itself (every 10 s); aiohttp answers them
            self._ws = await self.broker.http.ws_connect(self.broker.with_token(signaling["url"]), max_msg_size=0)
        except aiohttp.WSServerHandshakeError as exc:  # 409: no longer seated; 404: not yours; 401: token
            raise SignalingError(f"http_{exc.status}", f"the signaling socket was refused: {exc.message}") from exc
        offer = await self.pc.createOffer()
        advertise_host_addresses(self.pc, self.host_addresses)
        await self.pc.setLocalDescription(offer)
        sdp = self.pc.localDescription.sdp
        self._tasks.append(asyncio.ensure_future(self._signal_loop(sdp)))
        async with asyncio.timeout(timeout_s):
            await self._answered
            await self._open.wait()
        self._tasks.append(asyncio.ensure_future(self._ping_loop()))

    async def _send_offer(self, sdp: str) -> None:
        assert self._ws is not None
        await self._ws.send_json({"type": SignalType.OFFER.value, "sdp": sdp})

    async def _signal_loop(self, sdp: str) -> None:
        assert self._ws is not None
        ws = self._ws
        try:
            await self._send_offer(sdp)
            while not ws.closed:
                try:
                    frame = await ws.receive(timeout=None if self._answered.done() else RESEND_AFTER_S)
                except TimeoutError:
                    log.info("no reply to the offer in %.0f s: sending it again", RESEND_AFTER_S)
                    await self._send_offer(sdp)
                    continue
                if frame.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                    break
                if frame.type != aiohttp.WSMsgType.TEXT:
                    continue
                try:
                    msg = json.loads(frame.data)
                except json.JSONDecodeError:
                    log.warning("signaling: a frame that is not JSON: %.80s", frame.data)
                    continue
                kind = msg.get("type") if isinstance(msg, dict) else None
                if kind == SignalType.ANSWER and not self._answered.done():
                    try:
                        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=str(msg.get("sdp")),
                                                                                 type="answer"))
                    except ValueError as exc:  # aiortc refuses an answer it cannot parse or apply
                        self._answered.set_exception(SignalingError("bad_answer", str(exc)))
                        break
                    self._answered.set_result(None)
                elif kind == SignalType.ERROR:
                    code, detail = str(msg.get("code")), str(msg.get("detail", ""))
                    if code == SignalError.NOT_RUNNING and not self._answered.done():
                        await asyncio.sleep(NOT_RUNNING_RETRY_S)
                        await self._send_offer(sdp)
                    elif not self._answered.done():
                        self._answered.set_exception(SignalingError(code, detail))
                    else:
                        log.warning("signaling error after the answer: %s %s", code, detail)
                        self.errors.append(msg)
                elif kind == SignalType.BYE:
                    self.bye_reason = str(msg.get("reason"))
                    break
        finally:
            if not self._answered.done():
                self._answered.set_exception(SignalingError("closed", f"signaling closed (bye: {self.bye_reason})"))
            self._closed.set()

    async def _ping_loop(self) -> None:
        while self.input.readyState == "open":
            self._ping_id += 1
            self.send(inputs.ping(self._ping_id, round(time.monotonic() * 1000, 1)))
            await asyncio.sleep(PING_INTERVAL_S)

    # --- input -------------------------------------------------------------------------
    def send(self, message: dict[str, Any]) -> bool:
        """Send one input message on the ``input`` channel; False when it is not open (nothing sent)."""
        if self.input.readyState != "open":
            return False
        self.input.send(json.dumps(message, separators=(",", ":")))
        return True

    def key(self, code: str, down: bool) -> bool:
        return self.send(inputs.key(code, down))

    def text(self, chars: str) -> bool:
        """Type ``chars`` as characters (``tx``), whatever the remote layout: accents, kana, emoji."""
        return self.send(inputs.text(chars))

    def pointer_move(self, x: float, y: float) -> bool:
        """Absolute pointer position, 0..1 of the picture."""
        return self.send(self.pointer.move_to(x, y))

    def pointer_move_by(self, dx_px: float, dy_px: float) -> bool:
        """Relative motion in picture pixels (a grabbed pointer), integrated into the absolute position."""
        return self.send(self.pointer.move_by(dx_px, dy_px))

    def pointer_relative(self, dx: int, dy: int) -> bool:
        """Relative motion in mouse pixels (``pr``): the X pointer or the game's crosshair moves by it."""
        return self.send(inputs.pointer_relative(dx, dy))

    def pointer_button(self, button: int, down: bool) -> bool:
        return self.send(inputs.pointer_button(button, down))

    def wheel(self, dx: float, dy: float) -> bool:
        return self.send(inputs.wheel(dx, dy))

    def gamepad(self, index: int, axes: Sequence[float], buttons: Sequence[float]) -> bool:
        return self.send(inputs.gamepad(index, axes, buttons))

    def clipboard(self, text: str) -> bool:
        return self.send(inputs.clipboard(text))

    # --- ending ------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """The signaling socket closed (the session ended, or ``close`` was called)."""
        return self._closed.is_set()

    async def close(self) -> None:
        """Say ``bye``, close the socket and the peer connection (the session lives on, ``disconnected``)."""
        ws = self._ws
        if ws is not None and not ws.closed:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await ws.send_json({"type": SignalType.BYE.value})
            await ws.close()
        self._closed.set()
        await self.pc.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def end(self) -> SessionView:
        """Close the stream and end the session (``DELETE``): the seat is freed."""
        await self.close()
        return await self.broker.end_session(self.session_id)


async def start(broker: Broker, pool: str, *, width: int | None = None, height: int | None = None,
                fps: int | None = None, codec: str | None = None,
                on_update: Callable[[SessionView], None] | None = None, end_on_failure: bool = False,
                **stream_options: Any) -> Stream:
    """From a pool name to a connected stream: resume the user's live session there or create one,
    follow the queue (``on_update`` sees each state, with ``queue_position``), offer, connect.

    ``stream_options`` go to ``Stream`` (``codecs``, ``audio``, ``host_addresses``, ``read_stamps``).
    If waiting or connecting fails (or is cancelled), the session is ended when ``end_on_failure``
    (else left to resume).
    """
    live = await broker.live_sessions(pool)
    view = live[0] if live else await broker.create_session(pool, width=width, height=height, fps=fps, codec=codec)
    if on_update is not None:
        on_update(view)
    stream: Stream | None = None
    try:
        if view.get("state") not in ("starting", "running", "disconnected"):
            view = await broker.wait_seated(str(view["id"]), on_update)
        stream = Stream(broker, view, **stream_options)
        await stream.connect()
    except BaseException:
        if stream is not None:
            await stream.close()
        if end_on_failure:  # also on Ctrl-C while queued: no session left behind
            with contextlib.suppress(ApiError, aiohttp.ClientError):
                await broker.end_session(str(view["id"]))
        raise
    return stream


async def watch(broker: Broker, **stream_options: Any) -> Stream:
    """Watch a shared session: ``broker`` holds a share token (``Broker(url, token=<share token>)``).

    The stream is view-only: the node answers pings and drops every other input message; ``bye_reason``
    ``share_revoked`` says the owner stopped sharing (do not reconnect).  ``stream_options`` as ``start``.
    """
    stream = Stream(broker, await broker.watch_view(), **stream_options)
    try:
        await stream.connect()
    except BaseException:
        await stream.close()
        raise
    return stream
