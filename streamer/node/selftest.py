"""Stream self-test: the node streams a stamped pattern to a local decoder and checks every frame.

Job: ``run_selftest(config)`` runs one self-test in this process, through the code sessions use:

  a frame source, by ``config.source`` (``streamer.node.xpattern.choose_source``; ``auto`` = ``x11`` where
  Xvfb and a capture backend are present, else ``pattern``):
    * ``x11``: the stamped pattern of ``streamer.node.framecheck`` painted into a private Xvfb and grabbed
      by the capture sessions use (``open_capture``: x11grab or mss, ``config.capture_backend``), see
      ``streamer.node.xpattern``; grabs before the first painted stamp are skipped and counted;
    * ``pattern``: ``StampedSource``, the stamped pattern handed to the encoder with no capture;
  -> ``FramePipeline`` (the frame thread) -> ``VideoEncoder`` (the backend ``choose_backend`` picks
  from this host's probes, as a session's would: NVENC on a GPU with one, else software)
  -> ``EncodedVideoTrack`` -> ``ViewerPeer`` (aiortc packetizer, NACK retransmissions through the
  node's limiter, keyframes on PLI) -> loopback UDP (ICE host candidates ``advertise_addresses``,
  DTLS, SRTP) -> a local aiortc receiver (its jitter buffer, NACK generator, PLI and decoder).

Every decoded frame is filed by ``FrameTally``: stamp readback and a luma PSNR floor against the
rebuilt source.  Once ``loss_at_s`` after the first decoded frame, every RTP packet reaching the
receiver is dropped for ``loss_ms`` (the RTP handler of the receiver is wrapped: the loopback path
loses them); recovery is NACK retransmission, or a keyframe when the receiver gives data up.  The
local decoder gives up like a browser would: a hole NACKs have not filled for ``HOLE_TIMEOUT_MS`` is
dropped from its jitter buffer and a PLI asks for a keyframe (aiortc's receiver alone NACKs a gap
once and waits for its 512-packet buffer to overflow before a PLI: 3.5 s and more measured at
1.5 Mbps, or never in a short run).  From then until a keyframe is decoded, bad frames count as
``recovering`` (a browser would not show them), never as corrupt.

The verdict (``SelftestReport.ok``): no corrupt frame; at least ``min_frames_ratio`` of the frames
the pipeline sent before the loss window (all of them without one) were checked good; no frame
missing outside the loss window and its recovery; recovery (the first good frame rendered after
the window) within ``recover_within_ms``.

``SelftestRunner`` is the node's loop: every ``interval_s`` while the node has no session (idle
capacity) it runs one and records the outcome for the watchdog (``NodeHealth.selftest_failure``),
which drains the host on a failure and undrains after a passing run and its healthy hold.

Concurrency model: the event loop owns the peers and the tally; the frame thread encodes; the
receiver decodes in aiortc's thread; for ``x11`` the frame thread also paints (lockstep with the grab).
Invariants: nothing outlives ``run_selftest`` (pipeline thread joined, both peer connections closed; for
``x11`` the capture, the painter's X connection and the Xvfb closed), also on a failure or cancellation; the runner
never overlaps two runs and never starts one while a session is live.  Private aiortc seams used
(like ``tests/streamer/viewer.py``): the receiver's ``_handle_rtp_packet`` and its jitter buffer's
``remove``/``smart_remove`` (to know when the receiver gave data up).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any, Final

import av
import numpy as np
import numpy.typing as npt
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from aiortc.utils import uint16_add

from encoder import AIORTC_VIDEO_CODECS, EncoderConfig, VideoEncoder, probe_all_async
from rbcommon.ice import advertise_host_addresses
from streamer.abr.control import SENDABLE_BACKENDS, choose_backend
from streamer.desktop.capture import CaptureStats, FrameSource, bgra_frame
from streamer.desktop.inputs import InputEvent
from streamer.desktop.inputsink import InputRouter
from streamer.media.peer import PeerSettings, ViewerPeer
from streamer.media.track import EncodedVideoTrack, FramePipeline
from streamer.node.framecheck import PSNR_FLOOR_DB, FrameTally, Mangle, source_picture
from streamer.node.xpattern import CAPTURE_BACKENDS, SOURCES, capture_backends, choose_source, x11_source

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S: Final = 15.0  # ICE + DTLS over loopback take well under a second
HOLE_TIMEOUT_MS: Final = 500  # the local decoder gives up a hole NACKs did not fill after this (then PLI)
US: Final = Fraction(1, 1_000_000)
EncoderWrap = Callable[[VideoEncoder], VideoEncoder]
SourceWrap = Callable[[FrameSource], FrameSource]  # tests, drills: alter frames after the capture


@dataclass(frozen=True)
class SelftestConfig:
    width: int = 320
    height: int = 240
    fps: int = 30
    seconds: float = 4.0  # streaming time after the first decoded frame
    loss_at_s: float = 1.5  # the loss window starts this long after the first decoded frame
    loss_ms: int = 300  # every RTP packet to the receiver is dropped for this long; 0: no loss
    psnr_floor_db: float = PSNR_FLOOR_DB
    bitrate_bps: int = 1_500_000
    encoder_preference: str = "auto"  # as NODE_ENCODER
    gpu: int | None = None  # the GPU whose encoder to test (None: the host's first / software)
    advertise_addresses: tuple[str, ...] = ("127.0.0.1",)
    recover_within_ms: int = 5_000
    min_frames_ratio: float = 0.8  # frames checked good / frames sent before the loss window, at least
    source: str = "auto"  # auto | x11 | pattern (see the module docstring)
    capture_backend: str = "auto"  # the x11 source's capture, as NODE_CAPTURE: auto | x11grab | mss
    xvfb: str = "Xvfb"  # the x11 source's X server (executable name or path)

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"selftest source must be one of {', '.join(SOURCES)}, got {self.source!r}")
        if self.capture_backend not in CAPTURE_BACKENDS:
            raise ValueError(f"capture backend must be one of {', '.join(CAPTURE_BACKENDS)}, "
                             f"got {self.capture_backend!r}")


@dataclass(frozen=True)
class SelftestReport:
    ok: bool
    reason: str  # "" when ok; else what failed, with the figures
    encoder: str
    codec: str
    frames_sent: int  # frames the pipeline encoded and handed to the track
    frames_sent_before_loss: int  # of those, before the loss window (all of them without one)
    encoder_errors: int  # frames the encoder raised on
    frames_checked: int  # decoded with a readable stamp and PSNR at or over the floor
    corrupt_frames: int  # decoded wrong with every reference intact (goal 0)
    recovering_frames: int  # decoded wrong after the receiver gave data up, before a keyframe
    missing_frames: int  # stamp numbers never decoded (between the first and the last decoded)
    unexplained_missing: int  # of those, rendered outside the loss window and its recovery
    psnr_min_db: float | None
    psnr_p50_db: float | None
    packets_dropped: int  # RTP packets the loss window dropped
    retransmitted: int  # packets the node retransmitted on NACK
    retransmit_skipped: int  # NACKed packets the node's limiter did not resend (repeated, over budget)
    keyframe_requests: int  # PLI/FIR the node received
    recovered_ms: float | None  # loss window end -> first good frame rendered after it; None: none
    seconds: float  # the run's wall time
    source: str  # x11 | pattern
    source_reason: str  # why that source (auto's probe, or asked for)
    capture: str  # the capture backend that grabbed the frames (x11grab, mss), or selftest-pattern: none
    stale_frames_skipped: int  # x11: grabs before the capture showed the first painted stamp (not checked)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class StampedSource:
    """A ``FrameSource`` of ``stamped_pattern`` frames, numbered 0, 1, ... with the render time (epoch ms).

    ``mangle(frame_no, bgra)`` (tests, fault drills) may alter a frame after its stamp is drawn.
    """

    backend = "selftest-pattern"

    def __init__(self, width: int, height: int, mangle: Mangle | None = None) -> None:
        self.width, self.height = width, height
        self.frames = 0
        self._mangle = mangle

    def grab(self) -> av.VideoFrame:
        now_us = time.time_ns() // 1000
        frame = bgra_frame(source_picture(self.width, self.height, self.frames, now_us // 1000, self._mangle))
        frame.pts, frame.time_base = now_us, US
        self.frames += 1
        return frame

    def stats(self) -> CaptureStats:
        return CaptureStats(self.backend, self.frames, 0.0, 0.0, 0.0, 0.0)

    def close(self) -> None:
        pass


class _NoInput:
    """The self-test's viewer sends no input."""

    def submit(self, event: InputEvent) -> None:
        pass

    def release_all(self) -> None:
        pass


class LossyReceiver:
    """The local decoder: an offering aiortc peer whose video receiver can drop RTP for a window."""

    def __init__(self, advertise: tuple[str, ...]) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # never a public STUN server
        self.transceiver = self.pc.addTransceiver("video", direction="recvonly")
        self.advertise = advertise
        self.drop_until: float | None = None  # monotonic s; packets before it are dropped
        self.drop_from: float | None = None
        self.dropped = 0
        self.refs_lost = False  # the jitter buffer gave packets up since the last decoded keyframe
        self.frames: list[tuple[npt.NDArray[np.uint8], bool, float, bool]] = []  # (yuv, refs lost, ms, key)
        self.first_frame = asyncio.Event()
        self.recovered = asyncio.Event()  # a frame with intact references decoded after ``watch_after_ms``
        self.watch_after_ms: float | None = None  # epoch ms
        self._reader: asyncio.Task[None] | None = None
        self.gave_up = 0  # holes given up (each followed by a PLI)
        self._hole_since: float | None = None
        self._media_ssrc: int | None = None  # the video SSRC (the first packet's: RTX comes only after a NACK)
        receiver = self.transceiver.receiver
        handle = receiver._handle_rtp_packet
        buffer = getattr(receiver, "_RTCRtpReceiver__jitter_buffer", None)
        nacks = getattr(receiver, "_RTCRtpReceiver__nack_generator", None)

        async def lossy(packet: Any, arrival_time_ms: int) -> None:
            now = time.monotonic()
            if self.drop_from is not None and self.drop_until is not None and self.drop_from <= now < self.drop_until:
                self.dropped += 1
                return
            if self._media_ssrc is None:
                self._media_ssrc = packet.ssrc
            await handle(packet, arrival_time_ms)
            if buffer is not None and nacks is not None:
                await self._give_up_old_holes(receiver, buffer, nacks, self._media_ssrc, now)

        receiver._handle_rtp_packet = lossy  # type: ignore[method-assign]
        if buffer is not None:
            self._watch_jitter_buffer(buffer)
        else:
            log.warning("selftest: aiortc's jitter buffer is not where expected; frames after loss count as corrupt")
        self.pc.on("track", self._on_track)

    def _watch_jitter_buffer(self, buffer: Any) -> None:
        remove, smart_remove, capacity = buffer.remove, buffer.smart_remove, buffer.capacity

        def removing(count: int) -> None:
            if count >= capacity:  # a misorder reset: everything given up
                self.refs_lost = True
            remove(count)

        def smart_removing(count: int) -> bool:
            self.refs_lost = True  # packets given up to make room (a hole NACK did not fill)
            return bool(smart_remove(count))

        buffer.remove, buffer.smart_remove = removing, smart_removing

    async def _give_up_old_holes(self, receiver: Any, buffer: Any, nacks: Any, ssrc: int, now: float) -> None:
        """A hole unfilled for ``HOLE_TIMEOUT_MS``: drop it (and its frames) from the jitter buffer, PLI."""
        if not nacks.missing:
            self._hole_since = None
            return
        if self._hole_since is None:
            self._hole_since = now
            return
        if (now - self._hole_since) * 1000.0 < HOLE_TIMEOUT_MS:
            return
        newest = max(nacks.missing, key=lambda seq: uint16_add(seq, -buffer._origin))
        count = min(uint16_add(newest, -buffer._origin) + 1, buffer.capacity)
        buffer.smart_remove(count)  # the watch marks the references lost
        nacks.missing.clear()
        self._hole_since = None
        self.gave_up += 1
        await receiver._send_rtcp_pli(ssrc)

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "video":
            self._reader = asyncio.ensure_future(self._read(track))

    async def _read(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                assert isinstance(frame, av.VideoFrame)
                if frame.key_frame:
                    self.refs_lost = False  # a keyframe: everything after it is decodable again
                yuv = np.asarray(frame.to_ndarray(format="yuv420p"), dtype=np.uint8)
                now_ms = time.time() * 1000.0
                self.frames.append((yuv, self.refs_lost, now_ms, bool(frame.key_frame)))
                self.first_frame.set()
                if self.watch_after_ms is not None and now_ms >= self.watch_after_ms and not self.refs_lost:
                    self.recovered.set()

    def lose(self, from_s: float, ms: int) -> None:
        self.drop_from, self.drop_until = from_s, from_s + ms / 1000.0

    async def offer(self) -> str:
        offer = await self.pc.createOffer()
        advertise_host_addresses(self.pc, self.advertise)
        await self.pc.setLocalDescription(offer)
        return str(self.pc.localDescription.sdp)

    async def close(self) -> None:
        await self.pc.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader


@dataclass(frozen=True)
class _SourceInfo:
    source: str
    reason: str
    capture: str
    stale_skipped: int


async def run_selftest(config: SelftestConfig = SelftestConfig(), *, mangle: Mangle | None = None,
                       wrap_encoder: EncoderWrap | None = None, wrap_source: SourceWrap | None = None
                       ) -> SelftestReport:
    """One self-test (see the module docstring).  Raises only for a setup the host cannot do (no encoder,
    no Xvfb for ``source="x11"``, a display or capture that does not open or never shows the painted
    picture, no loopback connection); a stream that arrives wrong is a report with ``ok`` False.

    ``mangle`` alters each picture after its stamp is drawn (before painting, for ``x11``); ``wrap_source``
    wraps the frame source (to alter frames after the capture); ``wrap_encoder`` wraps the encoder."""
    started = time.monotonic()
    choice = choose_source(config.source, shutil.which(config.xvfb), capture_backends(), config.capture_backend)
    async with contextlib.AsyncExitStack() as stack:
        if choice.source == "x11":
            painted = await stack.enter_async_context(x11_source(
                config.width, config.height, capture_backend=config.capture_backend, xvfb=config.xvfb,
                mangle=mangle))
            source: FrameSource = painted
            info = _SourceInfo("x11", choice.reason, painted.backend, painted.stale_skipped)
        else:
            source = StampedSource(config.width, config.height, mangle)
            info = _SourceInfo("pattern", choice.reason, source.backend, 0)
        if wrap_source is not None:
            source = wrap_source(source)
        return await _stream(config, source, info, started, wrap_encoder)


async def _stream(config: SelftestConfig, source: FrameSource, info: _SourceInfo, started: float,
                  wrap_encoder: EncoderWrap | None) -> SelftestReport:
    """Stream ``source`` through encoder, packetizer and loss to the local decoder; check every frame."""
    probes = await probe_all_async(SENDABLE_BACKENDS, gpu=config.gpu)
    selection = choose_backend(probes, encoder_preference=config.encoder_preference, codec_preference="auto",
                               peer_codecs=AIORTC_VIDEO_CODECS)
    backend = selection.backend
    source_format = "bgr0" if source.backend == "x11grab" else "bgra"  # as SessionRuntime opens its encoder
    encoder = await asyncio.to_thread(VideoEncoder, backend, EncoderConfig(
        config.width, config.height, float(config.fps), config.bitrate_bps, source_format=source_format,
        gpu=config.gpu))
    if wrap_encoder is not None:
        encoder = wrap_encoder(encoder)
    failed: list[BaseException] = []
    gave_up = asyncio.Event()
    loop = asyncio.get_running_loop()

    def pipeline_failed(exc: BaseException) -> None:  # the frame thread gave up (thread-safe)
        loop.call_soon_threadsafe(failed.append, exc)
        loop.call_soon_threadsafe(gave_up.set)

    pipeline = FramePipeline(source, encoder, config.fps, name="rb-frames-selftest", on_failure=pipeline_failed)
    track = EncodedVideoTrack()
    receiver = LossyReceiver(config.advertise_addresses)
    keyframe_requests = 0

    def keyframe_requested() -> None:
        nonlocal keyframe_requests
        keyframe_requests += 1
        pipeline.request_keyframe()

    peer = ViewerPeer(PeerSettings(advertise_addresses=config.advertise_addresses, playout_delay=False), track,
                      InputRouter(_NoInput()), target_bps=config.bitrate_bps, on_state=lambda _p, _s: None,
                      on_channel_open=lambda _p: None, on_keyframe_request=keyframe_requested)
    loss_start_ms = loss_end_ms = None
    sent_before_loss: int | None = None
    try:
        answer = await peer.answer(await receiver.offer(), backend.webrtc_codec)
        await receiver.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        pipeline.start()
        pipeline.attach(track)
        waits = [asyncio.ensure_future(receiver.first_frame.wait()), asyncio.ensure_future(gave_up.wait())]
        await asyncio.wait(waits, timeout=CONNECT_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        if not receiver.first_frame.is_set() and not gave_up.is_set():
            raise TimeoutError(f"no frame decoded within {CONNECT_TIMEOUT_S:g} s of the answer")
        first = time.monotonic()
        if gave_up.is_set():
            pass  # the encoder or the source failed every frame: nothing to stream, the report says why
        elif config.loss_ms > 0:
            await asyncio.sleep(config.loss_at_s)
            loss_from = time.monotonic()
            sent_before_loss = pipeline.stats().frames
            receiver.lose(loss_from, config.loss_ms)
            loss_start_ms = time.time() * 1000.0
            loss_end_ms = loss_start_ms + config.loss_ms
            # a frame rendered after the window is decoded a frame interval or more after it ends
            receiver.watch_after_ms = loss_end_ms + 1000.0 / config.fps
        if not gave_up.is_set():
            await asyncio.sleep(max(0.0, first + config.seconds - time.monotonic()))
        if loss_end_ms is not None:  # give recovery its full allowance, no more (the tally decides)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(receiver.recovered.wait(), config.recover_within_ms / 1000.0)
    finally:
        pipeline.detach(track)
        await peer.close()
        await receiver.close()
        await asyncio.to_thread(pipeline.close)
    stats = pipeline.stats()
    tally = FrameTally(config.width, config.height, config.psnr_floor_db)

    def check_all() -> None:  # ~3 ms a frame (rebuild, convert, PSNR): off the node's event loop
        for yuv, refs_lost, decoded_ms, _key in receiver.frames:
            tally.add(yuv, refs_lost, decoded_ms, loss_end_ms)

    await asyncio.to_thread(check_all)
    rtx = peer.retransmits
    counts = _Counts(stats.frames, sent_before_loss, receiver.dropped, rtx.sent, rtx.repeated + rtx.over_budget,
                     keyframe_requests, stats.encode_errors)
    return _report(config, tally, counts, stats.encoder, backend.webrtc_codec, loss_start_ms, loss_end_ms,
                   time.monotonic() - started, failed, info)


@dataclass(frozen=True)
class _Counts:
    sent: int
    sent_before_loss: int | None
    dropped: int
    retransmitted: int
    rtx_skipped: int
    keyframe_requests: int
    encoder_errors: int


def _report(cfg: SelftestConfig, tally: FrameTally, n: _Counts, encoder: str, codec: str,
            loss_start_ms: float | None, loss_end_ms: float | None, seconds: float,
            failed: list[BaseException], info: _SourceInfo) -> SelftestReport:
    recovered = None if loss_end_ms is None or tally.recovered_at_ms is None \
        else round(tally.recovered_at_ms - loss_end_ms, 1)
    unexplained = tally.unexplained_missing(loss_start_ms, tally.recovered_at_ms)
    lo, mid = tally.psnr_summary()
    problems = []
    if failed:
        problems.append(f"the frame pipeline gave up: {failed[0]!r}")
    if tally.corrupt:
        problems.append(f"{tally.corrupt} corrupt frame(s) (first: {tally.first_corrupt})")
    before = n.sent if n.sent_before_loss is None else n.sent_before_loss
    if tally.checked < cfg.min_frames_ratio * max(before, 1):
        problems.append(f"only {tally.checked} frames checked good, {before} sent before the loss window")
    if unexplained:
        problems.append(f"{unexplained} frame(s) missing outside the loss window")
    if loss_end_ms is not None and (recovered is None or recovered > cfg.recover_within_ms):
        problems.append(f"no good frame within {cfg.recover_within_ms} ms of the loss window's end")
    return SelftestReport(
        ok=not problems, reason="; ".join(problems), encoder=encoder, codec=codec, frames_sent=n.sent,
        frames_sent_before_loss=before, retransmit_skipped=n.rtx_skipped, encoder_errors=n.encoder_errors,
        frames_checked=tally.checked, corrupt_frames=tally.corrupt, recovering_frames=tally.recovering,
        missing_frames=len(tally.missing()), unexplained_missing=unexplained, psnr_min_db=lo, psnr_p50_db=mid,
        packets_dropped=n.dropped, retransmitted=n.retransmitted, keyframe_requests=n.keyframe_requests,
        recovered_ms=recovered, seconds=round(seconds, 2), source=info.source, source_reason=info.reason,
        capture=info.capture, stale_frames_skipped=info.stale_skipped)


class SelftestRunner:
    """The node's self-test loop: one run per ``interval_s`` on idle capacity; the outcome goes to ``on_result``."""

    def __init__(self, config: SelftestConfig, interval_s: float, idle: Callable[[], bool],
                 on_result: Callable[[SelftestReport | None, str], Awaitable[None] | None]) -> None:
        self.config = config
        self.interval_s = interval_s
        self.idle = idle
        self.on_result = on_result
        self.last: SelftestReport | None = None
        self.runs = 0
        # fault injection (tests, drills): alter the pattern after its stamp, or wrap the encoder
        self.mangle: Mangle | None = None
        self.wrap_encoder: EncoderWrap | None = None
        self.wrap_source: SourceWrap | None = None

    async def run_once(self) -> SelftestReport | None:
        """One self-test now if the node is idle (None when it is not); a setup error is a failed run."""
        if not self.idle():
            return None
        self.runs += 1
        try:
            report = await run_selftest(self.config, mangle=self.mangle, wrap_encoder=self.wrap_encoder,
                                        wrap_source=self.wrap_source)
            error = ""
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # task boundary: the host cannot stream at all, which is a failure too
            log.exception("selftest could not run")
            report, error = None, f"selftest could not run: {exc!r}"
        self.last = report
        why = error or (report.reason if report is not None and not report.ok else "")
        if report is not None:
            log.log(logging.INFO if report.ok else logging.WARNING,
                    "selftest %s (%s source): %d frames checked, %d corrupt, %d recovering, recovered after loss "
                    "in %s ms%s", "passed" if report.ok else "FAILED", report.source, report.frames_checked,
                    report.corrupt_frames,
                    report.recovering_frames, report.recovered_ms, f": {why}" if why else "")
        result = self.on_result(report, why)
        if result is not None:
            await result
        return report

    async def run_forever(self) -> None:
        """Every ``interval_s``: a run when the node is idle, else try again at the next interval."""
        while True:
            await asyncio.sleep(self.interval_s)
            await self.run_once()


def format_report(r: SelftestReport) -> str:
    """The figures an operator reads (``render-node selftest``)."""
    lines = [
        f"selftest: {'PASSED' if r.ok else 'FAILED'} ({r.encoder}, {r.codec}, {r.seconds:g} s)",
        f"  source {r.source}" + (f" ({r.capture} capture; {r.stale_frames_skipped} grab(s) before the first "
                                  "painted frame skipped)" if r.source == "x11" else "") + f": {r.source_reason}",
        f"  frames sent {r.frames_sent}, checked good {r.frames_checked}, corrupt {r.corrupt_frames} (goal 0); "
        f"encoder errors {r.encoder_errors}",
        f"  loss window: {r.packets_dropped} RTP packets dropped; {r.retransmitted} retransmitted on NACK, "
        f"{r.retransmit_skipped} not (limiter); {r.keyframe_requests} keyframe request(s)",
        f"  while recovering: {r.recovering_frames} frames decoded without their references (not shown by a "
        f"browser), {r.missing_frames} never decoded ({r.unexplained_missing} outside the loss)",
        f"  recovered after loss: {'-' if r.recovered_ms is None else f'{r.recovered_ms:g} ms'}",
        f"  PSNR of checked frames: min {r.psnr_min_db} dB, median {r.psnr_p50_db} dB",
    ]
    if not r.ok:
        lines.append(f"  why: {r.reason}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``render-node selftest``: one self-test now; exit 0 when it passed, 1 when it failed, 2 when it could not run."""
    import argparse
    import json

    d = SelftestConfig()
    parser = argparse.ArgumentParser(prog="render-node selftest",
                                     description="Paint a stamped pattern into a private Xvfb, grab it with the "
                                                 "sessions' capture, stream it through this host's encoder and "
                                                 "WebRTC path to a local decoder over loopback, with a window of "
                                                 "dropped RTP packets, and check every decoded frame (stamp and "
                                                 "PSNR).")
    parser.add_argument("--seconds", type=float, default=d.seconds, help="streaming time [%(default)s]")
    parser.add_argument("--loss-ms", type=int, default=d.loss_ms, help="RTP dropped for this long; 0 = none "
                                                                        "[%(default)s]")
    parser.add_argument("--encoder", default=d.encoder_preference, help="as NODE_ENCODER [%(default)s]")
    parser.add_argument("--gpu", type=int, default=None, help="the GPU whose encoder to test")
    parser.add_argument("--advertise", default="127.0.0.1", help="loopback address to connect over [%(default)s]")
    parser.add_argument("--source", choices=SOURCES, default=d.source,
                        help="x11: painted into a private Xvfb and captured; pattern: fed straight to the encoder; "
                             "auto: x11 where Xvfb and a capture backend are present [%(default)s]")
    parser.add_argument("--capture", choices=CAPTURE_BACKENDS, default=d.capture_backend,
                        help="the x11 source's capture, as NODE_CAPTURE [%(default)s]")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    ns = parser.parse_args(argv)
    config = SelftestConfig(seconds=ns.seconds, loss_ms=ns.loss_ms, encoder_preference=ns.encoder, gpu=ns.gpu,
                            advertise_addresses=(ns.advertise,), source=ns.source, capture_backend=ns.capture)
    try:
        report = asyncio.run(run_selftest(config))
    except Exception as exc:  # the host cannot stream at all: say so in one line
        print(f"render-node selftest: could not run: {exc!r}")
        return 2
    print(json.dumps(report.to_dict(), indent=2) if ns.json else format_report(report))
    return 0 if report.ok else 1
