"""The stream self-test through the real encoder, frame thread, aiortc peers and loopback UDP: a clean run
checks its frames and recovers from a loss window with 0 corrupt frames, from the pattern source and from
the x11 source (painted into a real Xvfb, grabbed by the sessions' capture); injected faults (a picture that
is not the one stamped, a corrupted bitstream, a painter that skips the stamp, a frame tampered after the
capture) are caught; a failed run drains the host through the watchdog and the broker (a real agent on a
real broker app, Redis and SQL)."""

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
from streamer.desktop.capture import FrameSource, bgra_frame
from streamer.desktop.game import read_stamp, stamp_height
from streamer.node.agent import NodeAgent
from streamer.node.selftest import SelftestConfig, format_report, run_selftest
from streamer.node.settings import load
from streamer.node.xpattern import PaintedCapture, Painter, capture_backends
from tests.conftest import ADMIN, NODE, auth
from tests.streamer.node.test_xpattern import XVFB, needs_xvfb, xvfb_children
from tests.streamer.viewer import until

pytestmark = pytest.mark.timeout(90)
SHORT = SelftestConfig(seconds=1.5, loss_ms=0, source="pattern")
X11_SHORT = SelftestConfig(seconds=1.5, loss_ms=0, source="x11")
FAULTY = range(10, 13)  # the frames each fault hits


def wrong_picture(frame_no: int, bgra: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """Frames 10-12 carry their own stamp over another frame's picture (what a stale or mixed-up buffer shows)."""
    if frame_no in FAULTY:
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


class StampSkippingPainter:
    """A painter whose frames 10-12 leave the stamp strip out (the screen keeps frame 9's stamp over them)."""

    def __init__(self, inner: Painter) -> None:
        self.inner = inner

    def paint(self, bgra: npt.NDArray[np.uint8], first_row: int = 0) -> None:
        stamp = read_stamp(bgra)
        if stamp is not None and stamp.frame_no in FAULTY:
            first_row = stamp_height(bgra.shape[1])
        self.inner.paint(bgra, first_row)

    def close(self) -> None:
        self.inner.close()


def skip_stamps(source: FrameSource) -> FrameSource:
    assert isinstance(source, PaintedCapture)
    source.painter = StampSkippingPainter(source.painter)
    return source


class TamperedAfterCapture:
    """The capture, with the lower half of grabs 10-12 blacked out after the grab (a damaged capture buffer)."""

    def __init__(self, inner: FrameSource) -> None:
        self.inner, self.grabs = inner, 0
        self.backend, self.width, self.height = inner.backend, inner.width, inner.height

    def grab(self) -> av.VideoFrame:
        frame = self.inner.grab()
        self.grabs += 1
        if self.grabs not in FAULTY:
            return frame
        pixels = frame.to_ndarray(format="bgra")
        pixels[self.height // 2:, :, :3] = 0
        out = bgra_frame(pixels)
        out.pts, out.time_base = frame.pts, frame.time_base
        return out

    def stats(self) -> Any:
        return self.inner.stats()

    def close(self) -> None:
        self.inner.close()


def no_selftest_threads() -> bool:
    return not any(t.name == "rb-frames-selftest" for t in threading.enumerate())


async def test_a_clean_run_checks_its_frames_and_recovers_from_lost_packets_without_a_corrupt_frame() -> None:
    report = await run_selftest(SelftestConfig(seconds=3.0, loss_at_s=1.0, loss_ms=300, source="pattern"))
    assert report.ok, format_report(report)
    assert report.corrupt_frames == 0 and report.unexplained_missing == 0
    assert report.frames_checked > 20  # 30 fps for 3 s + recovery, minus the loss window (and a loaded machine)
    assert report.packets_dropped > 0 and report.recovered_ms is not None
    # the floor sits well under what the codec delivers (median 30-32 dB measured) and over a wrong picture (15)
    assert report.psnr_p50_db is not None and report.psnr_p50_db > SelftestConfig().psnr_floor_db + 3
    assert report.source == "pattern" and report.stale_frames_skipped == 0
    assert no_selftest_threads()


@needs_xvfb
async def test_the_x11_source_is_painted_captured_streamed_and_checked_across_a_loss_window() -> None:
    report = await run_selftest(SelftestConfig(seconds=3.0, loss_at_s=1.0, loss_ms=300, source="x11"))
    assert report.ok, format_report(report)
    assert report.source == "x11" and report.capture == capture_backends()[0]  # x11grab where FFmpeg has it
    assert report.corrupt_frames == 0 and report.unexplained_missing == 0
    assert report.frames_checked > 20 and report.packets_dropped > 0 and report.recovered_ms is not None
    if report.capture == "x11grab":  # the frames it grabbed when opened: skipped and counted, never corrupt
        assert report.stale_frames_skipped > 0
    assert report.psnr_min_db is not None and report.psnr_min_db >= SelftestConfig().psnr_floor_db
    assert no_selftest_threads() and not xvfb_children()


@needs_xvfb
async def test_a_painter_that_skips_the_stamp_is_caught_through_the_capture() -> None:
    report = await run_selftest(X11_SHORT, wrap_source=skip_stamps)
    # frames 10-12 show frame 9's stamp over their own picture: 3 corrupt, and 10-12 never seen
    assert not report.ok and report.corrupt_frames == 3, format_report(report)
    assert report.unexplained_missing == 3 and "PSNR" in report.reason
    assert not xvfb_children()


@needs_xvfb
async def test_a_frame_tampered_after_the_capture_is_a_corrupt_frame() -> None:
    report = await run_selftest(X11_SHORT, wrap_source=TamperedAfterCapture)
    assert not report.ok and report.corrupt_frames == 3, format_report(report)
    assert report.unexplained_missing == 0 and report.source == "x11"
    assert not xvfb_children()


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
    assert figures["source"] == ("x11" if XVFB else "pattern") and figures["source_reason"].startswith("auto")

