"""Test tones: a sine as raw s16le stereo 48 kHz, and how much of a frequency a signal holds (Goertzel)."""

from __future__ import annotations

import contextlib
import math
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

RATE = 48_000


def sine_pcm(freq_hz: float, seconds: float, amplitude: float = 0.5) -> bytes:
    """``seconds`` of a sine at ``freq_hz`` (both channels), as raw interleaved s16le at 48 kHz."""
    t = np.arange(round(seconds * RATE)) / RATE
    mono = (amplitude * 32767 * np.sin(2 * np.pi * freq_hz * t)).astype("<i2")
    return np.repeat(mono, 2).tobytes()


def tone_amplitude(signal: np.ndarray, freq_hz: float, rate: int = RATE) -> float:
    """The amplitude (same units as ``signal``) of the ``freq_hz`` component, by the Goertzel algorithm."""
    x = np.asarray(signal, dtype=np.float64)
    n = len(x)
    if n == 0:
        return 0.0
    coeff = 2 * math.cos(2 * math.pi * freq_hz / rate)
    s1 = s2 = 0.0
    for v in x:
        s1, s2 = v + coeff * s1 - s2, s1
    power = s1 * s1 + s2 * s2 - coeff * s1 * s2
    return 2 * math.sqrt(max(power, 0.0)) / n


def rms(signal: np.ndarray) -> float:
    x = np.asarray(signal, dtype=np.float64)
    return float(np.sqrt(np.mean(x * x))) if len(x) else 0.0


@contextlib.contextmanager
def readable_tone_file(freq_hz: float, seconds: float, amplitude: float = 0.5) -> Iterator[Path]:
    """A raw tone file any account can read (a session's app may run as nobody; pytest's tmp_path is root's)."""
    folder = Path(tempfile.mkdtemp(prefix="rb-tone-"))
    try:
        folder.chmod(0o755)
        path = folder / "tone.raw"
        path.write_bytes(sine_pcm(freq_hz, seconds, amplitude))
        path.chmod(0o644)
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)
