"""Freeze counting for a stream of frames: the figure the heartbeat reports as ``freezes``.

Job: ``FreezeCounter`` counts *freezes* in a sequence of frame arrival times: a gap between two
frames of at least ``freeze_threshold_ms(fps)`` (200 ms, or three frame intervals at a low frame
rate, so a 5 fps stream is not one freeze per frame; the webrtc-stats ``freezeCount`` rule is in
the same spirit).  A gap still open past the threshold counts as soon as it is seen (``idle``), once.

Two feeds use it:
- the frame thread (``streamer.media.track.FramePipeline``): frames handed to the viewer's track
  (sender-side freezes: capture, encoder or a sender that stopped pulling);
- the viewer's probe answers (``streamer.media.probe.ProbeTracker``): its decoded-frame count
  (``fd``) standing still on its own clock (viewer-side freezes: the network, loss recovery, the
  decoder).  A sender freeze shows on the viewer too, so a session reports the larger of the two
  counts, never their sum.

Pure: times are inputs (ms on any monotonic clock); no I/O, no clock reads.  Not thread-safe:
one owner feeds it (the frame thread or the event loop).
"""

from __future__ import annotations

from typing import Final

FREEZE_MIN_MS: Final = 200.0  # a gap this long is a freeze at any frame rate
FREEZE_FRAME_INTERVALS: Final = 3  # ... and at least this many frame intervals at low rates


def freeze_threshold_ms(fps: float | None) -> float:
    """The shortest gap (ms) that counts as a freeze at ``fps`` frames per second (None: unknown)."""
    if not fps or fps <= 0:
        return FREEZE_MIN_MS
    return max(FREEZE_MIN_MS, FREEZE_FRAME_INTERVALS * 1000.0 / fps)


class FreezeCounter:
    """Freezes (gaps >= the threshold) in one stream of frames; ``reset`` when a new stream starts."""

    def __init__(self) -> None:
        self.freezes = 0
        self.longest_ms = 0.0  # the longest gap seen, open gaps included
        self._last_ms: float | None = None
        self._counted = False  # the open gap already counted (by ``idle``)

    def frame(self, now_ms: float, threshold_ms: float = FREEZE_MIN_MS) -> bool:
        """A frame arrived at ``now_ms``; True when it ended a freeze not counted before."""
        fresh = False
        if self._last_ms is not None:
            gap = now_ms - self._last_ms
            self.longest_ms = max(self.longest_ms, gap)
            if gap >= threshold_ms and not self._counted:
                self.freezes += 1
                fresh = True
        self._last_ms = now_ms
        self._counted = False
        return fresh

    def idle(self, now_ms: float, threshold_ms: float = FREEZE_MIN_MS) -> bool:
        """No frame by ``now_ms``: count the open gap once it reaches the threshold (True then)."""
        if self._last_ms is None or self._counted:
            return False
        gap = now_ms - self._last_ms
        self.longest_ms = max(self.longest_ms, gap)
        if gap >= threshold_ms:
            self.freezes += 1
            self._counted = True
            return True
        return False

    def reset(self) -> None:
        """A new stream (a new viewer): the next frame starts it; the count so far stays."""
        self._last_ms = None
        self._counted = False
