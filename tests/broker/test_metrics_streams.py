"""Stream health on /metrics: per-pool quantiles over the sessions in live heartbeats, never a series
per session (bounded cardinality), through the real app on real Redis."""

from __future__ import annotations

from broker.metrics import quantile
from tests.broker.test_gpu_metrics import L4, register
from tests.conftest import NODE, auth


def test_nearest_rank_quantile() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    assert [quantile(values, q) for q in (0.05, 0.5, 0.95, 1.0)] == [1.0, 5.0, 10.0, 10.0]
    assert quantile([7.0], 0.05) == 7.0


async def test_stream_quantiles_per_pool_and_no_session_label(api) -> None:
    assert (await register(api, "h0", [L4])).status == 201
    sessions = [
        {"id": "s1", "fps": 60.0, "target_fps": 60, "encode_ms": 4.0, "rtt_ms": 10.0, "jitter_ms": 2.0,
         "loss": 0.0, "bitrate_bps": 8_000_000, "candidate": "host", "freezes": 0, "encoder_errors": 0,
         "first_frame_ms": 250.0},
        {"id": "s2", "fps": 45.0, "target_fps": 60, "encode_ms": 9.0, "rtt_ms": 30.0, "jitter_ms": 6.0,
         "loss": 0.02, "bitrate_bps": 4_000_000, "candidate": "relay", "freezes": 3, "encoder_errors": 1,
         "first_frame_ms": 900.0},
        {"id": "s3", "fps": 30.0, "target_fps": 30, "encode_ms": 6.0, "rtt_ms": 20.0, "jitter_ms": None,
         "loss": 0.01, "bitrate_bps": 2_000_000, "candidate": "relay"},
        {"id": "s4", "fps": None, "encode_ms": None},  # just started: counted, no figures yet
    ]
    hb = await api.put("/api/v1/hosts/h0/heartbeat", headers=auth(NODE),
                       json={"gpus": [], "sessions": sessions, "freezes_total": 7, "encoder_errors_total": 2})
    assert hb.status == 200, await hb.text()
    text = await (await api.get("/metrics")).text()
    lines = {line for line in text.splitlines() if line.startswith("render_broker_stream")}
    # the node's own counters, per pool and host (its count since it started: sessions gone included)
    assert 'render_broker_stream_freezes_total{host="h0",pool="p1"} 7.0' in lines
    assert 'render_broker_encoder_errors_total{host="h0",pool="p1"} 2.0' in text.splitlines()
    assert "# TYPE render_broker_stream_freezes_total counter" in text
    lines -= {line for line in lines if line.startswith("render_broker_stream_freezes_")}
    assert lines == {
        'render_broker_streams{pool="p1"} 4.0',
        'render_broker_stream_paths{candidate="host",pool="p1"} 1.0',
        'render_broker_stream_paths{candidate="srflx",pool="p1"} 0.0',
        'render_broker_stream_paths{candidate="relay",pool="p1"} 2.0',
        'render_broker_stream_bits_per_second{pool="p1"} 1.4e+07',
        'render_broker_stream_fps_ratio{pool="p1",quantile="0.05"} 0.75',
        'render_broker_stream_fps_ratio{pool="p1",quantile="0.5"} 1.0',
        'render_broker_stream_encode_seconds{pool="p1",quantile="0.5"} 0.006',
        'render_broker_stream_encode_seconds{pool="p1",quantile="0.95"} 0.009',
        'render_broker_stream_rtt_seconds{pool="p1",quantile="0.5"} 0.02',
        'render_broker_stream_rtt_seconds{pool="p1",quantile="0.95"} 0.03',
        'render_broker_stream_jitter_seconds{pool="p1",quantile="0.5"} 0.002',
        'render_broker_stream_jitter_seconds{pool="p1",quantile="0.95"} 0.006',
        'render_broker_stream_loss_ratio{pool="p1",quantile="0.5"} 0.01',
        'render_broker_stream_loss_ratio{pool="p1",quantile="0.95"} 0.02',
        'render_broker_stream_first_frame_seconds{pool="p1",quantile="0.5"} 0.25',
        'render_broker_stream_first_frame_seconds{pool="p1",quantile="0.95"} 0.9',
    }
    assert "session=" not in text  # no label whose values grow with the sessions


async def test_an_unknown_candidate_type_is_a_422_naming_the_field(api) -> None:
    assert (await register(api, "h0", [L4])).status == 201
    hb = await api.put("/api/v1/hosts/h0/heartbeat", headers=auth(NODE),
                       json={"gpus": [], "sessions": [{"id": "s1", "candidate": "satellite"}]})
    body = await hb.json()
    assert hb.status == 422 and "candidate" in body["field"], body


async def test_a_bad_freeze_or_encoder_error_count_is_a_422_naming_the_field(api) -> None:
    assert (await register(api, "h0", [L4])).status == 201
    for body, field in (
        ({"sessions": [{"id": "s1", "freezes": -1}]}, "freezes"),
        ({"sessions": [{"id": "s1", "encoder_errors": 1.5}]}, "encoder_errors"),
        ({"sessions": [{"id": "s1", "first_frame_ms": "fast"}]}, "first_frame_ms"),
        ({"freezes_total": -3}, "freezes_total"),
        ({"encoder_errors_total": True}, "encoder_errors_total"),
    ):
        hb = await api.put("/api/v1/hosts/h0/heartbeat", headers=auth(NODE), json={"gpus": [], **body})
        problem = await hb.json()
        assert hb.status == 422 and field in problem["field"], (body, problem)

