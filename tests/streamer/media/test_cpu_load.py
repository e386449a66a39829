"""A loaded CPU is not a congested network: a game session on idle loopback while busy processes load the machine.

The node (``SessionRuntime``, in this process) streams a 1280x720@30 game to an aiortc viewer in a
child process (``bench.bench_stream.ViewerProcess``: decode-only, answering the delay probes as the
web client does) over 127.0.0.1: no queue, no loss, no capacity limit.  Then one busy-looping
process per core, plus one, loads the machine for ``LOAD_S``: the node's frame thread and event
loop run late, the viewer too.  That lateness must not read as congestion (it used to: probe round
trips measured from when a probe was queued rather than sent, and the viewer's short receive
window compared with a longer send-rate average, cut an idle link's target to a fraction and
stepped the ladder down): the target stays over half of what it was before the load, and the
ladder moves one rung at most (a CPU step down is allowed: fewer pixels are the cure for a late
encoder).

The profile's maximum is 2.5 Mbps so that the viewer (Python, about 250 packets/s) keeps up on a
loaded machine as a browser would; the ladder's rungs at 30 fps: 720p 1.38, 540p 0.78, 360p 0.35 Mbps.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from typing import Any

import pytest

from streamer.abr.bitrate import BitrateProfile
from streamer.media.session import RuntimeConfig, SessionRuntime, SessionSpec
from tests.streamer.viewer import until

pytestmark = pytest.mark.timeout(120)

PROFILE = BitrateProfile("cpu-load", min_bps=500_000, max_bps=2_500_000, start_bps=2_500_000)
RUNGS = ["1280x720@30", "960x540@30", "640x360@30"]
LOAD_S = 8.0  # each busy process ends by itself after this (and is killed at the end of the test anyway)
BUSY = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end:\n    pass\n"


async def test_a_loaded_cpu_on_an_idle_link_keeps_the_target_and_the_ladder_within_one_rung() -> None:
    from bench.bench_stream import ViewerProcess  # a decode-only aiortc viewer in a child process

    config = RuntimeConfig(advertise_addresses=("127.0.0.1",), bitrate_profile=PROFILE)
    runtime = SessionRuntime(SessionSpec(id="cpu-load", kind="game", width=1280, height=720, fps=30), config)
    await runtime.start()
    viewer = await ViewerProcess.spawn()
    busy: list[asyncio.subprocess.Process] = []
    seen: dict[int, dict[str, Any]] = {}

    def collect() -> list[dict[str, Any]]:
        for d in runtime.stats()["decisions"]:
            seen.setdefault(d["now_ms"], d)
        return [seen[t] for t in sorted(seen)]

    try:
        await viewer.connect(runtime)
        # settled on the idle link: probe answers arrive (fast mode) and the target is at the maximum
        await until(lambda: any(d["fast"] and d["target_bps"] == PROFILE.max_bps for d in collect()[-5:]),
                    "the target never reached the profile's maximum on idle loopback", deadline_s=30)  # fmt: skip
        before = collect()[-1]
        assert before["rung"] == RUNGS[0], before

        for _ in range((os.cpu_count() or 1) + 1):
            busy.append(await asyncio.create_subprocess_exec(sys.executable, "-c", BUSY.format(s=LOAD_S)))
        loaded_from = before["now_ms"]
        await until(lambda: bool(collect()) and all(p.returncode is not None for p in busy),
                    "the busy processes did not end", deadline_s=LOAD_S + 30)  # fmt: skip
        loaded = [d for d in collect() if d["now_ms"] > loaded_from]
        assert len(loaded) >= 20, "too few control steps under load"  # 100 ms each: the loop ran

        lowest = min(loaded, key=lambda d: d["target_bps"])
        assert lowest["target_bps"] * 2 > before["target_bps"], (lowest, [d["reason"] for d in loaded])
        rungs = {d["rung"] for d in loaded}
        assert rungs <= set(RUNGS[:2]), (rungs, [d["ladder_reason"] for d in loaded])
        # the load was real: the frame thread's time per frame rose (the ladder's CPU input)
        assert max(d["frame_load"] or 0.0 for d in loaded) > max(d["frame_load"] or 0.0 for d in [before])
    finally:
        for proc in busy:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        await viewer.close()
        await runtime.stop()
