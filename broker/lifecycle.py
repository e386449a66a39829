"""Session state machine and timeout policy.

``next_state_allowed`` is the transition table; ``reap`` decides, for one live
session at time ``now_ms``, whether it must end and why; ``next_due_ms`` is the
earliest instant at which ``reap`` could say "end" for a session clock (the
deadline the live store keeps in a sorted set, so the reaper reads only sessions
that are due; ``store/lua/prelude.lua`` computes the same value in each Lua step
that changes a session's clock, and a parity test checks the two agree).  The
reaper loop in ``broker.service`` applies these decisions (ending is idempotent,
so several broker replicas reaping at once is harmless: the loser of the race
sees ``already_ended``).

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

# End reason of a session Redis lost (restarted empty) that no node re-claimed within a lease of the
# recovery, or that was queued: recorded in SQL history, never silently gone.
STATE_LOST: Final = EndReason.STATE_LOST.value
START_TIMEOUT_MS: Final = 60_000  # a node that has not started a session in 60 s has failed it
# More than this share of a fleet's leases due at once (and more than MASS_EXPIRY_MIN) looks like a
# stalled broker or Redis rather than that many hosts dying together: expiry then slows to
# MASS_EXPIRY_RATE of the fleet per reaper pass, so hosts whose heartbeats were only delayed renew.
MASS_EXPIRY_SHARE: Final = 0.1
MASS_EXPIRY_MIN: Final = 5
MASS_EXPIRY_RATE: Final = 0.01
# A pool's close_grace_s when its record has none (pools stored before the setting existed)
CLOSE_GRACE_DEFAULT_S: Final = 30


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
    # When the viewer's tab said it is closing on purpose (pagehide); 0: it did not, or a viewer
    # connected since.  A disconnected session that was left ends after close_grace_s instead of
    # disconnect_timeout_s (the shorter of the two).
    left_ms: int = 0


@dataclass(frozen=True)
class Timeouts:
    queue_timeout_s: int
    idle_timeout_s: int
    disconnect_timeout_s: int
    max_duration_s: int
    start_timeout_ms: int = START_TIMEOUT_MS
    close_grace_s: int = CLOSE_GRACE_DEFAULT_S


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
        limit_s = disconnect_limit_s(s, t)
        if gone >= limit_s * 1000:
            why = "the viewer closed its tab, " if limit_s < t.disconnect_timeout_s else ""
            return ReapDecision(True, EndReason.DISCONNECT_TIMEOUT, f"{why}disconnected {gone} ms >= {limit_s} s")
    if t.idle_timeout_s:
        idle = now_ms - max(s.last_active_ms, seated)
        if idle >= t.idle_timeout_s * 1000:
            return ReapDecision(True, EndReason.IDLE_TIMEOUT, f"no input for {idle} ms >= {t.idle_timeout_s} s")
    return KEEP


@dataclass(frozen=True)
class LeaseExpiry:
    limit: int  # how many due leases this reaper pass may expire (0: none)
    reason: str


def lease_expiry(due: int, total: int, loop_late_s: float, lease_ttl_s: float) -> LeaseExpiry:
    """How many of ``due`` expired host leases (of ``total`` leased hosts) one reaper pass expires.

    None while this process's event loop runs more than a third of a lease late (heartbeats may be
    waiting in its own queue); a slow trickle when a large share is due at once (a broker or Redis
    stall looks like that, a rack failure too, and the trickle still takes it down within seconds).
    """
    if due <= 0:
        return LeaseExpiry(0, "no lease due")
    if loop_late_s > lease_ttl_s / 3:
        return LeaseExpiry(0, f"reaper ran {loop_late_s:.1f} s late (> {lease_ttl_s / 3:.1f} s): "
                              f"{due} due lease(s) wait for a pass on time")
    if due > max(MASS_EXPIRY_MIN, total * MASS_EXPIRY_SHARE):
        n = max(1, int(total * MASS_EXPIRY_RATE))
        return LeaseExpiry(n, f"{due} of {total} leases due at once: expiring {n} this pass")
    return LeaseExpiry(due, f"{due} lease(s) due")


def grace_gap_ms(lease_ttl_s: float, reaper_interval_s: float) -> int:
    """How long a gap between reaper passes (nobody reached Redis) earns every live lease a full one.

    A third of a lease: a shorter outage costs a node at most one of the three heartbeats a lease
    spans, so no healthy host can lose its lease to it; a longer one may have.  Never under two
    reaper intervals, so passes that are merely on schedule never count as a gap.  Grace is granted
    once per gap (``store/lua/reaper_pass.lua``), so a dead host is still declared down one lease
    after Redis returns.
    """
    return int(max(lease_ttl_s / 3, 2 * reaper_interval_s) * 1000)


def disconnect_limit_s(s: SessionClock, t: Timeouts) -> int:
    """How long a disconnected session is kept: the close grace once its viewer left on purpose."""
    return min(t.disconnect_timeout_s, t.close_grace_s) if s.left_ms else t.disconnect_timeout_s


def next_due_ms(s: SessionClock, t: Timeouts) -> int | None:
    """The earliest ``now_ms`` at which ``reap(s, t, now_ms)`` ends this session (None: never, as it stands).

    Exact, not a bound: ``reap(s, t, now).end`` holds iff the result is not None and ``now >= result``.
    The clock changes (input, a state change) move it; the store recomputes it on every such change.
    """
    if s.state == S.ENDED:
        return None
    if s.state == S.QUEUED:
        return s.created_ms + t.queue_timeout_s * 1000
    seated = s.seated_ms or s.created_ms
    due: list[int] = []
    if t.max_duration_s:
        due.append(seated + t.max_duration_s * 1000)
    if s.state == S.STARTING:
        due.append(seated + t.start_timeout_ms)
        return min(due)
    if s.state == S.DISCONNECTED:
        due.append((s.disconnected_ms or seated) + disconnect_limit_s(s, t) * 1000)
    if t.idle_timeout_s:
        due.append(max(s.last_active_ms, seated) + t.idle_timeout_s * 1000)
    return min(due) if due else None


def max_duration_end_ms(s: SessionClock, t: Timeouts) -> int | None:
    """When max-duration ends a seated session (None: not seated, or no limit); warnings count back from it."""
    if s.state in (S.QUEUED, S.ENDED) or not t.max_duration_s:
        return None
    return (s.seated_ms or s.created_ms) + t.max_duration_s * 1000


def warn_before_end(s: SessionClock, t: Timeouts, now_ms: int, warn_s: int) -> int | None:
    """Seconds until max-duration ends this session, when that is within ``warn_s``; else None."""
    if s.state not in (S.RUNNING, S.DISCONNECTED) or not t.max_duration_s:
        return None
    seated = s.seated_ms or s.created_ms
    left_ms = seated + t.max_duration_s * 1000 - now_ms
    if 0 < left_ms <= warn_s * 1000:
        return -(-left_ms // 1000)
    return None
