"""The frame pipeline and the encoded track, without X or WebRTC: a synthetic source, a real encoder.

Checks the pipeline's invariants: packets come out as aiortc wants them (one
per frame, 90 kHz pts, a keyframe first, decodable), nothing is grabbed while
nobody pulls, frames are skipped before encoding when the consumer is behind,
a new track starts with a keyframe, encoders can be swapped between frames,
repeated failures end the thread, and ``close`` leaves no thread or open
encoder behind.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from fractions import Fraction
from typing import Any

import av
import pytest
from aiortc.mediastreams import MediaStreamError

from encoder import EncoderConfig, VideoEncoder, backend_by_name
from encoder.pattern import moving_pattern
from streamer.desktop.capture import CaptureError, CaptureStats, bgra_frame
from streamer.media.track import (
    FOLLOWER_MAX_QUEUED,
    MAX_CONSECUTIVE_FAILURES,
    MAX_QUEUED_FRAMES,
    EncodedVideoTrack,
    FramePipeline,
)
from streamer.media.track import merge_frame_packets as merge
from tests.streamer.viewer import until

pytestmark = pytest.mark.timeout(60)

WIDTH, HEIGHT = 320, 240
FPS = 50  # fast pacing keeps the tests short
RTP_TIME_BASE = Fraction(1, 90_000)


class PatternSource:
    """A ``FrameSource`` of the moving test pattern; counts grabs; can be told to fail."""

    backend = "pattern"

    def __init__(self, width: int = WIDTH, height: int = HEIGHT) -> None:
        self.width, self.height = width, height
        self.grabs = 0
        self.fail = False
        self.closed = False

    def grab(self) -> av.VideoFrame:
        if self.fail:
            raise CaptureError("synthetic failure")
        frame = bgra_frame(moving_pattern(self.width, self.height, self.grabs))
        frame.pts, frame.time_base = time.time_ns() // 1000, Fraction(1, 1_000_000)
        self.grabs += 1
        return frame

    def stats(self) -> CaptureStats:
        return CaptureStats(self.backend, self.grabs, 0.0, 0.0, 0.0, 0.0)

    def close(self) -> None:
        self.closed = True


def x264(width: int = WIDTH, height: int = HEIGHT, fps: int = FPS) -> VideoEncoder:
    return VideoEncoder(backend_by_name("libx264"), EncoderConfig(width, height, float(fps), 1_000_000, threads=1))


async def receive(track: EncodedVideoTrack, count: int) -> list[av.Packet[Any]]:
    return [await asyncio.wait_for(track.recv(), 10.0) for _ in range(count)]


def decode(packets: list[av.Packet[Any]]) -> list[av.VideoFrame]:
    decoder = av.CodecContext.create("h264", "r")
    frames: list[av.VideoFrame] = []
    for packet in packets:
        frames.extend(decoder.decode(av.Packet(bytes(packet))))  # type: ignore[attr-defined]
    return frames


@pytest.fixture
async def pipeline() -> Any:
    source = PatternSource()
    pipe = FramePipeline(source, x264(), FPS, name="rb-frames-test")
    pipe.start()
    yield pipe, source
    await asyncio.to_thread(pipe.close)
    assert not any(t.name == "rb-frames-test" for t in threading.enumerate())


async def test_packets_are_what_aiortc_packetizes(pipeline: Any) -> None:
    pipe, _source = pipeline
    track = EncodedVideoTrack()
    pipe.attach(track)
    started = time.monotonic()
    packets = await receive(track, 10)
    elapsed = time.monotonic() - started
    assert packets[0].is_keyframe
    assert not any(p.is_keyframe for p in packets[1:])
    assert all(p.time_base == RTP_TIME_BASE for p in packets)
    pts = [p.pts for p in packets]
    assert all(b > a for a, b in itertools.pairwise(pts))
    assert elapsed >= 8 / FPS  # paced: never faster than the frame rate
    frames = decode(packets)
    assert len(frames) == 10
    assert {(f.width, f.height) for f in frames} == {(WIDTH, HEIGHT)}


async def test_nothing_is_grabbed_until_the_sender_pulls_and_backpressure_skips(pipeline: Any) -> None:
    pipe, source = pipeline
    track = EncodedVideoTrack()
    pipe.attach(track)
    await until(lambda: pipe.stats().skipped_backpressure >= 5, "ticks were not skipped")
    assert source.grabs == 0  # attached but not pulled: no CPU spent
    await receive(track, 1)
    # The consumer stops pulling: at most MAX_QUEUED_FRAMES more frames are made, then ticks are skipped.
    skipped = pipe.stats().skipped_backpressure
    await until(lambda: pipe.stats().skipped_backpressure >= skipped + 5, "ticks were not skipped")
    assert source.grabs <= 1 + MAX_QUEUED_FRAMES
    assert pipe.stats().frames == source.grabs  # every encoded frame was delivered, none discarded


async def test_a_new_track_starts_with_a_keyframe_and_requests_are_honoured(pipeline: Any) -> None:
    pipe, _source = pipeline
    first = EncodedVideoTrack()
    pipe.attach(first)
    await receive(first, 5)
    second = EncodedVideoTrack()
    pipe.attach(second)
    first.stop()
    with pytest.raises(MediaStreamError):
        await first.recv()
    packets = await receive(second, 3)
    assert packets[0].is_keyframe
    pipe.request_keyframe()
    later = await receive(second, 3 + MAX_QUEUED_FRAMES)
    assert any(p.is_keyframe for p in later)


async def test_replace_encoder_and_fps_between_frames(pipeline: Any) -> None:
    pipe, _source = pipeline
    track = EncodedVideoTrack()
    pipe.attach(track)
    await receive(track, 3)
    old = pipe.encoder
    pipe.replace_encoder(x264(160, 120, 25))
    pipe.set_fps(25)
    packets = await receive(track, 4 + MAX_QUEUED_FRAMES)
    # Up to MAX_QUEUED_FRAMES packets of the old encoder were queued; the new one starts with a keyframe.
    first_new = max(i for i, p in enumerate(packets) if p.is_keyframe)
    assert first_new <= MAX_QUEUED_FRAMES
    sizes = [(f.width, f.height) for f in decode(packets[first_new:])]
    assert sizes and set(sizes) == {(160, 120)}  # the new encoder scales the 320x240 source
    await until(lambda: old.closed, "the old encoder was not closed by the frame thread")
    assert pipe.stats().target_fps == 25
    assert pipe.stats().width == 160


async def test_repeated_failures_end_the_thread_and_report_once() -> None:
    source = PatternSource()
    source.fail = True
    failures: list[BaseException] = []
    pipe = FramePipeline(source, x264(), 200, name="rb-frames-failing", on_failure=failures.append)
    pipe.start()
    track = EncodedVideoTrack()
    pipe.attach(track)
    receiver = asyncio.ensure_future(track.recv())  # the sender pulls
    await until(lambda: bool(failures), "on_failure was not called")
    await until(lambda: not any(t.name == "rb-frames-failing" for t in threading.enumerate()), "thread alive")
    assert len(failures) == 1 and isinstance(failures[0], CaptureError)
    assert pipe.stats().failures == MAX_CONSECUTIVE_FAILURES
    track.stop()
    with pytest.raises(MediaStreamError):
        await receiver
    await asyncio.to_thread(pipe.close)
    assert pipe.encoder.closed


async def test_close_is_idempotent_and_closes_pending_encoders() -> None:
    pipe = FramePipeline(PatternSource(), x264(), FPS, name="rb-frames-close")
    pipe.start()
    pending = x264(160, 120)
    current = pipe.encoder
    pipe.replace_encoder(pending)
    await asyncio.to_thread(pipe.close)
    await asyncio.to_thread(pipe.close)
    assert current.closed and pending.closed
    assert not any(t.name == "rb-frames-close" for t in threading.enumerate())
    with pytest.raises(RuntimeError):
        pipe.replace_encoder(x264())


def test_merge_frame_packets() -> None:
    assert merge([]) is None
    one = av.Packet(b"\x00\x00\x00\x01\x65")
    assert merge([one]) is one
    a, b = av.Packet(b"\x00\x00\x00\x01\x67"), av.Packet(b"\x00\x00\x00\x01\x65")
    a.pts, a.time_base, b.pts, b.time_base = 90, RTP_TIME_BASE, 90, RTP_TIME_BASE
    b.is_keyframe = True
    merged = merge([a, b])
    assert merged is not None
    assert bytes(merged) == bytes(a) + bytes(b)
    assert merged.pts == 90 and merged.time_base == RTP_TIME_BASE and merged.is_keyframe


def test_fps_bounds() -> None:
    with pytest.raises(ValueError):
        FramePipeline(PatternSource(), x264(), 0, name="x")


async def test_send_jitter_is_rfc3550_over_render_to_send_times() -> None:
    # a fake wall clock: each packet leaves recv() at the time listed; pts = render time (ms) x 90
    leave = iter([1_000.0, 1_030.0, 1_050.0, 1_066.0])
    track = EncodedVideoTrack(max_queued=4, wall_ms=lambda: next(leave))
    track._pulling = True
    for render_ms in (990, 1_000, 1_040, 1_056):  # transits 10, 30, 10, 10 ms
        packet = av.Packet(b"\x00")
        packet.pts = render_ms * 90
        track.put(packet)
    assert len(await receive(track, 4)) == 4
    # |D| = 20, 20, 0: J = 20/16 = 1.25; + (20 - 1.25)/16 = 2.421875; + (0 - 2.421875)/16
    assert track.send_jitter_ms == 2.421875 - 2.421875 / 16
    track.stop()


class FlakyEncoder:
    """Wraps a real encoder; raises on the frames whose index is in ``fail_at`` (counted by the pipeline)."""

    def __init__(self, inner: VideoEncoder, fail_at: set[int]) -> None:
        self.inner, self.fail_at, self.calls = inner, fail_at, 0

    def encode(self, frame: av.VideoFrame) -> list[av.Packet[Any]]:
        self.calls += 1
        if self.calls in self.fail_at:
            raise av.FFmpegError(-1, "synthetic encoder error")
        return self.inner.encode(frame)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_encoder_errors_and_send_freezes_are_counted() -> None:
    source = PatternSource()
    encoder = FlakyEncoder(x264(), {3, 4})
    pipe = FramePipeline(source, encoder, FPS, name="rb-frames-count")  # type: ignore[arg-type]
    pipe.start()
    try:
        track = EncodedVideoTrack()
        pipe.attach(track)
        await receive(track, 5)
        assert pipe.stats().encode_errors == 2 and pipe.stats().failures == 2
        before = pipe.stats().freezes  # 0 unless this machine stalled the thread 200 ms
        await asyncio.sleep(0.4)  # the viewer's sender stops pulling for 400 ms (the gap under test)
        await receive(track, MAX_QUEUED_FRAMES + 2)  # the queued ones, then a fresh one after the gap
        assert pipe.stats().freezes >= before + 1
    finally:
        await asyncio.to_thread(pipe.close)


async def test_one_encode_feeds_the_owner_and_followers_alike(pipeline: Any) -> None:
    """Followers (share viewers) get the owner's packets from a keyframe on; one that falls behind skips to
    the next keyframe (asked for it) without holding the others; a follower alone keeps the encode going."""
    pipe, source = pipeline
    owner = EncodedVideoTrack()
    pipe.attach(owner)
    seen: dict[int, bytes] = {}

    async def drain(track: EncodedVideoTrack, into: dict[int, bytes]) -> None:
        while True:
            p = await track.recv()
            into[p.pts] = bytes(p)

    owner_task = asyncio.create_task(drain(owner, seen))
    try:
        await until(lambda: len(seen) >= 3, "the owner got no frames")
        a, b = EncodedVideoTrack(FOLLOWER_MAX_QUEUED), EncodedVideoTrack(FOLLOWER_MAX_QUEUED)
        fa, fb = pipe.add_follower(a), pipe.add_follower(b)
        got_b = await receive(b, 4)
        a_seen: dict[int, bytes] = {}
        a_task = asyncio.create_task(drain(a, a_seen))
        got_b += await receive(b, 6)
        assert got_b[0].is_keyframe  # asked for: the follower pulled, waiting for a keyframe
        await until(lambda: max(seen) >= got_b[-1].pts, "the owner fell behind")
        # the owner saw the same frames (same pts, same bytes)
        assert all(seen[p.pts] == bytes(p) for p in got_b)
        assert len(decode(got_b)) == len(got_b)  # decodable on its own, starting where it started
        # b stops pulling: it falls behind and is dropped to, while the owner and a go on
        dropped, owner_frames, a_frames = fb.dropped, len(seen), len(a_seen)
        await until(lambda: len(seen) >= owner_frames + 10 and len(a_seen) >= a_frames + 10, "a and the owner stalled")
        assert fb.dropped > dropped and fb.needs_keyframe
        again = await receive(b, 3 + FOLLOWER_MAX_QUEUED)  # what it had queued, then a fresh start on a keyframe
        assert any(p.is_keyframe for p in again[1:])
        assert all(seen[p.pts] == bytes(p) for p in again if p.pts in seen)
        # the owner leaves: the followers alone keep the encode going
        owner_task.cancel()
        pipe.detach(owner)
        grabs, a_frames = source.grabs, len(a_seen)
        await until(lambda: len(a_seen) >= a_frames + 5, "a follower alone got no frames")
        assert source.grabs > grabs and fa.delivered > 10
        a_task.cancel()
        pipe.remove_follower(a)
        pipe.remove_follower(b)
    finally:
        owner_task.cancel()
