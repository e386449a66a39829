"""Canary rollout policy: which seatings prefer the candidate, and the judge that promotes or rolls back.

A pool's rollout names a candidate node version and a share of new sessions that should run on
hosts of that version; every other host is "stable".  This module owns the pure parts:

- ``RolloutPolicy`` and ``POLICY_SCHEMA``: the admin's body, validated (a 422 names the field).
- ``prefers_candidate(n, share_pct)``: the deterministic split the seating Lua step
  (``create_session.lua``) applies with the pool's seating counter ``n`` (1, 2, ...): exactly
  ``floor(n * share / 100)`` of the first ``n`` seatings prefer the candidate, spread evenly.
- ``health_of(rows, ...)``: session outcomes (SQL history plus live sessions) aggregated per class.
- ``judge(policy, candidate, stable, elapsed_s)``: promote / hold / rollback with a reason code and
  the figures behind it.

Judging rules (each a candidate-minus-stable excess, so a fleet-wide problem such as a bad network
does not blame the candidate; a stable class under ``min_sessions`` counts as a perfect baseline,
the strictest comparison):

1. Fewer than ``min_sessions`` candidate outcomes (sessions that started or failed to start): hold.
2. Start-failure share over stable's by more than ``max_start_failure_pct`` points: rollback.
3. Crash share (ended ``node_ended`` after starting) over stable's by more than ``max_crash_pct``: rollback.
4. Freezes or encoder errors per session-minute over stable's by more than their limits (only when
   both classes report them; the rate is over the running minutes of the sessions that reported
   counts: live sessions, from their node's last heartbeat): rollback.
5. Median time to first frame over stable's x ``max_first_frame_ratio`` plus ``first_frame_slack_ms``
   (only when both classes have a figure): rollback.  Time to first frame is seated -> running plus
   the node's report of the first viewer offer -> the first frame a viewer decoded, where nodes
   report it for both classes; else seated -> running alone.
6. Younger than ``min_soak_s``: hold (soaking).  Otherwise promote when ``auto_promote``, else hold
   for an admin's word.

Pure: no clock (``now_ms`` and ``elapsed_s`` are inputs), no I/O, no await.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, Final

from broker.errors import ValidationError
from broker.models import check_version
from broker.validate import Field, validate

END_START_FAILED: Final = "start_failed"  # broker.protocol.EndReason.START_FAILED
END_NODE_ENDED: Final = "node_ended"  # the app or the node's runtime died after starting
MAX_VERSION_LEN: Final = 64  # the registration schema's limit on a host's version string


class Action(StrEnum):
    PROMOTE = "promote"
    HOLD = "hold"
    ROLLBACK = "rollback"


class Reason(StrEnum):
    NOT_ENOUGH_SAMPLES = "not_enough_samples"
    START_FAILURES = "start_failures"
    CRASHES = "crashes"
    FREEZES = "freezes"
    ENCODER_ERRORS = "encoder_errors"
    SLOW_FIRST_FRAME = "slow_first_frame"
    SOAKING = "soaking"
    AWAITING_ADMIN = "awaiting_admin"
    HEALTHY = "healthy"
    ADMIN = "admin"  # an admin's promote or rollback


POLICY_SCHEMA: Final = {
    "candidate_version": Field("str", required=True, max_length=MAX_VERSION_LEN,
                               description="Node version (as hosts register it) under trial"),
    "share_pct": Field("int", default=10, minimum=0, maximum=100,
                       description="Percent of new seatings that prefer candidate hosts"),
    "min_sessions": Field("int", default=20, minimum=1, maximum=100_000,
                          description="Candidate session outcomes needed before any verdict"),
    "min_soak_s": Field("int", default=1800, minimum=0, maximum=30 * 86_400,
                        description="Seconds the rollout must run before an automatic promotion"),
    "auto_promote": Field("bool", default=True, description="Promote on its own when healthy after the soak"),
    "max_start_failure_pct": Field("number", default=5.0, minimum=0, maximum=100,
                                   description="Start-failure share over stable's, percentage points"),
    "max_crash_pct": Field("number", default=5.0, minimum=0, maximum=100,
                           description="Share of started sessions ending node_ended over stable's, points"),
    "max_freezes_per_min": Field("number", default=0.5, minimum=0, maximum=1000,
                                 description="Freezes per session-minute over stable's"),
    "max_encoder_errors_per_min": Field("number", default=0.2, minimum=0, maximum=1000,
                                        description="Encoder errors per session-minute over stable's"),
    "max_first_frame_ratio": Field("number", default=1.5, minimum=1, maximum=100,
                                   description="Candidate median time to first frame / stable's"),
    "first_frame_slack_ms": Field("int", default=500, minimum=0, maximum=600_000,
                                  description="Added to stable's median time to first frame before the ratio bites"),
}


@dataclass(frozen=True)
class RolloutPolicy:
    """A pool's canary rollout (the admin's body, validated)."""

    candidate_version: str
    share_pct: int = 10
    min_sessions: int = 20
    min_soak_s: int = 1800
    auto_promote: bool = True
    max_start_failure_pct: float = 5.0
    max_crash_pct: float = 5.0
    max_freezes_per_min: float = 0.5
    max_encoder_errors_per_min: float = 0.2
    max_first_frame_ratio: float = 1.5
    first_frame_slack_ms: int = 500

    @classmethod
    def from_body(cls, body: Any) -> RolloutPolicy:
        """Validate an admin's body (422 naming the field); the version must be a non-blank string."""
        data = validate(body, POLICY_SCHEMA)
        if not data["candidate_version"]:
            raise ValidationError("candidate_version: must not be empty", field="candidate_version")
        check_version(data["candidate_version"], "candidate_version")
        for k in ("max_start_failure_pct", "max_crash_pct", "max_freezes_per_min",
                  "max_encoder_errors_per_min", "max_first_frame_ratio"):
            data[k] = float(data[k])
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def prefers_candidate(n: int, share_pct: int) -> bool:
    """Whether the ``n``-th seating (1-based) of a rollout prefers the candidate class (the Lua's rule)."""
    return (n * share_pct) // 100 > ((n - 1) * share_pct) // 100


@dataclass(frozen=True)
class SessionOutcome:
    """One seated session as the judge sees it (from SQL history or a live record)."""

    host_version: str
    seated_ms: int
    started_ms: int = 0  # 0 = never reported running
    ended_ms: int = 0  # 0 = still live
    end_reason: str = ""
    freezes: int | None = None  # node-reported counts (live sessions' last heartbeat), None = not reported
    encoder_errors: int | None = None
    first_frame_ms: float | None = None  # node-reported first offer -> first decoded frame, None = not reported


@dataclass(frozen=True)
class ClassHealth:
    """Session health of one version class over the rollout's window."""

    sessions: int = 0  # outcomes: started + failed to start (sessions still starting are not counted)
    start_failed: int = 0
    started: int = 0
    crashed: int = 0  # started, then ended node_ended
    session_minutes: float = 0.0  # running time of started sessions, minutes
    freezes: int | None = None
    encoder_errors: int | None = None
    first_frame_ms_p50: float | None = None  # median seated -> running, ms
    reported_minutes: float = 0.0  # running minutes of the sessions that reported freeze/encoder-error counts
    # median seated -> running + first offer -> first decoded frame, over the sessions whose node reports it
    viewer_first_frame_ms_p50: float | None = None
    viewer_first_frame_sessions: int = 0

    def pct(self, n: int, of: int) -> float:
        return 100.0 * n / of if of else 0.0

    @property
    def start_failure_pct(self) -> float:
        return self.pct(self.start_failed, self.sessions)

    @property
    def crash_pct(self) -> float:
        return self.pct(self.crashed, self.started)

    def per_min(self, count: int | None) -> float | None:
        """``count`` per running minute of the sessions that reported it (None: nobody reported)."""
        if count is None:
            return None
        return count / self.reported_minutes if self.reported_minutes > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "start_failure_pct": round(self.start_failure_pct, 2),
                "crash_pct": round(self.crash_pct, 2)}


def health_of(rows: Iterable[SessionOutcome], now_ms: int) -> ClassHealth:
    """Aggregate one class's sessions; a live session's running time counts up to ``now_ms``."""
    sessions = start_failed = started = crashed = 0
    minutes = reported = 0.0
    freezes: int | None = None
    errors: int | None = None
    first: list[int] = []
    viewer_first: list[float] = []
    for r in rows:
        run_min = 0.0
        if r.started_ms > 0:
            sessions += 1
            started += 1
            first.append(max(0, r.started_ms - r.seated_ms))
            run_min = max(0, (r.ended_ms or now_ms) - r.started_ms) / 60_000.0
            minutes += run_min
            if r.end_reason == END_NODE_ENDED:
                crashed += 1
            if r.first_frame_ms is not None:
                viewer_first.append(max(0, r.started_ms - r.seated_ms) + r.first_frame_ms)
        if r.freezes is not None or r.encoder_errors is not None:
            reported += run_min
        elif r.end_reason == END_START_FAILED:
            sessions += 1
            start_failed += 1
        if r.freezes is not None:
            freezes = (freezes or 0) + r.freezes
        if r.encoder_errors is not None:
            errors = (errors or 0) + r.encoder_errors
    return ClassHealth(sessions, start_failed, started, crashed, minutes, freezes, errors,
                       float(statistics.median(first)) if first else None, reported,
                       float(statistics.median(viewer_first)) if viewer_first else None, len(viewer_first))


def split_health(rows: Iterable[SessionOutcome], candidate_version: str,
                 now_ms: int) -> tuple[ClassHealth, ClassHealth]:
    """(candidate, stable) health: a session belongs to the class of the host version it was seated on."""
    rows = list(rows)
    return (health_of((r for r in rows if r.host_version == candidate_version), now_ms),
            health_of((r for r in rows if r.host_version != candidate_version), now_ms))


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: Reason
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action.value, "reason": self.reason.value, "detail": self.detail}


def judge(policy: RolloutPolicy, candidate: ClassHealth, stable: ClassHealth, elapsed_s: float) -> Verdict:
    """Promote, hold or roll back the candidate (rules in the module docstring)."""
    if candidate.sessions < policy.min_sessions:
        return Verdict(Action.HOLD, Reason.NOT_ENOUGH_SAMPLES,
                       f"{candidate.sessions} of {policy.min_sessions} candidate sessions judged so far")
    base = stable if stable.sessions >= policy.min_sessions else ClassHealth()
    excess = candidate.start_failure_pct - base.start_failure_pct
    if excess > policy.max_start_failure_pct:
        return Verdict(Action.ROLLBACK, Reason.START_FAILURES,
                       f"candidate start failures {candidate.start_failed}/{candidate.sessions} "
                       f"({candidate.start_failure_pct:.1f} %) vs stable {base.start_failure_pct:.1f} %: "
                       f"{excess:.1f} points over, limit {policy.max_start_failure_pct:g}")
    excess = candidate.crash_pct - base.crash_pct
    if excess > policy.max_crash_pct:
        return Verdict(Action.ROLLBACK, Reason.CRASHES,
                       f"candidate crashes {candidate.crashed}/{candidate.started} ({candidate.crash_pct:.1f} %) "
                       f"vs stable {base.crash_pct:.1f} %, limit +{policy.max_crash_pct:g} points")
    perfect = base is not stable  # an empty baseline reports zero of everything
    for reason, c_count, s_count, limit in (
            (Reason.FREEZES, candidate.freezes, base.freezes, policy.max_freezes_per_min),
            (Reason.ENCODER_ERRORS, candidate.encoder_errors, base.encoder_errors, policy.max_encoder_errors_per_min)):
        c_rate = candidate.per_min(c_count)
        s_rate = 0.0 if perfect else base.per_min(s_count)
        if c_rate is None or s_rate is None:
            continue
        if c_rate - s_rate > limit:
            return Verdict(Action.ROLLBACK, reason,
                           f"candidate {reason.value} {c_rate:.2f}/min vs stable {s_rate:.2f}/min, "
                           f"limit +{limit:g}/min")
    c_ff, s_ff, what = candidate.viewer_first_frame_ms_p50, stable.viewer_first_frame_ms_p50, \
        "seated -> first decoded frame"
    if c_ff is None or s_ff is None:  # a class without the node's figure: both on seated -> running
        c_ff, s_ff, what = candidate.first_frame_ms_p50, stable.first_frame_ms_p50, "seated -> running"
    if stable.sessions < policy.min_sessions:
        s_ff = None
    if c_ff is not None and s_ff is not None:
        ceiling = s_ff * policy.max_first_frame_ratio + policy.first_frame_slack_ms
        if c_ff > ceiling:
            return Verdict(Action.ROLLBACK, Reason.SLOW_FIRST_FRAME,
                           f"candidate median time to first frame ({what}) {c_ff:.0f} ms vs stable {s_ff:.0f} ms "
                           f"(ceiling {ceiling:.0f} ms)")
    if elapsed_s < policy.min_soak_s:
        return Verdict(Action.HOLD, Reason.SOAKING,
                       f"healthy so far; soaking {elapsed_s:.0f} of {policy.min_soak_s} s")
    if not policy.auto_promote:
        return Verdict(Action.HOLD, Reason.AWAITING_ADMIN, "healthy and soaked; promotion waits for an admin")
    return Verdict(Action.PROMOTE, Reason.HEALTHY,
                   f"healthy over {candidate.sessions} candidate sessions and {elapsed_s:.0f} s")
