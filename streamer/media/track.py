"""The session's video: a frame thread that captures and encodes, and the aiortc track it feeds.

Job: ``FramePipeline`` runs one dedicated thread per session that, at the
current frame rate, grabs a frame (``streamer.desktop.capture.FrameSource``), encodes
it (``encoder.VideoEncoder``) and hands the packet to the attached
``EncodedVideoTrack``.  ``EncodedVideoTrack`` is an aiortc
``MediaStreamTrack`` (kind ``video``) whose ``recv()`` returns those encoded
``av.Packet``s: aiortc's ``RTCRtpSender._next_encoded_frame`` sees a packet
rather than a frame and only packetizes it (``codecs/h264.py`` /
``codecs/vpx.py`` ``pack``), so nothing is encoded twice.

Concurrency model:
- the frame thread (named ``rb-frames-<session>``) is the only caller of
  ``source.grab``, ``encoder.encode`` and ``encoder.close``; grab and encode
  therefore never run on the event loop;
- control methods (``attach``, ``detach``, ``replace_encoder``, ``set_fps``,
  ``set_bitrate``, ``request_keyframe``, ``stats``) may be called from any
  thread (in practice the event loop): they record intent under a lock and
  wake the thread, which applies it between frames;
- ``EncodedVideoTrack.put``/``wants_frame`` are called by the frame thread;
  ``recv`` runs on the event loop, woken through ``call_soon_threadsafe``;
- ``close`` blocks until the thread has exited (call it through
  ``asyncio.to_thread``).

Invariants:
- frames are dropped *before* encoding, never after: a tick is skipped when
  the attached track still holds ``MAX_QUEUED_FRAMES`` packets (the sender is
  behind) and ticks that passed while a frame was being made are not made up
  (we are behind).  An encoded packet is never discarded, since every later
  P-frame references it;
- nothing is grabbed or encoded while no track is attached (the thread
  blocks on an event) or before the track's sender has started pulling (the
  thread only ticks);
- the first packet a newly attached track receives is a keyframe;
- one encode serves every viewer: besides the attached track (the owner's), ``add_follower``
  tracks (share viewers) get the same packets.  A follower starts at a keyframe and, once behind
  (its queue full), drops packets up to the next keyframe rather than block or slow the others;
  a follower that waits for a keyframe asks the encoder for one at most every
  ``FOLLOWER_KEYFRAME_INTERVAL_S`` (requests from several followers coalesce into one);
- after ``close`` the thread has exited and every encoder the pipeline was
  given is closed (a grab hung for ``JOIN_TIMEOUT_S`` is logged as an error
  and its daemon thread left behind).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import av
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from encoder import VideoEncoder
from streamer.desktop.capture import FrameSource
from streamer.media.freezes import FreezeCounter, freeze_threshold_ms

log = logging.getLogger(__name__)

MAX_QUEUED_FRAMES: Final = 2  # packets a track may hold before the frame thread skips ticks
FPS_WINDOW_S: Final = 2.0  # measured fps = frames delivered over this many seconds / the window
MAX_CONSECUTIVE_FAILURES: Final = 30  # grab/encode failures in a row before the pipeline gives up (1 s at 30 fps)
MIN_FPS: Final = 1
# a follower (share viewer) waiting for a keyframe asks for one at most this often, whatever their number
FOLLOWER_KEYFRAME_INTERVAL_S: Final = 1.0
FOLLOWER_MAX_QUEUED: Final = 4  # a share viewer's track holds a little more than the owner's before it drops
JOIN_TIMEOUT_S: Final = 10.0  # close() waits this long for a frame in progress
MAX_FPS: Final = 240
LOAD_GAIN: Final = 1 / 8  # the frame load's moving average (PipelineStats.load): about 8 frames
RTP_CLOCK_PER_MS: Final = 90  # packet pts: the render clock (ms since the epoch) in 90 kHz units


# RFC 3550's jitter gain: the send jitter below is the viewer's interarrival jitter's node-side share.
SEND_JITTER_GAIN: Final = 1 / 16


class EncodedVideoTrack(MediaStreamTrack):
    """A video track that yields already-encoded ``av.Packet``s (one per frame, 90 kHz pts).

    Create it on the event loop.  The frame thread calls ``wants_frame`` and
    ``put``; aiortc's sender calls ``recv``.  ``stop()`` (aiortc calls it when
    the sender stops) makes ``recv`` raise ``MediaStreamError``.

    ``send_jitter_ms``: RFC 3550 jitter (a mean deviation, ms) of each frame's time from its
    render stamp (pts: the render clock, ms since the epoch x 90) to the moment aiortc takes it
    to packetize and send -- the part of the viewer's interarrival jitter that the node itself
    causes (encode time varies, the loop or the CPU is late), per frame as libwebrtc counts it.
    """

    kind = "video"

    def __init__(self, max_queued: int = MAX_QUEUED_FRAMES, wall_ms: Callable[[], float] | None = None) -> None:
        """``wall_ms``: the wall clock in ms (the render stamps' clock); tests pass a fake one."""
        super().__init__()
        self._wall_ms = wall_ms or _wall_ms
        self._owner_loop = asyncio.get_running_loop()  # not _loop: pyee's emitter owns that name
        self._max_queued = max_queued
        self._lock = threading.Lock()  # guards _queue
        self._queue: deque[av.Packet[Any]] = deque()
        self._ready = asyncio.Event()
        self._pulling = False  # set by the first recv(): the sender runs
        self.delivered = 0  # packets handed to the sender
        self.send_jitter_ms = 0.0
        self._last_transit_ms: float | None = None

    def wants_frame(self) -> bool:
        """True when the sender is pulling and fewer than ``max_queued`` packets wait (any thread)."""
        if not self._pulling or self.readyState != "live":
            return False
        with self._lock:
            return len(self._queue) < self._max_queued

    def put(self, packet: av.Packet[Any]) -> None:
        """Queue one encoded frame (frame thread).  Never blocks; the caller checked ``wants_frame``."""
        with self._lock:
            self._queue.append(packet)
        try:
            self._owner_loop.call_soon_threadsafe(self._ready.set)
        except RuntimeError:  # the loop is closed: the session is gone, nobody will recv
            pass

    async def recv(self) -> av.Packet[Any]:
        self._pulling = True
        while True:
            if self.readyState != "live":
                raise MediaStreamError
            with self._lock:
                packet = self._queue.popleft() if self._queue else None
            if packet is not None:
                self.delivered += 1
                self._note_send(packet)
                return packet
            self._ready.clear()
            with self._lock:  # re-check: a put between the check and clear() has scheduled a set()
                if self._queue:
                    continue
            await self._ready.wait()

    def stop(self) -> None:
        super().stop()
        self._ready.set()  # wake a pending recv() so it raises

    def _note_send(self, packet: av.Packet[Any]) -> None:
        if packet.pts is None:
            return
        transit_ms = self._wall_ms() - packet.pts / RTP_CLOCK_PER_MS
        if self._last_transit_ms is not None:
            change = abs(transit_ms - self._last_transit_ms)
            self.send_jitter_ms += (change - self.send_jitter_ms) * SEND_JITTER_GAIN
        self._last_transit_ms = transit_ms


class Follower:
    """A share viewer's track fed from the pipeline's encode (frame thread state, under the pipeline lock)."""

    __slots__ = ("delivered", "dropped", "needs_keyframe", "track")

    def __init__(self, track: EncodedVideoTrack) -> None:
        self.track = track
        self.needs_keyframe = True  # it starts (and restarts after falling behind) on a keyframe
        self.delivered = 0  # packets handed to its track
        self.dropped = 0  # packets it missed while behind or waiting for a keyframe


@dataclass(frozen=True, slots=True)
class PipelineStats:
    """What the frame thread did.  Times in milliseconds; fps measured over ``FPS_WINDOW_S``."""

    fps: float  # frames delivered per second, measured
    target_fps: int  # the pacing rate
    frames: int  # frames encoded and delivered
    skipped_backpressure: int  # ticks skipped because the track was full or not yet pulling
    skipped_late: int  # ticks lost because a frame took longer than the frame interval
    failures: int  # grab/encode failures
    grab_ms: float  # last grab
    encode_ms: float  # last encode (conversion included)
    encoder: str  # backend name of the encoder in use
    width: int  # encoded size
    height: int
    # wall time per frame (grab or render + conversion + encode) over the frame interval, a moving
    # average over about LOAD_GAIN^-1 frames; 1 or more: frames start late (0: none made yet)
    load: float = 0.0
    # frames handed to the track 200 ms or more (3+ intervals at low rates) after the previous one
    # (streamer.media.freezes), since the pipeline started
    freezes: int = 0
    encode_errors: int = 0  # frames the encoder raised on (also counted in ``failures``)


def merge_frame_packets(packets: list[av.Packet[Any]]) -> av.Packet[Any] | None:
    """One packet per frame: aiortc marks the end of a frame on each ``recv()`` result.

    Encoders here emit exactly one packet per frame; should an H.264 encoder
    ever split a frame, its Annex-B pieces are concatenated (same pts).
    """
    if not packets:
        return None
    if len(packets) == 1:
        return packets[0]
    merged = av.Packet(b"".join(bytes(p) for p in packets))
    merged.pts = packets[0].pts
    merged.dts = packets[0].dts
    merged.time_base = packets[0].time_base
    merged.is_keyframe = any(p.is_keyframe for p in packets)
    return merged


class FramePipeline:
    """grab -> encode -> track, on one dedicated thread, paced at ``fps`` (see module docstring).

    ``on_failure(exc)`` is called from the frame thread once, when grabbing or
    encoding failed ``MAX_CONSECUTIVE_FAILURES`` times in a row and the thread
    gave up; it must be thread-safe (e.g. ``loop.call_soon_threadsafe``).
    """

    def __init__(
        self,
        source: FrameSource,
        encoder: VideoEncoder,
        fps: int,
        *,
        name: str,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._source = source
        self._encoder = encoder
        self._fps = _check_fps(fps)
        self._on_failure = on_failure
        self._lock = threading.Lock()  # guards the fields below marked (L)
        self._wake = threading.Event()
        self._stopping = False  # (L)
        self._sink: EncodedVideoTrack | None = None  # (L)
        self._followers: tuple[Follower, ...] = ()  # (L) replaced whole, so the thread reads a snapshot
        self._follower_keyframe_s = 0.0  # frame thread: monotonic s of the last keyframe asked for followers
        self._pending_encoder: VideoEncoder | None = None  # (L) installed by the thread before the next frame
        self._pending_fps: int | None = None  # (L)
        self._pending_source: FrameSource | None = None  # (L) installed by the thread before the next frame
        self._source_installed = threading.Event()  # (L) set once the pending source is in use
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = False
        self._closed = False
        # Written by the frame thread only; read by stats() (plain ints/floats: atomic under the GIL).
        self._frames = 0
        self._skipped_backpressure = 0
        self._skipped_late = 0
        self._failures = 0
        self._encode_errors = 0
        self._freezes = FreezeCounter()  # gaps between frames handed to the current track
        self._grab_ms = 0.0
        self._encode_ms = 0.0
        self._load = 0.0
        self._delivered_at: deque[float] = deque(maxlen=MAX_FPS * int(FPS_WINDOW_S))
        # Start of the current track's measurement: its first frame minus one interval (monotonic s).
        self._measure_since = 0.0

    # -- control (thread-safe) -------------------------------------------------------

    @property
    def thread_name(self) -> str:
        return self._thread.name

    @property
    def encoder(self) -> VideoEncoder:
        """The encoder in use, or the one about to be installed."""
        with self._lock:
            return self._pending_encoder or self._encoder

    @property
    def fps(self) -> int:
        with self._lock:
            return self._pending_fps or self._fps

    @property
    def load(self) -> float:
        """``PipelineStats.load`` alone (cheap: the control loop reads it every period)."""
        return self._load

    def start(self) -> None:
        if self._started:
            raise RuntimeError("pipeline already started")
        self._started = True
        self._thread.start()

    def attach(self, track: EncodedVideoTrack) -> None:
        """Deliver to ``track`` from now on (its first packet is a keyframe)."""
        with self._lock:
            self._sink = track
        self._wake.set()

    def detach(self, track: EncodedVideoTrack | None = None) -> None:
        """Stop delivering (to ``track`` only, if given); the thread goes idle."""
        with self._lock:
            if track is None or self._sink is track:
                self._sink = None
        self._wake.set()

    def add_follower(self, track: EncodedVideoTrack) -> Follower:
        """Also deliver to ``track`` (a share viewer), from the next keyframe on; the returned record counts."""
        follower = Follower(track)
        with self._lock:
            self._followers = (*self._followers, follower)
        self._wake.set()
        return follower

    def remove_follower(self, track: EncodedVideoTrack) -> None:
        with self._lock:
            self._followers = tuple(f for f in self._followers if f.track is not track)
        self._wake.set()

    def replace_encoder(self, encoder: VideoEncoder) -> None:
        """Use ``encoder`` from the next frame on; the thread closes the old one (one keyframe)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("pipeline closed")
            previous, self._pending_encoder = self._pending_encoder, encoder
        if previous is not None:
            previous.close()  # never installed, so the thread cannot be using it
        self._wake.set()

    def replace_source(self, source: FrameSource) -> threading.Event:
        """Grab from ``source`` from the next frame on (a resized screen's capture).

        The caller keeps ``source`` (it closes it when it is done with the session); the source it
        replaces becomes the pipeline's: the frame thread closes it once it switched, or ``close``
        does if the switch never happened.  The event is set once no grab of the old source can
        happen any more (the thread switched, between two frames).
        """
        installed = threading.Event()
        with self._lock:
            if self._closed:
                raise RuntimeError("pipeline closed")
            previous, self._pending_source = self._pending_source, source
            self._source_installed = installed
        if previous is not None:
            previous.close()  # never installed; its caller handed it over by replacing it
        self._wake.set()
        return installed

    def set_fps(self, fps: int) -> None:
        """Pace at ``fps`` frames per second from the next tick on."""
        with self._lock:
            self._pending_fps = _check_fps(fps)
        self._wake.set()

    def set_bitrate(self, bitrate_bps: int) -> None:
        """Forward a target bitrate (bits per second) to the encoder in use (thread-safe there)."""
        self.encoder.set_bitrate(bitrate_bps)

    def request_keyframe(self) -> None:
        """Make the next frame a keyframe (thread-safe in the encoder)."""
        self.encoder.request_keyframe()

    def stats(self) -> PipelineStats:
        now = time.monotonic()
        since = max(now - FPS_WINDOW_S, self._measure_since)
        recent = sum(1 for t in list(self._delivered_at) if t >= since)
        encoder = self.encoder
        return PipelineStats(
            fps=recent / (now - since) if recent else 0.0,
            target_fps=self.fps,
            frames=self._frames,
            skipped_backpressure=self._skipped_backpressure,
            skipped_late=self._skipped_late,
            failures=self._failures,
            grab_ms=self._grab_ms,
            encode_ms=self._encode_ms,
            encoder=encoder.backend.name,
            width=encoder.config.width,
            height=encoder.config.height,
            load=self._load,
            freezes=self._freezes.freezes,
            encode_errors=self._encode_errors,
        )

    def close(self) -> None:
        """Stop the thread, wait for it, close every encoder.  Blocking; idempotent."""
        with self._lock:
            self._stopping = True
            self._closed = True
            self._sink = None
            self._followers = ()
        self._wake.set()
        if self._started and self._thread is not threading.current_thread():
            self._thread.join(JOIN_TIMEOUT_S)
            if self._thread.is_alive():  # a grab stuck in the X server: leave the daemon thread, say so
                log.error("%s did not exit within %.0f s", self._thread.name, JOIN_TIMEOUT_S)
        with self._lock:
            pending, self._pending_encoder = self._pending_encoder, None
            pending_source, self._pending_source = self._pending_source, None
        if pending_source is not None:
            self._source.close()  # the replaced source, never switched away from; the caller owns the new one
        for encoder in (pending, self._encoder):
            if encoder is not None:
                encoder.close()

    # -- the frame thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # task boundary: log, tell the session, end the thread
            log.exception("%s: frame thread crashed", self._thread.name)
            self._fail(exc)

    def _loop(self) -> None:
        last_sink: EncodedVideoTrack | None = None
        next_tick = time.monotonic()
        consecutive_failures = 0
        while True:
            self._wake.clear()
            with self._lock:
                if self._stopping:
                    return
                sink = self._sink
                followers = self._followers
                new_encoder, self._pending_encoder = self._pending_encoder, None
                new_source, self._pending_source = self._pending_source, None
                installed = self._source_installed
                if self._pending_fps is not None:
                    self._fps, self._pending_fps = self._pending_fps, None
                period_s = 1.0 / self._fps
            if new_source is not None:
                old_source, self._source = self._source, new_source
                installed.set()
                try:
                    old_source.close()
                except Exception:  # a capture that fails to close must not end the stream
                    log.exception("%s: closing the replaced source failed", self._thread.name)
            if new_encoder is not None:
                old, self._encoder = self._encoder, new_encoder
                old.close()  # the new encoder's first frame is a keyframe
            if sink is None and not followers:
                self._wake.wait()  # attach(), add_follower() or close() wakes us
                next_tick = time.monotonic()
                continue
            now = time.monotonic()
            if now < next_tick:
                self._wake.wait(next_tick - now)
                continue
            late = int((now - next_tick) / period_s)  # whole intervals we are behind: not made up
            self._skipped_late += late
            next_tick += (late + 1) * period_s
            # the owner's sender paces the encode; with no owner, any follower able to take a frame does
            if not (sink.wants_frame() if sink is not None else any(f.track.wants_frame() for f in followers)):
                self._skipped_backpressure += 1
                continue
            if sink is not None and sink is not last_sink:
                self._encoder.request_keyframe()  # a new viewer's decoder starts here
                self._measure_since = time.monotonic() - period_s
                self._freezes.reset()  # a new viewer's stream starts with its first frame
                last_sink = sink
            self._ask_keyframe_for(followers)
            try:
                self._produce(sink, followers, period_s)
                consecutive_failures = 0
            except Exception as exc:  # capture or codec error on one frame: retry, give up later
                self._failures += 1
                consecutive_failures += 1
                if consecutive_failures == 1:
                    log.warning("%s: frame failed: %r", self._thread.name, exc)
                if consecutive_failures >= MAX_CONSECUTIVE_FAILURES:
                    log.error("%s: %d frames failed in a row, giving up", self._thread.name, consecutive_failures)
                    self._fail(exc)
                    return

    def _ask_keyframe_for(self, followers: tuple[Follower, ...]) -> None:
        """A follower whose sender pulls and that waits for a keyframe: one request per interval for all."""
        if not any(f.needs_keyframe and f.track.wants_frame() for f in followers):
            return
        now = time.monotonic()
        if now - self._follower_keyframe_s >= FOLLOWER_KEYFRAME_INTERVAL_S:
            self._follower_keyframe_s = now
            self._encoder.request_keyframe()

    @staticmethod
    def _fan_out(packet: av.Packet[Any], followers: tuple[Follower, ...]) -> None:
        """The packet to each follower that can take it; one behind waits for the next keyframe."""
        for f in followers:
            if f.needs_keyframe and not packet.is_keyframe:
                f.dropped += 1
            elif f.track.wants_frame():
                f.track.put(packet)
                f.needs_keyframe = False
                f.delivered += 1
            else:  # behind (or not pulling yet): a later P-frame would reference what it missed
                f.needs_keyframe = True
                f.dropped += 1

    def _produce(self, sink: EncodedVideoTrack | None, followers: tuple[Follower, ...], period_s: float) -> None:
        t0 = time.perf_counter()
        frame = self._source.grab()
        t1 = time.perf_counter()
        try:
            packet = merge_frame_packets(self._encoder.encode(frame))
        except Exception:
            self._encode_errors += 1
            raise
        t2 = time.perf_counter()
        self._grab_ms = (t1 - t0) * 1000.0
        self._encode_ms = (t2 - t1) * 1000.0
        self._load += ((t2 - t0) / period_s - self._load) * LOAD_GAIN
        if packet is None:
            return  # the encoder invariant says this does not happen; nothing to send
        if sink is not None:
            sink.put(packet)
        self._fan_out(packet, followers)
        self._frames += 1
        delivered = time.monotonic()
        self._delivered_at.append(delivered)
        self._freezes.frame(delivered * 1000.0, freeze_threshold_ms(1.0 / period_s))

    def _fail(self, exc: BaseException) -> None:
        if self._on_failure is not None:
            try:
                self._on_failure(exc)
            except Exception:
                log.exception("%s: on_failure callback failed", self._thread.name)


def _wall_ms() -> float:
    return time.time() * 1000.0


def _check_fps(fps: int) -> int:
    if not MIN_FPS <= fps <= MAX_FPS:
        raise ValueError(f"fps must be within {MIN_FPS}..{MAX_FPS}, got {fps}")
    return int(fps)
