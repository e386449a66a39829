"""Session state machine and timeout policy.

``next_state_allowed`` is the transition table; ``reap`` decides, for one live
session at time ``now_ms``, whether it must end and why.  The reaper loop in
``broker.service`` applies these decisions (ending is idempotent, so several
broker replicas reaping at once is harmless: the loser of the race sees
``already_ended``).

Pure: every function takes ``now_ms``; nothing reads a clock.  Timeouts of 0
mean "disabled" except ``disconnect_timeout_s`` where 0 ends at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from broker.protocol import EndReason, SessionState

S = SessionState

TRANSITIONS: Final[dict[SessionState, frozenset[SessionState]]] = {
    S.QUEUED: frozenset({S.STARTING, S.ENDED}),
    S.STARTING: frozenset({S.RUNNING, S.DISCONNECTED, S.ENDED}),
    S.RUNNING: frozenset({S.DISCONNECTED, S.ENDED}),
    S.DISCONNECTED: frozenset({S.RUNNING, S.ENDED}),
    S.ENDED: frozenset(),
}

START_TIMEOUT_MS: Final = 60_000  # a node that has not started a session in 60 s has failed it


def next_state_allowed(current: SessionState, new: SessionState) -> bool:
    """True when ``current -> new`` is a legal transition (same state is a no-op, allowed)."""
    return new == current or new in TRANSITIONS[current]


@dataclass(frozen=True)
class SessionClock:
    """The timestamps (epoch ms) the timeout policy looks at; 0 means "never"."""

    state: SessionState
    created_ms: int
    seated_ms: int = 0
    last_active_ms: int = 0
    disconnected_ms: int = 0


@dataclass(frozen=True)
class Timeouts:
    queue_timeout_s: int
    idle_timeout_s: int
    disconnect_timeout_s: int
    max_duration_s: int
    start_timeout_ms: int = START_TIMEOUT_MS


@dataclass(frozen=True)
class ReapDecision:
    end: bool
    reason: EndReason | None
    detail: str


KEEP: Final = ReapDecision(False, None, "within limits")


def reap(s: SessionClock, t: Timeouts, now_ms: int) -> ReapDecision:
    """Decide whether a live session must end now, checking the strictest rule first."""
    if s.state == S.ENDED:
        return KEEP
    if s.state == S.QUEUED:
        waited = now_ms - s.created_ms
        if waited >= t.queue_timeout_s * 1000:
            return ReapDecision(True, EndReason.QUEUE_TIMEOUT, f"queued {waited} ms >= {t.queue_timeout_s} s")
        return KEEP
    seated = s.seated_ms or s.created_ms
    if t.max_duration_s and now_ms - seated >= t.max_duration_s * 1000:
        return ReapDecision(True, EndReason.MAX_DURATION,
                            f"seated {now_ms - seated} ms >= {t.max_duration_s} s")
    if s.state == S.STARTING:
        if now_ms - seated >= t.start_timeout_ms:
            return ReapDecision(True, EndReason.START_FAILED,
                                f"starting {now_ms - seated} ms >= {t.start_timeout_ms} ms")
        return KEEP
    if s.state == S.DISCONNECTED:
        gone = now_ms - (s.disconnected_ms or seated)
        if gone >= t.disconnect_timeout_s * 1000:
            return ReapDecision(True, EndReason.DISCONNECT_TIMEOUT,
                                f"disconnected {gone} ms >= {t.disconnect_timeout_s} s")
    if t.idle_timeout_s:
        idle = now_ms - max(s.last_active_ms, seated)
        if idle >= t.idle_timeout_s * 1000:
            return ReapDecision(True, EndReason.IDLE_TIMEOUT, f"no input for {idle} ms >= {t.idle_timeout_s} s")
    return KEEP


def warn_before_end(s: SessionClock, t: Timeouts, now_ms: int, warn_s: int) -> int | None:
    """Seconds until max-duration ends this session, when that is within ``warn_s``; else None."""
    if s.state not in (S.RUNNING, S.DISCONNECTED) or not t.max_duration_s:
        return None
    seated = s.seated_ms or s.created_ms
    left_ms = seated + t.max_duration_s * 1000 - now_ms
    if 0 < left_ms <= warn_s * 1000:
        return -(-left_ms // 1000)
    return None
