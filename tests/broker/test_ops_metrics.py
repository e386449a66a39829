"""Operations metrics through the real app on real Redis: the queue wait histogram the seating step keeps
(the same on every replica) and sessions per GPU (the divisor of VRAM growth per session-hour)."""

from __future__ import annotations

import re

from broker.app import create_app
from broker.store.keys import QUEUE_WAIT_BUCKETS_S
from tests.conftest import auth, setup_pool, user_token


def samples(text: str, name: str) -> dict[str, float]:
    """``name``'s samples on a /metrics page: the label part (``{...}`` or "") -> value."""
    out = {}
    for m in re.finditer(rf"^{name}(\{{[^}}]*\}})? (\S+)$", text, re.M):
        out[m.group(1) or ""] = float(m.group(2))
    return out


async def metrics_text(client) -> str:  # type: ignore[no-untyped-def]
    r = await client.get("/metrics")
    assert r.status == 200
    return await r.text()


async def _session(client, user: str) -> dict[str, object]:  # type: ignore[no-untyped-def]
    r = await client.post("/api/v1/sessions", json={"pool": "p1"}, headers=auth(await user_token(client, user)))
    assert r.status == 201, await r.text()
    return dict(await r.json())


async def test_queue_wait_histogram_counts_the_wait_on_every_replica(api, aiohttp_client, settings_factory,
                                                                     clock) -> None:
    await setup_pool(api, "p1", hosts=1, max_sessions_per_gpu=1)
    first = await _session(api, "alice")
    assert first["state"] == "starting"  # seated at once: a wait of 0
    text = await metrics_text(api)
    assert samples(text, "render_broker_queue_wait_seconds_count") == {'{pool="p1"}': 1.0}
    assert samples(text, "render_broker_queue_wait_seconds_sum") == {'{pool="p1"}': 0.0}

    queued = await _session(api, "bob")
    assert queued["state"] == "queued"
    clock.advance(7_250)  # bob waits 7.25 s behind the full pool
    alice = await user_token(api, "alice")
    r = await api.delete(f"/api/v1/sessions/{first['id']}", headers=auth(alice))
    assert r.status == 200, await r.text()
    seated = await (await api.get(f"/api/v1/sessions/{queued['id']}", headers=auth(await user_token(api, "bob"))))\
        .json()
    assert seated["state"] == "starting" and seated["seated_ms"] - seated["created_ms"] == 7_250

    # a second replica (its own process state, the same Redis) exports the same histogram
    other = await aiohttp_client(create_app(settings_factory(), clock=clock))
    for text in (await metrics_text(api), await metrics_text(other)):
        assert samples(text, "render_broker_queue_wait_seconds_count") == {'{pool="p1"}': 2.0}
        assert samples(text, "render_broker_queue_wait_seconds_sum") == {'{pool="p1"}': 7.25}
        buckets = samples(text, "render_broker_queue_wait_seconds_bucket")
        assert len(buckets) == len(QUEUE_WAIT_BUCKETS_S) + 1
        assert buckets['{le="0.5",pool="p1"}'] == 1.0  # alice, seated at once
        assert buckets['{le="5.0",pool="p1"}'] == 1.0
        assert buckets['{le="10.0",pool="p1"}'] == 2.0  # bob's 7.25 s
        assert buckets['{le="+Inf",pool="p1"}'] == 2.0
        assert "# TYPE render_broker_queue_wait_seconds histogram" in text


async def test_gpu_sessions_count_the_seats_taken_on_each_gpu(api) -> None:
    await setup_pool(api, "p1", hosts=1, gpus_per_host=2, max_sessions_per_gpu=2, strategy="depth-first")
    g0, g1 = '{gpu="0",host="p1-h0",pool="p1"}', '{gpu="1",host="p1-h0",pool="p1"}'
    assert samples(await metrics_text(api), "render_broker_gpu_sessions") == {g0: 0.0, g1: 0.0}
    views = [await _session(api, f"u{i}") for i in range(3)]
    per_gpu = {0: 0, 1: 0}
    for v in views:
        per_gpu[int(v["gpu"])] += 1  # type: ignore[call-overload]
    assert sorted(per_gpu.values()) == [1, 2]
    assert samples(await metrics_text(api), "render_broker_gpu_sessions") == {g0: float(per_gpu[0]),
                                                                          g1: float(per_gpu[1])}
    r = await api.delete(f"/api/v1/sessions/{views[0]['id']}", headers=auth(await user_token(api, "u0")))
    assert r.status == 200
    per_gpu[int(views[0]["gpu"])] -= 1  # type: ignore[call-overload]
    assert samples(await metrics_text(api), "render_broker_gpu_sessions") == {g0: float(per_gpu[0]),
                                                                          g1: float(per_gpu[1])}
