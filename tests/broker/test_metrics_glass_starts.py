"""Glass to glass and session starts on /metrics, through the real app on real Redis: a node's heartbeat
histogram becomes ``render_broker_stream_glass_to_glass_seconds`` (pool, host; cumulative buckets in
seconds), its start counts become counters by pool, host and reason, and the broker's own reaper counts
the sessions it ended because their node never made them ready."""

from __future__ import annotations

import re

from broker.keys_app import BROKER
from broker.lifecycle import START_TIMEOUT_MS
from tests.broker.test_gpu_metrics import L4, register
from tests.conftest import NODE, auth, setup_pool, user_token

GLASS = {"le": [16.0, 33.0, 150.0], "counts": [2, 5, 2, 1], "sum": 612.5}
FAILURES = {"refused": 0, "display": 1, "encoder": 2, "error": 0, "ice_failed": 1, "dtls_failed": 0}


def samples(text: str, name: str) -> dict[str, float]:
    """``{labels: value}`` of one metric's samples."""
    return {m.group(1): float(m.group(2)) for m in re.finditer(rf"^{name}{{(.*)}} (\S+)$", text, re.M)}


async def test_a_heartbeats_histogram_and_start_counts_are_exported_per_pool_and_host(api) -> None:
    assert (await register(api, "h0", [L4])).status == 201
    text = await (await api.get("/metrics")).text()
    assert samples(text, "render_broker_stream_glass_to_glass_seconds_count") == {}  # nothing reported yet
    hb = await api.put("/api/v1/hosts/h0/heartbeat", headers=auth(NODE), json={
        "gpus": [], "sessions": [{"id": "s1", "fps": 60.0}], "glass_to_glass_ms": GLASS,
        "session_starts_total": 9, "session_start_failures_total": FAILURES})
    assert hb.status == 200, await hb.text()
    text = await (await api.get("/metrics")).text()
    assert "# TYPE render_broker_stream_glass_to_glass_seconds histogram" in text
    assert samples(text, "render_broker_stream_glass_to_glass_seconds_bucket") == {
        'host="h0",le="0.016",pool="p1"': 2.0, 'host="h0",le="0.033",pool="p1"': 7.0,
        'host="h0",le="0.15",pool="p1"': 9.0, 'host="h0",le="+Inf",pool="p1"': 10.0}
    assert samples(text, "render_broker_stream_glass_to_glass_seconds_count") == {'host="h0",pool="p1"': 10.0}
    assert samples(text, "render_broker_stream_glass_to_glass_seconds_sum") == {'host="h0",pool="p1"': 0.6125}
    assert samples(text, "render_broker_session_starts_total") == {'host="h0",pool="p1"': 9.0}
    assert samples(text, "render_broker_session_start_failures_total") == {
        f'host="h0",pool="p1",reason="{reason}"': float(n) for reason, n in FAILURES.items()}
    assert "session=" not in text  # no label whose values grow with the sessions

    # a node that reports some reasons only: the others are 0 (every series exists from the first heartbeat)
    hb = await api.put("/api/v1/hosts/h0/heartbeat", headers=auth(NODE), json={
        "session_starts_total": 10, "session_start_failures_total": {"encoder": 3}})
    assert hb.status == 200, await hb.text()
    text = await (await api.get("/metrics")).text()
    failures = samples(text, "render_broker_session_start_failures_total")
    assert failures['host="h0",pool="p1",reason="encoder"'] == 3.0 and sum(failures.values()) == 3.0
    assert samples(text, "render_broker_stream_glass_to_glass_seconds_count") == {}  # this beat carried none


async def test_a_bad_histogram_or_start_count_is_a_422_naming_the_field(api) -> None:
    assert (await register(api, "h0", [L4])).status == 201
    for body, field in (
        ({"glass_to_glass_ms": {**GLASS, "counts": [1, 2, 3]}}, "glass_to_glass_ms.counts"),  # one count short
        ({"glass_to_glass_ms": {**GLASS, "le": [33.0, 16.0, 150.0]}}, "glass_to_glass_ms.le"),  # not increasing
        ({"glass_to_glass_ms": {**GLASS, "le": [], "counts": [1]}}, "glass_to_glass_ms.le"),
        ({"glass_to_glass_ms": {**GLASS, "counts": [1, -2, 3, 4]}}, "glass_to_glass_ms.counts[1]"),
        ({"glass_to_glass_ms": {**GLASS, "sum": -1}}, "glass_to_glass_ms.sum"),
        ({"glass_to_glass_ms": {**GLASS, "le": list(range(1, 40)), "counts": [0] * 40}}, "glass_to_glass_ms.le"),
        ({"session_starts_total": -1}, "session_starts_total"),
        ({"session_start_failures_total": {"gremlins": 1}}, "session_start_failures_total.gremlins"),
        ({"session_start_failures_total": {"encoder": 1.5}}, "session_start_failures_total.encoder"),
    ):
        hb = await api.put("/api/v1/hosts/h0/heartbeat", headers=auth(NODE), json={"gpus": [], **body})
        problem = await hb.json()
        assert hb.status == 422 and problem["field"] == field, (body, problem)


async def test_the_reaper_counts_a_start_timeout_for_its_pool(api, clock) -> None:
    await setup_pool(api, "p1", hosts=1)
    text = await (await api.get("/metrics")).text()
    assert samples(text, "render_broker_session_start_timeouts_total") == {'pool="p1"': 0.0}  # from 0
    b = api.app[BROKER]
    tok = await user_token(api, "u1")
    r = await api.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(tok))
    assert r.status == 201, await r.text()
    sid = (await r.json())["id"]
    clock.advance(START_TIMEOUT_MS - 1_000)
    # the node lives (its heartbeats renew the lease) but never reports the session running
    hb = await api.put("/api/v1/hosts/p1-h0/heartbeat", json={}, headers=auth(NODE))
    assert hb.status == 200, await hb.text()
    assert await b.reap_once() == []
    clock.advance(2_000)
    assert await b.reap_once() == [(sid, "start_failed")]
    assert await b.reap_once() == []  # counted once
    text = await (await api.get("/metrics")).text()
    assert samples(text, "render_broker_session_start_timeouts_total") == {'pool="p1"': 1.0}
