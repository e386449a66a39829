"""Glass-to-glass latency reported by a session's viewers, kept as a histogram of milliseconds.

Job: ``GlassHistogram`` counts the glass-to-glass samples (ms: the frame's render stamp to the moment
the viewer showed it) a viewer sends in ``vs`` messages (``broker.protocol.InputType.VIEWER_STATS``)
in the fixed buckets ``GLASS_BUCKETS_MS``.  ``snapshot()`` is the heartbeat's wire form
``{"le": [bounds ms], "counts": [per bucket], "sum": ms}``: counts per bucket (not cumulative), one more
count than bounds (the last: over the highest bound).  ``merge_snapshots`` sums snapshots: the node adds
its live sessions' to the ended ones' and reports one node-cumulative histogram per heartbeat (reset only
by a node restart), which the broker exports as ``render_broker_stream_glass_to_glass_seconds``.

Validation (a viewer is not trusted): ``observe`` ignores, and counts in ``ignored``, a value that is not
a finite number or lies outside 0..``GLASS_MAX_MS`` (a negative one: the viewer's clock is behind the
node's); it keeps at most ``VIEWER_STATS_MAX_SAMPLES`` of one message, and no more than a budget of
``SAMPLE_BURST`` samples refilled at ``SAMPLES_PER_S``, so a viewer that reports more often than the web
client (4 samples a second) cannot outweigh the other viewers on the host.

Concurrency: plain objects owned by one event loop (the session's data-channel handler; the agent's
heartbeat reads snapshots); no locks.  Pure: time comes in as ``now_ms`` (the caller's monotonic clock).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise
from typing import Any, Final

from broker.protocol import VIEWER_STATS_MAX_SAMPLES

# Bucket bounds, ms: frame intervals at 60/30 fps low down, the alert's 150 ms target among them.
GLASS_BUCKETS_MS: Final = (10.0, 16.0, 25.0, 33.0, 50.0, 75.0, 100.0, 150.0, 200.0, 300.0, 500.0, 1000.0, 2000.0)
GLASS_MAX_MS: Final = 60_000.0  # a longer "latency" is a broken clock, not a slow stream
SAMPLES_PER_S: Final = 8.0  # the budget's refill: twice what the web client samples (one per 250 ms)
SAMPLE_BURST: Final = 2 * VIEWER_STATS_MAX_SAMPLES  # the budget's size: two full messages at once


def plausible_ms(value: object) -> bool:
    """A sample the histogram keeps: a finite number (not a bool) within 0..GLASS_MAX_MS."""
    return (not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
            and 0.0 <= value <= GLASS_MAX_MS)


class GlassHistogram:
    """One session's glass-to-glass samples (see the module docstring)."""

    def __init__(self, bounds_ms: Sequence[float] = GLASS_BUCKETS_MS) -> None:
        if not bounds_ms or any(b <= a for a, b in pairwise(bounds_ms)) or bounds_ms[0] <= 0:
            raise ValueError(f"bucket bounds must be positive and increasing, got {list(bounds_ms)}")
        self.bounds_ms = tuple(float(b) for b in bounds_ms)
        self.counts = [0] * (len(self.bounds_ms) + 1)
        self.sum_ms = 0.0
        self.ignored = 0  # samples refused: implausible, over a message's limit, or over the budget
        self._tokens = float(SAMPLE_BURST)
        self._refilled_ms: float | None = None

    @property
    def count(self) -> int:
        return sum(self.counts)

    def observe(self, samples: Sequence[object], now_ms: float) -> int:
        """Count one message's samples (ms) at ``now_ms``; returns how many were kept."""
        if self._refilled_ms is not None:
            self._tokens = min(float(SAMPLE_BURST),
                               self._tokens + max(0.0, now_ms - self._refilled_ms) * SAMPLES_PER_S / 1000.0)
        self._refilled_ms = now_ms
        kept = 0
        for i, value in enumerate(samples):
            if i >= VIEWER_STATS_MAX_SAMPLES or self._tokens < 1.0:
                self.ignored += len(samples) - i
                break
            if not plausible_ms(value):
                self.ignored += 1
                continue
            ms = float(value)  # type: ignore[arg-type]  # plausible_ms checked it is a number
            self.counts[bisect_left(self.bounds_ms, ms)] += 1  # le semantics: a bound's value is in its bucket
            self.sum_ms += ms
            self._tokens -= 1.0
            kept += 1
        return kept

    def snapshot(self) -> dict[str, Any] | None:
        """The heartbeat's wire form, or None before the first sample."""
        if not self.count:
            return None
        return {"le": list(self.bounds_ms), "counts": list(self.counts), "sum": round(self.sum_ms, 3)}


def merge_snapshots(snapshots: Iterable[Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """The sum of snapshots of the same bounds (None ones skipped); None when there is none.

    Raises ``ValueError`` on snapshots of different bounds: they cannot be added bucket by bucket.
    """
    out: dict[str, Any] | None = None
    for snap in snapshots:
        if not snap:
            continue
        if out is None:
            out = {"le": list(snap["le"]), "counts": list(snap["counts"]), "sum": float(snap["sum"])}
            continue
        if list(snap["le"]) != out["le"] or len(snap["counts"]) != len(out["counts"]):
            raise ValueError(f"histograms of different buckets: {out['le']} and {list(snap['le'])}")
        out["counts"] = [a + b for a, b in zip(out["counts"], snap["counts"], strict=True)]
        out["sum"] = round(out["sum"] + float(snap["sum"]), 3)
    return out
