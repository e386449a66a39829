"""Per-GPU metrics through the real app on real Redis: registration says how each GPU encodes,
heartbeat telemetry fills the gauges, and a field a node reported as null is not exported."""

from __future__ import annotations

from prometheus_client.utils import floatToGoString

from tests.conftest import ADMIN, NODE, auth

MIB = 1024 * 1024
L4 = {"index": 0, "model": "NVIDIA L4", "vram_mb": 23_034, "encoder_session_limit": None, "nvenc": True,
      "encode": "nvenc", "reason": "NVENC probe encoded; no driver session cap"}
H200 = {"index": 1, "model": "NVIDIA H200", "vram_mb": 143_771, "encoder_session_limit": 6, "nvenc": False,
        "encode": "software",
        "reason": "no NVENC unit on this model; software encode, 6 of the host's 6 software seat(s)"}


async def register(api, host: str, gpus: list[dict[str, object]]):  # type: ignore[no-untyped-def]
    r = await api.put("/api/v1/pools/p1", json={"max_sessions_per_gpu": 8, "vram_per_session_mb": 2048},
                      headers=auth(ADMIN))
    assert r.status in (200, 201), await r.text()
    return await api.post("/api/v1/hosts", json={"id": host, "pool": "p1", "address": "10.0.0.9:7000",
                                                 "gpus": gpus}, headers=auth(NODE))


def mib(n: float) -> str:
    """A MiB figure as the exposition format writes it in bytes."""
    return floatToGoString(n * MIB)


def sample_lines(text: str, prefix: str = "render_broker_gpu_") -> set[str]:
    return {line for line in text.splitlines() if line.startswith(prefix)}


async def test_gpu_gauges_follow_registration_and_telemetry(api) -> None:
    r = await register(api, "h0", [L4, H200])
    assert r.status == 201, await r.text()
    host = await r.json()
    assert [(g["encode"], g["seats"]) for g in host["gpus"]] == [("nvenc", 8), ("software", 6)]
    assert host["gpus"][1]["reason"].startswith("no NVENC unit")

    # before any heartbeat: only what registration says
    text = await (await api.get("/metrics")).text()
    assert sample_lines(text) == {
        'render_broker_gpu_software_encode{gpu="0",host="h0",pool="p1"} 0.0',
        'render_broker_gpu_software_encode{gpu="1",host="h0",pool="p1"} 1.0',
        f'render_broker_gpu_vram_total_bytes{{gpu="0",host="h0",pool="p1"}} {mib(23_034)}',
        f'render_broker_gpu_vram_total_bytes{{gpu="1",host="h0",pool="p1"}} {mib(143_771)}',
        'render_broker_gpu_sessions{gpu="0",host="h0",pool="p1"} 0.0',  # the broker's seat counts
        'render_broker_gpu_sessions{gpu="1",host="h0",pool="p1"} 0.0',
    }

    hb = await api.put("/api/v1/hosts/h0/heartbeat", headers=auth(NODE), json={"gpus": [
        {"index": 0, "utilization": 63, "vram_used_mb": 6900, "vram_total_mb": 22_491, "encoder_utilization": 41,
         "encoder_sessions": 2, "encoder_fps": 59.5, "encoder_latency_us": 1500, "temperature_c": 66,
         "power_w": 48.25, "throttle_reasons": ["sw_power_cap", "hw_thermal"]},
        # an H200 as NVML reports it: no encoder queries, and throttle reasons unreadable here
        {"index": 1, "utilization": 12, "vram_used_mb": 2048, "vram_total_mb": 143_771, "encoder_utilization": None,
         "encoder_sessions": None, "encoder_fps": None, "encoder_latency_us": None, "temperature_c": 38,
         "power_w": 121.0, "throttle_reasons": None}]})
    assert hb.status == 200, await hb.text()
    text = await (await api.get("/metrics")).text()
    lines = sample_lines(text)
    g0, g1 = '{gpu="0",host="h0",pool="p1"}', '{gpu="1",host="h0",pool="p1"}'
    assert lines == {
        f"render_broker_gpu_utilization_percent{g0} 63.0",
        f"render_broker_gpu_vram_used_bytes{g0} {mib(6900)}",
        f"render_broker_gpu_vram_total_bytes{g0} {mib(22_491)}",  # NVML's figure wins over registration
        f"render_broker_gpu_encoder_utilization_percent{g0} 41.0",
        f"render_broker_gpu_encoder_sessions{g0} 2.0",
        f"render_broker_gpu_encoder_fps{g0} 59.5",
        f"render_broker_gpu_encoder_latency_seconds{g0} 0.0015",
        f"render_broker_gpu_temperature_celsius{g0} 66.0",
        f"render_broker_gpu_power_watts{g0} 48.25",
        'render_broker_gpu_throttled{gpu="0",host="h0",pool="p1",reason="sw_power_cap"} 1.0',
        'render_broker_gpu_throttled{gpu="0",host="h0",pool="p1",reason="hw_thermal"} 1.0',
        f"render_broker_gpu_software_encode{g0} 0.0",
        f"render_broker_gpu_utilization_percent{g1} 12.0",
        f"render_broker_gpu_vram_used_bytes{g1} {mib(2048)}",
        f"render_broker_gpu_vram_total_bytes{g1} {mib(143_771)}",
        f"render_broker_gpu_temperature_celsius{g1} 38.0",
        f"render_broker_gpu_power_watts{g1} 121.0",
        f"render_broker_gpu_software_encode{g1} 1.0",
        f"render_broker_gpu_sessions{g0} 0.0",
        f"render_broker_gpu_sessions{g1} 0.0",
    }
    # null fields are simply absent
    for name in ("encoder_utilization_percent", "encoder_sessions", "encoder_fps", "encoder_latency_seconds"):
        assert not any(line.startswith(f"render_broker_gpu_{name}{g1}") for line in lines), name
    assert not any(line.startswith("render_broker_gpu_throttled{gpu=\"1\"") for line in lines)

    # a later heartbeat replaces the figures: the throttle reasons clear, nothing lingers
    hb = await api.put("/api/v1/hosts/h0/heartbeat", headers=auth(NODE), json={"gpus": [
        {"index": 0, "utilization": 5, "throttle_reasons": []}]})
    assert hb.status == 200, await hb.text()
    lines = sample_lines(await (await api.get("/metrics")).text())
    assert lines == {
        f"render_broker_gpu_utilization_percent{g0} 5.0",
        f"render_broker_gpu_software_encode{g0} 0.0",
        f"render_broker_gpu_software_encode{g1} 1.0",
        f"render_broker_gpu_vram_total_bytes{g0} {mib(23_034)}",
        f"render_broker_gpu_vram_total_bytes{g1} {mib(143_771)}",
        f"render_broker_gpu_sessions{g0} 0.0",
        f"render_broker_gpu_sessions{g1} 0.0",
    }


async def test_older_nodes_register_and_contradictions_are_refused(api) -> None:
    # a node from before "encode": derived from nvenc
    old = [{"index": 0, "model": "NVIDIA L4", "vram_mb": 23_034, "nvenc": True},
           {"index": 1, "model": "cpu-x264", "vram_mb": 65_536, "encoder_session_limit": 4}]
    r = await register(api, "old", old)
    assert r.status == 201, await r.text()
    assert [(g["encode"], g["reason"]) for g in (await r.json())["gpus"]] == [("nvenc", ""), ("software", "")]
    # NVENC claimed without a probe that encoded
    r = await register(api, "bad", [{**L4, "nvenc": False}])
    assert r.status == 422
    assert (await r.json())["field"] == "gpus[0].encode"
    r = await register(api, "bad", [{**L4, "encode": "quicksync"}])
    assert r.status == 422 and (await r.json())["field"] == "gpus[0].encode"
    # throttle reasons: short strings, at most 16
    hb = await api.put("/api/v1/hosts/old/heartbeat", headers=auth(NODE),
                       json={"gpus": [{"index": 0, "throttle_reasons": ["x"] * 17}]})
    assert hb.status == 422 and (await hb.json())["field"] == "gpus[0].throttle_reasons"
    hb = await api.put("/api/v1/hosts/old/heartbeat", headers=auth(NODE),
                       json={"gpus": [{"index": 0, "throttle_reasons": ["x" * 33]}]})
    assert hb.status == 422 and (await hb.json())["field"] == "gpus[0].throttle_reasons[0]"
