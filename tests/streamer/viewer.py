"""An in-process aiortc viewer for streamer tests: offers, receives and decodes video, sends input.

It behaves like the browser client: it is the offerer, creates the ``input``
data channel and a recvonly video transceiver, and exchanges signaling
messages with a ``SessionRuntime`` through ``handle_signal`` (aiortc puts all
candidates in the SDP, so offer/answer is the whole exchange).  It never uses
a public STUN server (``iceServers=[]``) and offers 127.0.0.1 through
``streamer.media.peer.advertise_host_addresses``, so it works on a loopback-only
machine too.

Decoded frames are kept as ``Received`` records (the newest ``KEEP_IMAGES``
also as BGR arrays for stamp/player checks).  Waiting helpers poll with a
deadline; they never sleep for a fixed time to "let things settle".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import av
import numpy as np
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCDataChannel,
    RTCPeerConnection,
    RTCRtpReceiver,
    RTCRtpSender,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError

from broker.protocol import INPUT_CHANNEL_LABEL, PROBE_CHANNEL_LABEL, InputType, NodeEventType
from rbcommon.ice import advertise_host_addresses

DEADLINE_S = 15.0  # generous bound for things that normally take well under a second
KEEP_IMAGES = 30  # newest decoded frames kept as BGR arrays


@dataclass(frozen=True)
class Received:
    """One decoded frame."""

    index: int
    width: int
    height: int
    key_frame: bool
    at: float  # time.monotonic() when decoded


class Viewer:
    """A viewer peer.  ``codecs``: restrict what it can receive (e.g. ``("VP8",)``); None = all.

    ``advertise``: host addresses to offer; ``keep_images``: keep BGR copies of decoded frames;
    ``probes``: open the probe channel and answer the node's delay probes, as the web client does;
    ``audio``: also offer a recvonly audio section (as the web client does since protocol v3) and keep
    the received sound for ``sound()`` (left channel, float64 samples at 48 kHz) and ``audio_frames``.
    """

    def __init__(
        self,
        *,
        codecs: Sequence[str] | None = None,
        advertise: Sequence[str] = ("127.0.0.1",),
        keep_images: bool = True,
        probes: bool = True,
        configuration: RTCConfiguration | None = None,
        audio: bool = False,
    ) -> None:
        # never aiortc's default public STUN: no ICE servers unless a test passes its own (a TURN lab)
        self.pc = RTCPeerConnection(configuration or RTCConfiguration(iceServers=[]))
        self.transceiver = self.pc.addTransceiver("video", direction="recvonly")
        if codecs is not None:
            wanted = {c.upper() for c in codecs}
            caps = RTCRtpSender.getCapabilities("video").codecs
            self.transceiver.setCodecPreferences([c for c in caps if c.name.upper() in wanted or c.name == "rtx"])
        self.audio_transceiver = self.pc.addTransceiver("audio", direction="recvonly") if audio else None
        self.audio_chunks: list[np.ndarray] = []  # left channel of each decoded audio frame
        self.audio_frames = 0
        self._audio_reader: asyncio.Task[None] | None = None
        self.channel = self.pc.createDataChannel(INPUT_CHANNEL_LABEL)
        self.probe_channel = (
            answer_probes(self.pc, self.transceiver.receiver, self._frames_decoded) if probes else None
        )
        # set: the probe answers report this many frames decoded (a frozen picture) whatever arrives
        self.frozen_at: int | None = None
        self.advertise = tuple(advertise)
        self.keep_images = keep_images  # False: decode only (benchmarks), no BGR conversion
        self.frames: list[Received] = []
        self.images: deque[np.ndarray] = deque(maxlen=KEEP_IMAGES)
        self.messages: list[dict[str, Any]] = []
        self.remote_track: MediaStreamTrack | None = None
        self._reader: asyncio.Task[None] | None = None
        self._channel_open = asyncio.Event()
        self.channel.on("open", self._channel_open.set)
        self.channel.on("message", lambda raw: self.messages.append(json.loads(raw)))
        self.pc.on("track", self._on_track)

    def _frames_decoded(self) -> int:
        return self.frozen_at if self.frozen_at is not None else len(self.frames)

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._audio_reader = asyncio.ensure_future(self._read_audio(track))
            return
        self.remote_track = track
        self._reader = asyncio.ensure_future(self._read(track))

    async def _read(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                assert isinstance(frame, av.VideoFrame)
                if self.keep_images:
                    self.images.append(frame.to_ndarray(format="bgr24"))
                self.frames.append(
                    Received(len(self.frames), frame.width, frame.height, bool(frame.key_frame), time.monotonic())
                )

    async def _read_audio(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                assert isinstance(frame, av.AudioFrame)
                pcm = frame.to_ndarray()  # s16 packed: shape (1, samples * channels)
                channels = len(frame.layout.channels)
                self.audio_chunks.append(pcm.reshape(-1)[::channels].astype(np.float64))
                self.audio_frames += 1

    def sound(self, last_s: float | None = None) -> np.ndarray:
        """The sound received so far (or its last ``last_s`` seconds): left channel, 48 kHz."""
        if not self.audio_chunks:
            return np.zeros(0)
        samples = np.concatenate(self.audio_chunks)
        return samples[-round(last_s * 48_000) :] if last_s is not None else samples

    async def offer(self) -> dict[str, Any]:
        offer = await self.pc.createOffer()
        advertise_host_addresses(self.pc, self.advertise)
        await self.pc.setLocalDescription(offer)
        return {"type": "offer", "sdp": self.pc.localDescription.sdp}

    async def connect(self, handle_signal: Callable[[dict[str, Any]], Awaitable[list[dict[str, Any]]]]) -> None:
        """Offer through ``handle_signal``, apply the answer, wait for the channel to open."""
        replies = await handle_signal(await self.offer())
        answers = [r for r in replies if r.get("type") == "answer"]
        assert answers, f"no answer: {replies}"
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answers[0]["sdp"], type="answer"))
        await asyncio.wait_for(self._channel_open.wait(), DEADLINE_S)

    def send(self, message: dict[str, Any] | str | bytes) -> None:
        self.channel.send(message if isinstance(message, str | bytes) else json.dumps(message))

    async def wait_frames(self, count: int, *, after: int = 0) -> list[Received]:
        """Wait until ``count`` frames beyond the first ``after`` were decoded; return them."""
        await until(lambda: len(self.frames) >= after + count, f"fewer than {count} frames after {after}")
        return self.frames[after : after + count]

    async def wait_message(self, predicate: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        await until(lambda: any(predicate(m) for m in self.messages), f"no {what} message")
        return next(m for m in self.messages if predicate(m))

    async def send_pli(self) -> None:
        """Ask the sender for a keyframe as a decoder that lost a picture would (RTCP PLI)."""
        receiver = self.transceiver.receiver
        ssrcs = [s.source for s in receiver.getSynchronizationSources()]
        assert ssrcs, "no RTP received yet"
        await receiver._send_rtcp_pli(ssrcs[0])  # test-only use of aiortc's own PLI sender

    async def close(self) -> None:
        await self.pc.close()
        for reader in (self._reader, self._audio_reader):
            if reader is not None:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader


def answer_probes(
    pc: RTCPeerConnection, receiver: RTCRtpReceiver, frames_decoded: Callable[[], int] | None = None
) -> RTCDataChannel:
    """Open ``pc``'s probe channel and answer each node ``probe`` with the packets ``receiver`` got.

    The aiortc twin of the web client's answer (``streamer.media.probe``): unordered, no
    retransmissions; ``rx`` is the RTP packets ``receiver`` got, ``rx_ms`` this process's
    monotonic clock when it was read.  aiortc's ``getStats`` cannot give that count: it files
    the video SSRC and the retransmission (RTX) SSRC under one inbound-rtp id, so once a
    packet was retransmitted the report shows the RTX stream's count.  So the receiver's
    packet handler is wrapped to count (the same seam the ABR benchmark's viewer uses).
    ``frames_decoded`` (optional) gives the ``fd`` field: frames the viewer decoded so far.
    """
    channel = pc.createDataChannel(PROBE_CHANNEL_LABEL, ordered=False, maxRetransmits=0)
    received = 0
    handle_rtp = receiver._handle_rtp_packet

    async def counting(packet: Any, arrival_time_ms: int) -> None:
        nonlocal received
        received += 1
        await handle_rtp(packet, arrival_time_ms)

    receiver._handle_rtp_packet = counting  # type: ignore[method-assign]

    def on_message(raw: str | bytes) -> None:
        msg = json.loads(raw)
        if msg.get("t") == NodeEventType.PROBE.value and channel.readyState == "open":
            rx_ms = round(time.monotonic() * 1000, 1)
            ack = {"t": InputType.PROBE_ACK.value, "id": msg.get("id"), "rx": received, "rx_ms": rx_ms}
            if frames_decoded is not None:
                ack["fd"] = frames_decoded()
            channel.send(json.dumps(ack))

    channel.on("message", on_message)
    return channel


async def until(condition: Callable[[], bool], message: str, deadline_s: float = DEADLINE_S) -> None:
    """Poll ``condition`` every 10 ms until it holds; fail with ``message`` after ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, message
        await asyncio.sleep(0.01)
