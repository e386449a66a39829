"""Framing a session's captured PCM into fixed audio frames: the small jitter buffer between capture and track.

Job: the session's audio capture (``streamer.desktop.audio.AudioCapture``: ``parec`` reading the
session sink's monitor) delivers raw interleaved s16le stereo 48 kHz bytes in chunks of whatever
size the pipe gives; the audio track (``streamer.media.audiotrack.PcmAudioTrack``) needs one frame of
``FRAME_SAMPLES`` (20 ms, what aiortc's Opus encoder packs into one RTP packet) every 20 ms, with
a presentation timestamp counted in samples.  ``PcmFramer`` sits between them:

- ``push(data)`` appends bytes (a chunk may end inside a sample: the rest waits for the next);
- ``pop()`` always returns one frame: the oldest ``FRAME_SAMPLES`` buffered when there are that
  many, else a frame of silence (an underrun; what is buffered stays, so a late chunk adds one
  frame of cushion instead of a click in the middle of a frame);
- more than ``max_samples`` buffered (capture ahead of the track, or nobody popping) drops the
  oldest whole frames: the latency stays bounded;
- ``pts`` counts samples of every frame popped, silence included: a steady clock for RTP.

Pure: no I/O, no clock, no threads; one owner (the event loop) calls it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

SAMPLE_RATE: Final = 48_000  # Hz: Opus's native rate, what WebRTC sends
CHANNELS: Final = 2
SAMPLE_BYTES: Final = 2  # s16le
FRAME_MS: Final = 20
FRAME_SAMPLES: Final = SAMPLE_RATE * FRAME_MS // 1000  # 960 per channel
FRAME_BYTES: Final = FRAME_SAMPLES * CHANNELS * SAMPLE_BYTES  # 3840
DEFAULT_MAX_SAMPLES: Final = FRAME_SAMPLES * 5  # 100 ms of backlog at most


@dataclass(frozen=True, slots=True)
class PcmFrame:
    """One frame: ``FRAME_BYTES`` of interleaved s16le stereo, its pts in samples, silence when underrun."""

    pcm: bytes
    pts: int
    silent: bool


class PcmFramer:
    """Raw PCM chunks in, fixed frames with sample-counted pts out (see the module docstring)."""

    def __init__(self, max_samples: int = DEFAULT_MAX_SAMPLES) -> None:
        if max_samples < FRAME_SAMPLES:
            raise ValueError(f"max_samples must be at least one frame ({FRAME_SAMPLES}), got {max_samples}")
        self._max_bytes = max_samples * CHANNELS * SAMPLE_BYTES
        self._buf = bytearray()
        self.pts = 0  # samples popped so far: the next frame's pts
        self.underruns = 0  # frames of silence given because too little was buffered
        self.dropped_samples = 0  # samples dropped to keep the backlog under max_samples
        self.pushed_bytes = 0

    @property
    def buffered_samples(self) -> int:
        """Whole samples (per channel) waiting."""
        return len(self._buf) // (CHANNELS * SAMPLE_BYTES)

    def push(self, data: bytes) -> None:
        """Append captured bytes; drop the oldest whole frames beyond ``max_samples``."""
        self.pushed_bytes += len(data)
        self._buf += data
        excess = len(self._buf) - self._max_bytes
        if excess > 0:
            frames = -(-excess // FRAME_BYTES)  # whole frames, rounded up
            del self._buf[: frames * FRAME_BYTES]
            self.dropped_samples += frames * FRAME_SAMPLES

    def pop(self) -> PcmFrame:
        """The next frame: buffered PCM, or silence when less than a frame is buffered."""
        pts = self.pts
        self.pts += FRAME_SAMPLES
        if len(self._buf) < FRAME_BYTES:
            self.underruns += 1
            return PcmFrame(bytes(FRAME_BYTES), pts, silent=True)
        pcm = bytes(self._buf[:FRAME_BYTES])
        del self._buf[:FRAME_BYTES]
        return PcmFrame(pcm, pts, silent=False)

    def discard(self) -> None:
        """Drop what is buffered (a new listener starts with fresh sound, not the backlog); pts goes on."""
        whole = len(self._buf) - len(self._buf) % (CHANNELS * SAMPLE_BYTES)
        del self._buf[:whole]
