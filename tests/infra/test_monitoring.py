"""Alert rules and the Grafana dashboard: promtool checks and unit-tests the rules, and every metric they
read is one the broker really exports (scraped from a real app with a host, GPUs and sessions reporting)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.broker.test_gpu_metrics import H200, L4, register
from tests.conftest import NODE, auth

INFRA = Path(__file__).resolve().parents[2] / "infra"
RULES = INFRA / "prometheus" / "render-broker.rules.yml"
RULE_TESTS = INFRA / "prometheus" / "render-broker.rules.test.yml"
DASHBOARD = INFRA / "grafana" / "render-broker.json"
SEVERITIES = {"page", "ticket", "info"}
METRIC = re.compile(r"\brender_broker_[a-z0-9_]+")
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="promtool missing (Debian package prometheus; scripts/setup.sh installs it)")


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60, check=False,
                          cwd=RULES.parent)


@needs_promtool
def test_promtool_accepts_the_rules() -> None:
    out = _promtool("check", "rules", RULES.name)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


@needs_promtool
def test_promtool_rule_unit_tests_pass() -> None:
    out = _promtool("test", "rules", RULE_TESTS.name)
    assert out.returncode == 0, out.stdout + out.stderr


def _alerts() -> list[dict[str, object]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for g in groups for rule in g["rules"] if "alert" in rule]


def test_every_alert_has_a_tier_and_a_summary_and_each_tier_is_used() -> None:
    alerts = _alerts()
    for rule in alerts:
        labels, notes = rule.get("labels") or {}, rule.get("annotations") or {}
        assert labels.get("severity") in SEVERITIES, rule["alert"]  # type: ignore[union-attr]
        assert notes.get("summary"), rule["alert"]  # type: ignore[union-attr]
    assert {r["labels"]["severity"] for r in alerts} == SEVERITIES  # type: ignore[index]
    names = [r["alert"] for r in alerts]
    assert len(names) == len(set(names))


def test_dashboard_is_well_formed() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "render-broker" and dash["panels"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dash["templating"]["list"]}
    for p in dash["panels"]:
        assert {"x", "y", "w", "h"} <= set(p["gridPos"]), p["title"]
        if p["type"] == "row":
            continue
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            used = set(re.findall(r"\$(\w+)", t["expr"]))
            assert used <= variables, (p["title"], used - variables)


def _referenced() -> set[str]:
    exprs = [str(r["expr"]) for r in _alerts()]
    exprs += [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p.get("targets", [])]
    return {re.sub(r"_(bucket|sum|count)$", "", m) for e in exprs for m in METRIC.findall(e)}


async def test_every_metric_the_rules_and_dashboard_read_is_exported(api) -> None:
    assert (await register(api, "h0", [L4, H200])).status == 201
    sessions = [{"id": "s1", "fps": 58.0, "target_fps": 60, "encode_ms": 5.0, "rtt_ms": 12.0, "jitter_ms": 3.0,
                 "loss": 0.0, "bitrate_bps": 6_000_000, "freezes": 1, "encoder_errors": 0, "first_frame_ms": 300.0}]
    gpus = [{"index": 0, "utilization": 50, "vram_used_mb": 4000, "vram_total_mb": 22_491, "encoder_utilization": 30,
             "encoder_sessions": 1, "encoder_fps": 58.0, "encoder_latency_us": 900, "temperature_c": 60, "power_w": 40,
             "throttle_reasons": ["sw_power_cap"]}]
    hb = await api.put("/api/v1/hosts/h0/heartbeat", headers=auth(NODE), json={"gpus": gpus, "sessions": sessions,
                                                                      "freezes_total": 4, "encoder_errors_total": 1,
                                                                      "session_starts_total": 3,
                                                                      "session_start_failures_total": {"encoder": 1},
                                                                      "glass_to_glass_ms": {"le": [50.0, 150.0],
                                                                                            "counts": [2, 1, 0],
                                                                                            "sum": 160.0}})
    assert hb.status == 200, await hb.text()
    await api.get("/api/v1/pools")  # an HTTP request, so the request counter has a sample
    await api.get("/api/v1/nope")  # and an error response
    text = await (await api.get("/metrics")).text()
    exported = set(re.findall(r"^# TYPE (render_broker_\w+) ", text, re.M))
    exported |= {re.sub(r"_total$", "", n) + "_total" for n in exported if n.endswith("_total")}
    referenced = _referenced()
    assert referenced, "no render_broker metric found in the rules or the dashboard"
    assert referenced - exported == set()
