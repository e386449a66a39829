"""The canary judge and the seating split rule, as tables (pure: no Redis, no clock)."""

from __future__ import annotations

import pytest

from broker.errors import ValidationError
from broker.rollout.policy import (
    Action,
    ClassHealth,
    Reason,
    RolloutPolicy,
    SessionOutcome,
    health_of,
    judge,
    prefers_candidate,
    split_health,
)

P = RolloutPolicy("2.0", share_pct=10, min_sessions=20, min_soak_s=600)
GOOD = ClassHealth(sessions=40, start_failed=0, started=40, session_minutes=400.0, first_frame_ms_p50=800.0,
                   reported_minutes=400.0)


def h(**kw: object) -> ClassHealth:
    return ClassHealth(**{**GOOD.__dict__, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize("cand, stable, elapsed_s, policy, action, reason", [
    # too few candidate outcomes: hold, whatever they look like
    (h(sessions=19, start_failed=19, started=0), GOOD, 9999, P, Action.HOLD, Reason.NOT_ENOUGH_SAMPLES),
    # start failures: 3/20 = 15 % vs 0 % is 15 points over the 5-point limit
    (h(sessions=20, start_failed=3, started=17), GOOD, 0, P, Action.ROLLBACK, Reason.START_FAILURES),
    # 1/20 = 5 %: at the limit, not over it; then it soaks
    (h(sessions=20, start_failed=1, started=19), GOOD, 0, P, Action.HOLD, Reason.SOAKING),
    # the fleet fails as much (stable 10 %): not the candidate's fault
    (h(sessions=20, start_failed=3, started=17), h(start_failed=4, started=36), 9999, P, Action.PROMOTE,
     Reason.HEALTHY),
    # a stable class under min_sessions is a perfect baseline: 2/20 = 10 % fails against 0
    (h(sessions=20, start_failed=2, started=18), h(sessions=5, start_failed=5, started=0), 0, P, Action.ROLLBACK,
     Reason.START_FAILURES),
    # crashes after start: 4/40 = 10 % vs 0
    (h(crashed=4), GOOD, 9999, P, Action.ROLLBACK, Reason.CRASHES),
    # freezes per session-minute: 400 / 400 = 1.0 vs 0.1 (limit +0.5)
    (h(freezes=400), h(freezes=40), 9999, P, Action.ROLLBACK, Reason.FREEZES),
    # freezes not reported by the stable class: not compared
    (h(freezes=400), GOOD, 9999, P, Action.PROMOTE, Reason.HEALTHY),
    (h(encoder_errors=200), h(encoder_errors=0), 9999, P, Action.ROLLBACK, Reason.ENCODER_ERRORS),
    (h(encoder_errors=40), h(encoder_errors=0), 9999, P, Action.PROMOTE, Reason.HEALTHY),  # 0.1/min < 0.2
    # the rate is over the minutes of the sessions that reported counts: 40 errors in 100 reported
    # minutes is 0.4/min (over), though the class ran 400 minutes in all
    (h(encoder_errors=40, reported_minutes=100.0), h(encoder_errors=0), 9999, P, Action.ROLLBACK,
     Reason.ENCODER_ERRORS),
    # freezes against a stable class that freezes as much: the fleet's network, not the candidate
    (h(freezes=400), h(freezes=300), 9999, P, Action.PROMOTE, Reason.HEALTHY),
    # time to first frame: 800 * 1.5 + 500 = 1,700 ms ceiling
    (h(first_frame_ms_p50=1701.0), GOOD, 9999, P, Action.ROLLBACK, Reason.SLOW_FIRST_FRAME),
    (h(first_frame_ms_p50=1700.0), GOOD, 9999, P, Action.PROMOTE, Reason.HEALTHY),
    # where both classes' nodes report the viewer's first decoded frame, that figure is judged, not
    # seated -> running: 1,000 * 1.5 + 500 = 2,000 ms ceiling
    (h(viewer_first_frame_ms_p50=2001.0, viewer_first_frame_sessions=30), h(viewer_first_frame_ms_p50=1000.0,
     viewer_first_frame_sessions=30), 9999, P, Action.ROLLBACK, Reason.SLOW_FIRST_FRAME),
    (h(first_frame_ms_p50=1701.0, viewer_first_frame_ms_p50=2000.0, viewer_first_frame_sessions=30),
     h(viewer_first_frame_ms_p50=1000.0, viewer_first_frame_sessions=30), 9999, P, Action.PROMOTE, Reason.HEALTHY),
    # only the candidate reports it: both judged on seated -> running
    (h(viewer_first_frame_ms_p50=9000.0, viewer_first_frame_sessions=30), GOOD, 9999, P, Action.PROMOTE,
     Reason.HEALTHY),
    # healthy but young: soak; healthy and soaked: promote, or wait for an admin
    (GOOD, GOOD, 599, P, Action.HOLD, Reason.SOAKING),
    (GOOD, GOOD, 600, P, Action.PROMOTE, Reason.HEALTHY),
    (GOOD, GOOD, 600, RolloutPolicy("2.0", auto_promote=False, min_soak_s=600), Action.HOLD, Reason.AWAITING_ADMIN),
])
def test_judge(cand: ClassHealth, stable: ClassHealth, elapsed_s: float, policy: RolloutPolicy, action: Action,
               reason: Reason) -> None:
    v = judge(policy, cand, stable, elapsed_s)
    assert (v.action, v.reason) == (action, reason), v.detail
    assert v.detail


def test_health_of_counts_outcomes_and_time_to_first_frame() -> None:
    rows = [
        SessionOutcome("2.0", seated_ms=0, started_ms=1000, ended_ms=61_000, end_reason="user", freezes=None),
        SessionOutcome("2.0", seated_ms=0, started_ms=3000, ended_ms=0, freezes=2, encoder_errors=1,
                       first_frame_ms=400.0),  # live, its node reports counts and the viewer's first frame
        SessionOutcome("2.0", seated_ms=0, ended_ms=60_000, end_reason="start_failed"),
        SessionOutcome("2.0", seated_ms=0, started_ms=2000, ended_ms=32_000, end_reason="node_ended"),
        SessionOutcome("2.0", seated_ms=0),  # still starting: no outcome yet
        SessionOutcome("1.0", seated_ms=0, started_ms=500, ended_ms=0),
    ]
    cand, stable = split_health(rows, "2.0", now_ms=123_000)
    assert (cand.sessions, cand.started, cand.start_failed, cand.crashed) == (4, 3, 1, 1)
    assert cand.session_minutes == pytest.approx(1.0 + 2.0 + 0.5)
    assert (cand.freezes, cand.encoder_errors, cand.first_frame_ms_p50) == (2, 1, 2000.0)
    assert cand.start_failure_pct == 25.0 and cand.crash_pct == pytest.approx(100 / 3)
    assert (stable.sessions, stable.freezes, stable.first_frame_ms_p50) == (1, None, 500.0)
    # rates are over the reporting (live) session's 2 minutes, not the class's 3.5
    assert cand.reported_minutes == pytest.approx(2.0) and cand.per_min(cand.freezes) == pytest.approx(1.0)
    assert stable.per_min(stable.freezes) is None
    # seated -> running (3,000) + offer -> first decoded frame (400), over the one session reporting it
    assert (cand.viewer_first_frame_ms_p50, cand.viewer_first_frame_sessions) == (3400.0, 1)
    assert stable.viewer_first_frame_ms_p50 is None
    assert health_of([], 0) == ClassHealth()


@pytest.mark.parametrize("share", [0, 1, 10, 25, 33, 50, 99, 100])
def test_prefers_candidate_spreads_exactly_the_share(share: int) -> None:
    picks = [prefers_candidate(n, share) for n in range(1, 1001)]
    assert sum(picks) == share * 10
    for window in range(0, 1000, 100):  # evenly: every 100 consecutive seatings carry the share
        assert sum(picks[window:window + 100]) == share


@pytest.mark.parametrize("body, field", [
    ({}, "candidate_version"),
    ({"candidate_version": ""}, "candidate_version"),
    ({"candidate_version": " 2.0"}, "candidate_version"),
    ({"candidate_version": "x" * 65}, "candidate_version"),
    ({"candidate_version": "2.0", "share_pct": 101}, "share_pct"),
    ({"candidate_version": "2.0", "share_pct": 5.5}, "share_pct"),
    ({"candidate_version": "2.0", "min_sessions": 0}, "min_sessions"),
    ({"candidate_version": "2.0", "max_first_frame_ratio": 0.5}, "max_first_frame_ratio"),
    ({"candidate_version": "2.0", "surprise": 1}, "surprise"),
])
def test_bad_policies_name_the_field(body: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        RolloutPolicy.from_body(body)
    assert err.value.field == field


def test_policy_round_trips() -> None:
    p = RolloutPolicy.from_body({"candidate_version": "2.0", "share_pct": 5, "max_crash_pct": 2})
    assert RolloutPolicy.from_body(p.to_dict()) == p and p.max_crash_pct == 2.0 and p.min_sessions == 20
