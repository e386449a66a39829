"""Receive-side buffering policy: the playout-delay range the node asks the viewer to keep (pure).

Job: pick the RTP playout-delay extension's range (``streamer.media.peer.PlayoutDelay``) from the
interarrival jitter the viewer reports (RTCP receiver reports, RFC 3550, a mean deviation in ms).
While the path is smooth the range is min = max = 0: the viewer shows each frame as soon as it is
decoded (libwebrtc's zero playout delay: no jitter-buffer wait at all).  That range also pins the
viewer's buffer: Chromium ignores its own floor (``RTCRtpReceiver.jitterBufferTarget``) while the
maximum is 0 (measured: a 50 ms floor left the buffer at 5-6 ms per frame).  So when the jitter needs
a buffer (over ``JITTER_GROW_MS``) the maximum is relaxed to ``RELAXED_MAX_MS``; the minimum stays 0,
and the viewer raises its own floor on the same jitter figure (``web/playout.js``, which keeps the
same two constants: a test checks them), so its buffer grows only then.  The decision follows the
highest jitter of the last ``SHRINK_AFTER_MS``: it relaxes at once and tightens that much later.

The jitter judged is the path's share (``path_jitter_ms``): the viewer's figure less what the node
itself adds (its frames leave render-to-send times that vary with the encoder and the CPU; the frame
track measures that the same RFC 3550 way).  A buffer at the viewer cannot make a late node on time,
only later: on a loaded 2-core node the viewer saw 15-19 ms jitter on loopback (bench_glass), and
growing the buffer for it took glass-to-glass p95 from 95 to 121 ms.

This is the policy of the web client's ``low`` mode (games).  Its ``sync`` mode (desktops: the picture
waits for the sound) offers no playout-delay extension, so the node sends none and this policy does not
apply; the page sets its floor from the audio and video delays it measures (``web/playout.js``).

Concurrency model: none.  ``decide(state, jitter_ms, now_ms)`` is a pure function: no clock, no
I/O; states and decisions are frozen values.

Invariants:
  - ``min_ms == 0`` always; ``max_ms`` is 0 or ``RELAXED_MAX_MS``;
  - ``max_ms > 0`` exactly while a jitter sample over ``JITTER_GROW_MS`` is within the last
    ``SHRINK_AFTER_MS``;
  - time never goes backwards: ``now_ms`` lower than the previous update's raises.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import StrEnum

# The path's RFC 3550 jitter (the mean deviation of arrival) above this needs a buffer: 3 x 20 = 60 ms,
# about the deviation's p99, is past 3.5 frame intervals at 60 fps, where uneven frame times show.
# Not lower: a viewer on a 94-99 % loaded 2-core machine saw 13-19 ms with no network at all
# (bench_glass), the machine's lateness beyond what the node measures as its own.
JITTER_GROW_MS = 20.0
SHRINK_AFTER_MS = 5_000  # the decision follows the highest jitter of this window
# The maximum while a buffer is needed: web/playout.js caps its floor at 250 ms; Chromium keeps its own
# estimate within [floor, max].  Under libwebrtc's 500 ms low-latency limit, so with the viewer's floor
# still 0 it keeps rendering at once.
RELAXED_MAX_MS = 250


def path_jitter_ms(viewer_jitter_ms: float, node_jitter_ms: float) -> float:
    """The path's share of the viewer's RFC 3550 jitter: independent deviations add as squares."""
    return math.sqrt(max(0.0, viewer_jitter_ms**2 - node_jitter_ms**2))


class PlayoutReason(StrEnum):
    """Why a decision is what it is (stable strings for logs and stats)."""

    SMOOTH = "smooth"  # no jitter over the threshold in the window: no buffer, frames shown at once
    JITTER = "jitter"  # the viewer may buffer: the maximum is relaxed


@dataclass(frozen=True, slots=True)
class PlayoutState:
    """The windowed maximum of jitter samples: (time_ms, jitter_ms), values strictly decreasing."""

    peaks: tuple[tuple[int, float], ...] = ()
    max_ms: int = 0
    last_update_ms: int | None = None


@dataclass(frozen=True, slots=True)
class PlayoutDecision:
    """The range to send (ms), whether it changed, why, and the next state."""

    min_ms: int
    max_ms: int
    changed: bool
    reason: PlayoutReason
    peak_jitter_ms: float | None  # the window's highest jitter sample (None: none yet)
    state: PlayoutState = field(repr=False, compare=False)


def decide(state: PlayoutState, jitter_ms: float | None, now_ms: int) -> PlayoutDecision:
    """Fold one jitter sample (ms; None: no new report) in and pick the playout-delay range."""
    if state.last_update_ms is not None and now_ms < state.last_update_ms:
        raise ValueError(f"now_ms {now_ms} is before the previous update {state.last_update_ms}")
    peaks = tuple((t, v) for t, v in state.peaks if t > now_ms - SHRINK_AFTER_MS)
    if jitter_ms is not None:
        if jitter_ms < 0:
            raise ValueError("jitter_ms must be >= 0")
        peaks = (*((t, v) for t, v in peaks if v > jitter_ms), (now_ms, jitter_ms))
    peak = peaks[0][1] if peaks else None
    needed = peak is not None and peak > JITTER_GROW_MS
    max_ms = RELAXED_MAX_MS if needed else 0
    reason = PlayoutReason.JITTER if needed else PlayoutReason.SMOOTH
    new_state = replace(state, peaks=peaks, max_ms=max_ms, last_update_ms=now_ms)
    return PlayoutDecision(0, max_ms, max_ms != state.max_ms, reason, peak, new_state)
