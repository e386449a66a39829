"""The built-in game's sound: short synthesized blips on game events, rendered for any stretch of wall clock.

Job: the built-in game (``streamer.desktop.game.Game``) runs in the node's own process, so it needs
no audio server: it reports events (``SoundEvent``: a kind and the render-clock instant it happened),
and ``GameSynth.render(start_ms, samples)`` turns the events that sound in that window into
interleaved s16le stereo 48 kHz PCM, the format ``streamer.desktop.pcm`` frames and the audio track
sends as Opus.  ``SynthFramer`` is the track's source for a game session: one 20 ms ``PcmFrame`` per
``pop``, on a continuous timeline that starts at the wall clock of the first ``pop``.

Sounds: a raised-cosine attack and release (no clicks) around a sine.  ``hit`` (the player touches an
enemy) 660 Hz for 90 ms; ``shot`` (a left click) 1320 Hz for 40 ms; ``beacon`` 1 kHz for 60 ms,
emitted by the synth itself at every multiple of ``beacon_period_ms`` of the render clock when
that is set (benchmarks measure audio/video sync with it: a frame's stamp carries its render-clock
instant, so the beep that starts at instant T and the frame stamped T left the game together).

Timing: an event's sound starts at its ``at_ms`` when the window holding that instant has not been
rendered yet.  An event that arrives after its window went out (the game's frame thread and the
track's pops are not in lock step) starts at the beginning of the next window, whole, and counts in
``late_events``: a blip a few ms late, never a clipped one.

Concurrency model: ``add`` may be called from the game's frame thread (it appends to a deque, which
is thread-safe); ``render`` and ``SynthFramer.pop`` belong to the event loop.  Pure otherwise: no
clock except the one ``SynthFramer`` is given, no I/O.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np

from streamer.desktop.pcm import CHANNELS, FRAME_MS, FRAME_SAMPLES, SAMPLE_RATE, PcmFrame

SAMPLES_PER_MS: Final = SAMPLE_RATE / 1000.0
RAMP_MS: Final = 3.0  # attack and release, raised cosine
FULL_SCALE: Final = 32767
# A timeline this far behind or ahead of the wall clock is restarted from the clock (the track stalled).
RESYNC_MS: Final = 5 * FRAME_MS


@dataclass(frozen=True, slots=True)
class Voice:
    """How one kind of event sounds."""

    freq_hz: float
    duration_ms: float
    gain: float  # peak amplitude, 0..1 of full scale


VOICES: Final[dict[str, Voice]] = {
    "hit": Voice(660.0, 90.0, 0.35),
    "shot": Voice(1320.0, 40.0, 0.25),
    "beacon": Voice(1000.0, 60.0, 0.5),
}


@dataclass(frozen=True, slots=True)
class SoundEvent:
    """Something the game did that makes a sound: ``kind`` (a key of ``VOICES``) at ``at_ms`` (render clock)."""

    kind: str
    at_ms: float


def envelope(t_ms: np.ndarray, duration_ms: float) -> np.ndarray:
    """0..1 gain at ``t_ms`` after a sound's start: raised-cosine ramps, flat between, 0 outside."""
    ramp = min(RAMP_MS, duration_ms / 2)
    up = 0.5 - 0.5 * np.cos(np.pi * np.clip(t_ms / ramp, 0.0, 1.0))
    down = 0.5 - 0.5 * np.cos(np.pi * np.clip((duration_ms - t_ms) / ramp, 0.0, 1.0))
    inside = (t_ms >= 0) & (t_ms < duration_ms)
    return np.where(inside, np.minimum(up, down), 0.0)


class GameSynth:
    """Game events in, PCM for any window of the render clock out (see the module docstring)."""

    def __init__(self, beacon_period_ms: int = 0) -> None:
        if beacon_period_ms < 0:
            raise ValueError(f"beacon_period_ms must be >= 0, got {beacon_period_ms}")
        self.beacon_period_ms = beacon_period_ms
        self._incoming: collections.deque[SoundEvent] = collections.deque()
        self._playing: list[tuple[Voice, float]] = []  # (voice, start ms) that may still sound
        self._rendered_to: float | None = None  # end of the last window rendered
        self.events = 0
        self.late_events = 0
        self.beacons = 0

    def add(self, event: SoundEvent) -> None:
        """Queue an event (thread-safe); unknown kinds are ignored."""
        if event.kind in VOICES:
            self._incoming.append(event)

    def _take_incoming(self, start_ms: float) -> None:
        while self._incoming:
            ev = self._incoming.popleft()
            at = ev.at_ms
            if self._rendered_to is not None and at < self._rendered_to:
                self.late_events += 1
                at = start_ms  # its window already went out: start now, whole
            self.events += 1
            self._playing.append((VOICES[ev.kind], at))

    def _beacons(self, start_ms: float, end_ms: float) -> None:
        period = self.beacon_period_ms
        if not period:
            return
        k = math.ceil(start_ms / period)
        while k * period < end_ms:
            self._playing.append((VOICES["beacon"], float(k * period)))
            self.beacons += 1
            k += 1

    def render(self, start_ms: float, samples: int) -> bytes:
        """``samples`` (per channel) of s16le stereo starting at render-clock ``start_ms``."""
        end_ms = start_ms + samples / SAMPLES_PER_MS
        self._take_incoming(start_ms)
        self._beacons(start_ms if self._rendered_to is None else max(start_ms, self._rendered_to), end_ms)
        self._rendered_to = end_ms
        mono = np.zeros(samples, dtype=np.float64)
        t = start_ms + np.arange(samples, dtype=np.float64) / SAMPLES_PER_MS  # ms of each sample
        still: list[tuple[Voice, float]] = []
        for voice, at in self._playing:
            if at >= end_ms:
                still.append((voice, at))
                continue
            rel = t - at
            mono += voice.gain * envelope(rel, voice.duration_ms) * np.sin(2 * np.pi * voice.freq_hz * rel / 1000.0)
            if at + voice.duration_ms > end_ms:
                still.append((voice, at))
        self._playing = still
        pcm = np.clip(np.round(mono * FULL_SCALE), -FULL_SCALE, FULL_SCALE).astype("<i2")
        return np.repeat(pcm, CHANNELS).tobytes()


class SynthFramer:
    """``GameSynth`` as the audio track's frame source: 20 ms frames on a continuous render-clock timeline."""

    def __init__(self, synth: GameSynth, clock_ms: Callable[[], float]) -> None:
        self.synth = synth
        self._clock_ms = clock_ms
        self._next_ms: float | None = None
        self.pts = 0
        self.resyncs = 0

    def pop(self) -> PcmFrame:
        now = self._clock_ms()
        if self._next_ms is None or abs(self._next_ms - now) > RESYNC_MS:
            if self._next_ms is not None:
                self.resyncs += 1
            self._next_ms = now
        pcm = self.synth.render(self._next_ms, FRAME_SAMPLES)
        self._next_ms += FRAME_MS
        pts = self.pts
        self.pts += FRAME_SAMPLES
        return PcmFrame(pcm, pts, silent=False)

    def discard(self) -> None:
        """Nothing is buffered: each frame is rendered when it is popped."""
