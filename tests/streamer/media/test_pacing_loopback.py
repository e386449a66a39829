"""The paced video sender between two aiortc peers on loopback: frames still arrive, spread out."""

from __future__ import annotations

import asyncio
import fractions
from collections import defaultdict

import av
import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, VideoStreamTrack, clock
from aiortc.rtp import RtpPacket, is_rtcp

from streamer.media.pacedtransport import PacedTransport
from streamer.media.pacer import BURST_MS, PacingQueue, abs_send_time
from streamer.media.peer import ABS_SEND_TIME_URI, FeedbackSender, advertise_host_addresses
from tests.streamer.media.test_peer import Sink, rtp_extensions

pytestmark = pytest.mark.timeout(60)


class NoiseTrack(VideoStreamTrack):
    """320x240 noise at 30 fps: frames VP8 cannot shrink, several packets each."""

    def __init__(self) -> None:
        super().__init__()
        self._rng = np.random.default_rng(1)

    async def recv(self) -> av.VideoFrame:
        pts, time_base = await self.next_timestamp()
        frame = av.VideoFrame.from_ndarray(self._rng.integers(0, 255, (240, 320, 3), dtype=np.uint8), format="rgb24")
        frame.pts, frame.time_base = pts, time_base or fractions.Fraction(1, 90_000)
        return frame


async def test_paced_frames_arrive_spread_at_the_pacing_rate_with_fresh_send_times() -> None:
    node = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    viewer = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        viewer.addTransceiver("video", direction="recvonly")
        offer = await viewer.createOffer()
        advertise_host_addresses(viewer, ["127.0.0.1"])
        await viewer.setLocalDescription(offer)
        await node.setRemoteDescription(viewer.localDescription)
        sender = FeedbackSender.adopt(node.addTrack(NoiseTrack()), Sink())
        transceiver = node.getTransceivers()[0]
        queue: PacingQueue[bytes] = PacingQueue(1_000_000, max_delay_ms=300)  # 2 Mbps
        paced = sender.pace(queue)
        answer = await node.createAnswer()
        advertise_host_addresses(node, ["127.0.0.1"])
        await node.setLocalDescription(answer)
        assert isinstance(sender.transport, PacedTransport)  # the sender sees the paced view

        # what the pacer hands to the real transport, and when
        released: list[tuple[float, int, int, int | None]] = []  # (loop s, RTP timestamp, bytes, abs-send-time)
        fresh: list[int] = []  # now's abs-send-time at each release
        loop = asyncio.get_running_loop()
        real_send = paced.inner._send_rtp

        async def spy(data: bytes) -> None:
            if not is_rtcp(data):
                packet = RtpPacket.parse(data)
                if packet.ssrc == sender._ssrc:
                    ext = rtp_extensions(data)
                    ast = paced.abs_send_time_id
                    value = int.from_bytes(ext[ast], "big") if ast is not None and ast in ext else None
                    released.append((loop.time(), packet.timestamp, len(data), value))
                    fresh.append(abs_send_time(clock.current_ntp_time()))
            await real_send(data)

        paced.inner._send_rtp = spy
        await viewer.setRemoteDescription(node.localDescription)

        track = viewer.getTransceivers()[0].receiver.track
        frames = 0
        async with asyncio.timeout(40):
            while frames < 20:
                await track.recv()
                frames += 1
        assert paced.abs_send_time_id is not None  # read from the parameters aiortc's send() got
        assert any(e.uri == ABS_SEND_TIME_URI for e in transceiver._headerExtensions)

        # every packet's abs-send-time is when it left the pacer, not when aiortc made it (a frame's
        # packets are made back to back: their own stamps would be within a fraction of a ms)
        assert released and all(v is not None for *_, v in released)
        lag_ms = sorted(
            ((now - v) % (1 << 24)) / (1 << 18) * 1000
            for (*_, v), now in zip(released, fresh, strict=True)
            if v is not None
        )
        assert lag_ms[len(lag_ms) // 2] < 2.0, lag_ms[-10:]

        # frames of several packets leave spread over their size at the pacing rate
        by_frame: dict[int, list[tuple[float, int, int]]] = defaultdict(list)
        for t, ts, size, value in released:
            by_frame[ts].append((t, size, value or 0))
        big = [p for p in by_frame.values() if len(p) >= 4]
        assert big, {ts: len(p) for ts, p in by_frame.items()}
        for packets in big:
            bits = sum(size for _, size, _ in packets[1:]) * 8
            least_ms = (bits - queue.pacing_bps * BURST_MS / 1000) / (queue.rate_bps() * 3) * 1000
            span_ms = (packets[-1][0] - packets[0][0]) * 1000
            assert span_ms >= least_ms, (span_ms, least_ms, len(packets))
            stamped_ms = ((packets[-1][2] - packets[0][2]) % (1 << 24)) / (1 << 18) * 1000
            assert stamped_ms == pytest.approx(span_ms, abs=3.0)
        assert queue.counters.packets >= len(released)
        assert queue.counters.max_wait_ms > 0
    finally:
        await viewer.close()
        await node.close()
