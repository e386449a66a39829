"""The session's sound as an aiortc audio track: 20 ms s16 stereo 48 kHz frames, paced by the clock.

Job: ``PcmAudioTrack`` hands aiortc one ``av.AudioFrame`` of ``streamer.desktop.pcm.FRAME_SAMPLES``
every 20 ms, taken from a ``streamer.desktop.pcm.PcmFramer`` that the session's capture fills
(``streamer.desktop.audio.AudioCapture``), or for the built-in game from a
``streamer.desktop.gamesound.SynthFramer``; aiortc's sender encodes it as Opus.  The track keeps
time itself (frame n is due ``n * 20 ms`` after its first ``recv``), so a capture that stalls or a
sink nobody plays into gives silence frames at the same pace rather than a stalled stream.

Concurrency model: ``recv`` runs on the event loop (aiortc's sender task), as does the capture
that pushes into the framer; neither blocks.

Invariants: pts are in samples (time base 1/48000) and grow by ``FRAME_SAMPLES`` per frame; the
first ``recv`` discards the framer's backlog, so a viewer hears the session from now, not the
last 100 ms of whatever played before it connected.
"""

from __future__ import annotations

import asyncio
import fractions
import time
from typing import Final, Protocol

from aiortc import AudioStreamTrack
from aiortc.mediastreams import MediaStreamError
from av import AudioFrame

from streamer.desktop.pcm import FRAME_SAMPLES, SAMPLE_RATE, PcmFrame

TIME_BASE: Final = fractions.Fraction(1, SAMPLE_RATE)


class PcmSource(Protocol):
    """Where the track takes its frames: a ``PcmFramer`` (captured sound) or a ``SynthFramer`` (the game's)."""

    def pop(self) -> PcmFrame: ...

    def discard(self) -> None: ...


class PcmAudioTrack(AudioStreamTrack):
    """Frames from ``framer``, one per 20 ms of the monotonic clock."""

    def __init__(self, framer: PcmSource) -> None:
        super().__init__()
        self._framer = framer
        self._t0: float | None = None
        self._sent = 0  # frames returned
        self.silent_frames = 0

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._t0 is None:
            self._t0 = time.monotonic()
            self._framer.discard()
        else:
            wait = self._t0 + self._sent * FRAME_SAMPLES / SAMPLE_RATE - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        chunk = self._framer.pop()
        self._sent += 1
        if chunk.silent:
            self.silent_frames += 1
        frame = AudioFrame(format="s16", layout="stereo", samples=FRAME_SAMPLES)
        frame.planes[0].update(chunk.pcm)
        frame.pts = chunk.pts
        frame.sample_rate = SAMPLE_RATE
        frame.time_base = TIME_BASE
        return frame
