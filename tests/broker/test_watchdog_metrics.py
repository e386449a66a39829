"""The node watchdog's state on /metrics, from heartbeats through the real app on real Redis: which checks
tripped the host's drain and whether the watchdog holds it for an operator; a bad report is refused naming
its field, with nothing stored."""

from __future__ import annotations

from broker.protocol import WatchdogCheck
from tests.broker.test_ops_metrics import metrics_text, samples
from tests.conftest import NODE, auth, setup_pool


async def test_watchdog_state_from_the_heartbeat(api) -> None:
    await setup_pool(api, "p1", hosts=2)
    hb = await api.put("/api/v1/hosts/p1-h0/heartbeat", headers=auth(NODE),
                       json={"watchdog": {"tripped": ["gpu_hot", "loop_lag"], "held": True}})
    assert hb.status == 200, await hb.text()
    hb = await api.put("/api/v1/hosts/p1-h1/heartbeat", headers=auth(NODE),
                       json={"watchdog": {"tripped": [], "held": False}})
    assert hb.status == 200, await hb.text()
    assert (await hb.json())["host_state"] == "up"  # the node's watchdog compares it with its own state
    text = await metrics_text(api)
    # every check of every reporting host, 1 where tripped: a series that clears goes to 0, not away
    tripped = samples(text, "render_broker_node_watchdog_tripped")
    assert tripped == {f'{{check="{c}",host="{h}",pool="p1"}}': float(h == "p1-h0" and c in ("gpu_hot", "loop_lag"))
                       for h in ("p1-h0", "p1-h1") for c in WatchdogCheck}
    assert samples(text, "render_broker_node_watchdog_held") == {'{host="p1-h0",pool="p1"}': 1.0,
                                                                 '{host="p1-h1",pool="p1"}': 0.0}

    # a node that reports no watchdog (it runs none) exports none; a draining host's reply says so
    r = await api.post("/api/v1/hosts/p1-h1/drain", headers=auth(NODE), json={"reason": "watchdog: test"})
    assert r.status == 200, await r.text()
    hb = await api.put("/api/v1/hosts/p1-h0/heartbeat", headers=auth(NODE), json={})
    assert hb.status == 200
    hb = await api.put("/api/v1/hosts/p1-h1/heartbeat", headers=auth(NODE),
                       json={"watchdog": {"tripped": ["selftest_failed"]}})
    assert hb.status == 200 and (await hb.json())["host_state"] == "draining"
    text = await metrics_text(api)
    assert {k for k, v in samples(text, "render_broker_node_watchdog_tripped").items() if v} == {
        '{check="selftest_failed",host="p1-h1",pool="p1"}'}
    assert samples(text, "render_broker_node_watchdog_held") == {'{host="p1-h1",pool="p1"}': 0.0}


async def test_a_bad_watchdog_report_is_refused_naming_the_field(api) -> None:
    await setup_pool(api, "p1", hosts=1)
    cases = [
        ({"tripped": ["gpu_on_fire"]}, "watchdog.tripped[0]"),
        ({"tripped": "gpu_hot"}, "watchdog.tripped"),
        ({"held": "yes"}, "watchdog.held"),
        ({"drained": True}, "watchdog.drained"),
        ("tripped", "watchdog"),
    ]
    for report, field in cases:
        r = await api.put("/api/v1/hosts/p1-h0/heartbeat", headers=auth(NODE), json={"watchdog": report})
        assert r.status == 422, (report, await r.text())
        body = await r.json()
        assert body["field"] == field and "Traceback" not in await r.text(), body
    assert samples(await metrics_text(api), "render_broker_node_watchdog_held") == {}
