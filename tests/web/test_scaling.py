"""Pure helpers of the dashboard's sizing view (web/scaling.js) run in Node: the plan's mode line, host-hours
against the packing oracle and the lower bound, and the numbers behind a logged autoscaler decision."""

from __future__ import annotations

import json

from broker.autoscale.plans import DEFAULT_PLAN
from tests.web.test_calc import WEB, run

SCALING = WEB / "scaling.js"


def test_plan_mode_line() -> None:
    predictive = {**DEFAULT_PLAN.to_dict(), "mode": "predictive"}
    r = run({
        "reactive": f"c.planModeText({json.dumps(DEFAULT_PLAN.to_dict())})",
        "predictive": f"c.planModeText({json.dumps(predictive)})",
        "view": f"c.planModeText({{plan: {json.dumps(predictive)}, phase: null}})",
        "old": "c.planModeText({schedules: []})",
    }, SCALING)
    assert r["reactive"] == r["old"] == "reactive: phase thresholds on live load"
    assert r["predictive"] == r["view"] == ("predictive: forecast demand, margin 10 % + 4 seats · looks 300 s + one "
                                            "interval ahead · 4 weeks of history")


def test_yardstick_rows() -> None:
    report = {"host_hours": {"always_on": 168000, "plan": 76789, "recommended": 71147},
              "yardsticks": {"oracle_host_hours": 61484, "lower_bound_host_hours": 56512}}
    r = run({"rows": f"c.yardstickRows({json.dumps(report)})", "none": "c.yardstickRows({host_hours: {plan: 5}})",
             "empty": "c.yardstickRows(null)"}, SCALING)
    assert [(x["key"], x["vsOracle"], x["vsBound"]) for x in r["rows"]] == [
        ("always_on", 2.732, 2.973), ("plan", 1.249, 1.359), ("recommended", 1.157, 1.259),
        ("oracle", 1, 1.088), ("lower_bound", 0.919, 1)]
    assert r["none"] == [{"key": "plan", "hours": 5, "vsOracle": None, "vsBound": None}]
    assert r["empty"] == []


def test_decision_facts_line() -> None:
    detail = {"detail": "...", "outcome": "applied", "actual": 100, "capacity": 100, "lookahead_s": 600,
              "forecast": 102.0, "correction": 1.0, "trend": 100.0, "margin_pct": 10.0, "margin_seats": 2,
              "target": 115}
    r = run({"line": f"c.decisionFacts({json.dumps(detail)})",
             "reactive": "c.decisionFacts({detail: 'peak: used 70%', outcome: 'applied'})",
             "blind": "c.decisionFacts({actual: 3, capacity: 2, trend: 15, margin_pct: 10, margin_seats: 0, "
                      "target: 17})"},
            SCALING)
    assert r["line"] == ("forecast 102 (x1.00 correction) · trend 100 · actual 100 · margin 10 % + 2 → target 115 "
                         "seats, capacity 100")
    assert r["reactive"] == ""
    assert r["blind"] == "trend 15 · actual 3 · margin 10 % + 0 → target 17 seats, capacity 2"
