"""Smoke test of bench/drill.py: three drills against a real lab (redis-server, two broker processes, render
nodes, sessions seated through the API): a hot GPU and a failing encoder each drain their host with the
reason, fire what they should, and cost no session; Redis lost and restarted empty costs no session and no
seat either."""

from __future__ import annotations

import os
import shutil

import pytest

from bench import drill

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server missing (setup.sh)")]


def _drill_nodes() -> set[int]:
    """Render-node processes of a drill pool ("d-..."), anyone's."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"streamer" in argv and any(a.startswith(b"d-") for a in argv):
            found.add(int(pid))
    return found


async def test_hot_gpu_failing_encoder_and_redis_lost_drills_lose_nothing() -> None:
    before = _drill_nodes()
    hot, enc, lost = await drill.run(["hot-gpu", "encoder-failing", "redis-lost"])
    assert _drill_nodes() - before == set(), "the drill left render nodes running"  # redis-lost-a/b once did

    assert hot.drained == {"hot-victim": "watchdog: gpu_hot: GPU 0 at 95 C (limit 90 C)"}
    assert {"RenderBrokerHostsDraining", "RenderBrokerGpuHot", "RenderBrokerGpuOverheating",
            "RenderBrokerGpuThrottled", "RenderBrokerNodeWatchdogDrained"} <= set(hot.fired)
    assert "RenderBrokerNodeWatchdogHeld" not in hot.fired  # one trip: it undrains by itself once healthy
    assert "RenderBrokerHostDown" not in hot.fired
    assert hot.detect_s is not None and hot.sessions == 2 * drill.SEATS
    assert (hot.lost_on_victim, hot.lost_elsewhere) == (0, 0)  # a drain stops new seatings only

    # the self-test failed, and its 30 failed frames are 30 encoder errors in one heartbeat: both reasons
    assert enc.drained["enc-victim"].startswith("watchdog: encoder_errors: 30 encoder error(s)")
    assert "selftest_failed: the frame pipeline gave up" in enc.drained["enc-victim"]
    assert enc.fired == ["RenderBrokerHostsDraining", "RenderBrokerNodeWatchdogDrained"]
    assert enc.encoder_errors is not None and enc.encoder_errors >= 30  # the frames that failed before it gave up
    assert (enc.lost_on_victim, enc.lost_elsewhere) == (0, 0)

    # Redis back empty: the brokers notice, restore the pool from SQL, re-adopt every session from its node
    assert lost.detect_s is not None and lost.recover_s is not None
    assert (lost.lost_on_victim, lost.lost_elsewhere, lost.seats_leaked) == (0, 0, 0)
    assert lost.requests > 0 and hot.seats_leaked == 0 and enc.seats_leaked == 0
