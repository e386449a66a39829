"""Session state machine and timeout policy: table tests on explicit timestamps."""

from __future__ import annotations

import pytest

from broker.lifecycle import (
    START_TIMEOUT_MS,
    SessionClock,
    Timeouts,
    lease_expiry,
    next_state_allowed,
    reap,
    warn_before_end,
)
from broker.protocol import EndReason, SessionState

S = SessionState
T = Timeouts(queue_timeout_s=60, idle_timeout_s=600, disconnect_timeout_s=120, max_duration_s=3600)
T0 = 1_000_000


@pytest.mark.parametrize(("cur", "new", "ok"), [
    (S.QUEUED, S.STARTING, True), (S.QUEUED, S.RUNNING, False), (S.QUEUED, S.ENDED, True),
    (S.STARTING, S.RUNNING, True), (S.RUNNING, S.DISCONNECTED, True), (S.DISCONNECTED, S.RUNNING, True),
    (S.RUNNING, S.QUEUED, False), (S.ENDED, S.RUNNING, False), (S.ENDED, S.ENDED, True),
])
def test_transitions(cur: S, new: S, ok: bool) -> None:
    assert next_state_allowed(cur, new) is ok


@pytest.mark.parametrize(("clock", "now", "reason"), [
    (SessionClock(S.QUEUED, T0), T0 + 59_999, None),
    (SessionClock(S.QUEUED, T0), T0 + 60_000, EndReason.QUEUE_TIMEOUT),
    (SessionClock(S.STARTING, T0, T0), T0 + START_TIMEOUT_MS - 1, None),
    (SessionClock(S.STARTING, T0, T0), T0 + START_TIMEOUT_MS, EndReason.START_FAILED),
    (SessionClock(S.RUNNING, T0, T0, T0 + 500_000), T0 + 1_099_999, None),
    (SessionClock(S.RUNNING, T0, T0, T0 + 500_000), T0 + 1_100_000, EndReason.IDLE_TIMEOUT),
    (SessionClock(S.DISCONNECTED, T0, T0, T0 + 10, T0 + 1000), T0 + 120_999, None),
    (SessionClock(S.DISCONNECTED, T0, T0, T0 + 10, T0 + 1000), T0 + 121_000, EndReason.DISCONNECT_TIMEOUT),
    # max duration wins over everything else once reached, even for an active session
    (SessionClock(S.RUNNING, T0, T0, T0 + 3_599_000), T0 + 3_600_000, EndReason.MAX_DURATION),
    (SessionClock(S.ENDED, T0), T0 + 10**9, None),
])
def test_reap(clock: SessionClock, now: int, reason: EndReason | None) -> None:
    d = reap(clock, T, now)
    assert d.reason == reason and d.end is (reason is not None)
    assert d.detail


def test_zero_disables_idle_and_max_duration() -> None:
    t = Timeouts(60, 0, 120, 0)
    d = reap(SessionClock(S.RUNNING, T0, T0, T0), t, T0 + 10**10)
    assert not d.end


def test_warning_window_before_max_duration() -> None:
    c = SessionClock(S.RUNNING, T0, T0, T0)
    assert warn_before_end(c, T, T0 + 3_000_000, 300) is None      # 600 s left
    assert warn_before_end(c, T, T0 + 3_300_000, 300) == 300       # exactly 5 minutes left
    assert warn_before_end(c, T, T0 + 3_599_500, 300) == 1         # rounds up
    assert warn_before_end(c, T, T0 + 3_600_000, 300) is None      # already due: the reaper ends it


@pytest.mark.parametrize(("due", "total", "late_s", "limit"), [
    (0, 1000, 0.0, 0),        # nothing due
    (3, 1000, 0.0, 3),        # a few hosts died: all of them go down now
    (5, 10, 0.0, 5),          # half of a small fleet is still "a few" (<= MASS_EXPIRY_MIN)
    (100, 1000, 0.0, 100),    # 10 % at once: still believed
    (101, 1000, 0.0, 10),     # more: a stalled broker or Redis looks like this, 1 % of the fleet a pass
    (900, 50, 0.0, 1),        # at least one a pass, so a real outage still completes
    (3, 1000, 5.1, 0),        # this process's loop lags more than a third of a 15 s lease: none
    (3, 1000, 5.0, 3),
])
def test_lease_expiry(due: int, total: int, late_s: float, limit: int) -> None:
    d = lease_expiry(due, total, late_s, 15.0)
    assert d.limit == limit and d.reason
