"""The stream self-test through the real encoder, frame thread, aiortc peers and loopback UDP: a clean run
checks its frames and recovers from a loss window with 0 corrupt frames; injected faults (a picture that
is not the one stamped, a corrupted bitstream) are caught; a failed run drains the host through the
watchdog and the broker (a real agent on a real broker app, Redis and SQL)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import av
import numpy as np
import numpy.typing as npt
import pytest

from encoder import VideoEncoder
from encoder.pattern import moving_pattern
from streamer.desktop.game import stamp_height
from streamer.node.agent import NodeAgent
from streamer.node.selftest import SelftestConfig, format_report, run_selftest
from streamer.node.settings import load
from tests.conftest import ADMIN, NODE, auth
from tests.streamer.viewer import until

pytestmark = pytest.mark.timeout(90)
SHORT = SelftestConfig(seconds=1.5, loss_ms=0)


def wrong_picture(frame_no: int, bgra: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """Frames 10-12 carry their own stamp over another frame's picture (what a stale or mixed-up buffer shows)."""
    if 10 <= frame_no <= 12:
        top = stamp_height(bgra.shape[1])
        bgra[top:] = moving_pattern(bgra.shape[1], bgra.shape[0], frame_no + 9)[top:]
    return bgra


class GarblingEncoder:
    """A real encoder whose output for frames 15 and 16 has its slice data scrambled (headers kept)."""

    def __init__(self, inner: VideoEncoder) -> None:
        self.inner, self.frames = inner, 0

    def encode(self, frame: Any) -> list[av.Packet[Any]]:
        self.frames += 1
        packets = self.inner.encode(frame)
        if self.frames not in (15, 16):
            return packets
        out = []
        for p in packets:
            data = bytearray(bytes(p))
            cut = min(len(data) - 1, 32)  # past the start code and slice header
            data[cut:] = bytes(b ^ 0x5A for b in data[cut:])
            garbled = av.Packet(bytes(data))
            garbled.pts, garbled.dts, garbled.time_base = p.pts, p.dts, p.time_base
            garbled.is_keyframe = p.is_keyframe
            out.append(garbled)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def no_selftest_threads() -> bool:
    return not any(t.name == "rb-frames-selftest" for t in threading.enumerate())


async def test_a_clean_run_checks_its_frames_and_recovers_from_lost_packets_without_a_corrupt_frame() -> None:
    report = await run_selftest(SelftestConfig(seconds=3.0, loss_at_s=1.0, loss_ms=300))
    assert report.ok, format_report(report)
    assert report.corrupt_frames == 0 and report.unexplained_missing == 0
    assert report.frames_checked > 20  # 30 fps for 3 s + recovery, minus the loss window (and a loaded machine)
    assert report.packets_dropped > 0 and report.recovered_ms is not None
    # the floor sits well under what the codec delivers (median 30-32 dB measured) and over a wrong picture (15)
    assert report.psnr_p50_db is not None and report.psnr_p50_db > SelftestConfig().psnr_floor_db + 3
    assert no_selftest_threads()


async def test_a_picture_that_is_not_the_one_stamped_is_a_corrupt_frame() -> None:
    report = await run_selftest(SHORT, mangle=wrong_picture)
    assert not report.ok and report.corrupt_frames == 3, format_report(report)
    assert "corrupt" in report.reason and "PSNR" in report.reason
    assert no_selftest_threads()


async def test_a_corrupted_bitstream_fails_the_selftest() -> None:
    report = await run_selftest(SHORT, wrap_encoder=GarblingEncoder)  # type: ignore[arg-type]
    # the decoder shows garbage (corrupt) or refuses the frames (missing with no loss to explain them)
    assert not report.ok, format_report(report)
    assert report.corrupt_frames + report.unexplained_missing > 0


async def test_a_failed_selftest_drains_the_host_through_the_watchdog(api) -> None:
    assert (await api.put("/api/v1/pools/game", json={"kind": "game"}, headers=auth(ADMIN))).status == 201
    settings = load(["--broker-url", str(api.make_url("")).rstrip("/"), "--node-token", NODE, "--pool", "game",
                     "--host-id", "st-h0", "--heartbeat-interval-s", "30", "--watchdog-healthy-hold-s", "0",
                     "--selftest-interval-s", "0"], {})
    agent = NodeAgent(settings)
    agent.selftest.config = SHORT
    task = asyncio.create_task(agent.run())
    try:
        await asyncio.wait_for(agent.registered.wait(), 30)
        await until(lambda: agent.health.heartbeat.ok, "no heartbeat reached the broker")
        agent.selftest.mangle = wrong_picture  # the fault
        report = await agent.selftest.run_once()
        assert report is not None and not report.ok
        await agent._watch([])  # the next heartbeat's watchdog step
        host = await (await api.get("/api/v1/hosts/st-h0", headers=auth(ADMIN))).json()
        assert host["state"] == "draining"
        entries = (await (await api.get("/api/v1/audit?action=host.drain", headers=auth(ADMIN))).json())["entries"]
        assert entries[0]["target"] == "st-h0"
        assert entries[0]["detail"]["reason"].startswith("watchdog: selftest_failed: 3 corrupt frame(s)")
        assert agent.health.report()["selftest"]["corrupt_frames"] == 3

        agent.selftest.mangle = None  # fixed: a passing run clears it and the host undrains
        report = await agent.selftest.run_once()
        assert report is not None
        assert report.ok, format_report(report)
        await agent._watch([])
        await agent._watch([])
        host = await (await api.get("/api/v1/hosts/st-h0", headers=auth(ADMIN))).json()
        assert host["state"] == "up"
    finally:
        agent.stop()
        await asyncio.wait_for(task, 30)


def test_the_command_prints_the_figures_and_exits_0_on_a_pass(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from streamer.cli import main

    assert main(["selftest", "--seconds", "1", "--loss-ms", "0", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["ok"] is True and figures["corrupt_frames"] == 0 and figures["frames_checked"] > 10
    assert figures["packets_dropped"] == 0 and figures["recovered_ms"] is None
