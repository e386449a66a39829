"""Smoke test of bench/drill.py: two drills against a real lab (redis-server, two broker processes, render
nodes, sessions seated through the API): a hot GPU and a failing encoder each drain their host with the
reason, fire what they should, and cost no session."""

from __future__ import annotations

import shutil

import pytest

from bench import drill

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server missing (setup.sh)")]


async def test_hot_gpu_and_failing_encoder_drills_drain_their_host_and_lose_nothing() -> None:
    hot, enc = await drill.run(["hot-gpu", "encoder-failing"])

    assert hot.drained == {"hot-victim": "watchdog: gpu_hot: GPU 0 at 95 C (limit 90 C)"}
    assert {"RenderBrokerHostsDraining", "RenderBrokerGpuHot", "RenderBrokerGpuOverheating",
            "RenderBrokerGpuThrottled"} <= set(hot.fired)
    assert "RenderBrokerHostDown" not in hot.fired
    assert hot.detect_s is not None and hot.sessions == 2 * drill.SEATS
    assert (hot.lost_on_victim, hot.lost_elsewhere) == (0, 0)  # a drain stops new seatings only

    # the self-test failed, and its 30 failed frames are 30 encoder errors in one heartbeat: both reasons
    assert enc.drained["enc-victim"].startswith("watchdog: encoder_errors: 30 encoder error(s)")
    assert "selftest_failed: the frame pipeline gave up" in enc.drained["enc-victim"]
    assert enc.fired == ["RenderBrokerHostsDraining"]
    assert enc.encoder_errors is not None and enc.encoder_errors >= 30  # the frames that failed before it gave up
    assert (enc.lost_on_victim, enc.lost_elsewhere) == (0, 0)
