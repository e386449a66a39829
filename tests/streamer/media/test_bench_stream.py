"""Smoke test of bench/bench_stream.py: its functions on one small profile, quick settings.

It checks that the benchmark measures real things (frames decoded by a viewer in
another process, capture/render and encode cost, CPU of the node) and that it
leaves nothing behind; it asserts no timings beyond "more than zero".
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from bench import bench_stream as bench

pytestmark = pytest.mark.timeout(90)
needs_desktop = pytest.mark.skipif(
    any(shutil.which(tool) is None for tool in ("Xvfb", "openbox", "xterm")),
    reason="desktop sessions need Xvfb, openbox and xterm (Debian packages xvfb, openbox, xterm)",
)

SMALL = bench.Profile("360p15", 640, 360, 15)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _bench_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(("rb-frames-bench", "rb-input-bench"))]


async def test_frame_cost_measures_capture_render_and_encode() -> None:
    selection, probes = await bench.node_encoder()
    assert selection.backend.name in {p.name for p in probes if p.ok}
    game = await bench.game_frame_cost(SMALL, selection.backend, frames=10)
    assert game.frames == 10 and game.capture == "game" and game.encoder == selection.backend.name
    assert 0 < game.capture_p50 <= game.capture_p95 and 0 < game.encode_p50 <= game.encode_p95
    assert game.achieved_fps > 0
    if shutil.which("Xvfb") and shutil.which("openbox") and shutil.which("xterm"):
        desktop = await bench.desktop_frame_cost(SMALL, selection.backend, frames=10)
        assert desktop.frames == 10 and desktop.capture in ("x11grab", "mss")
        assert 0 < desktop.capture_p50 <= desktop.capture_p95 and 0 < desktop.encode_p50 <= desktop.encode_p95


@pytest.mark.parametrize("kind", [pytest.param("desktop", marks=needs_desktop), "game"])
async def test_one_session_streams_to_a_viewer_process_and_is_stopped(kind: str) -> None:
    steps: list[bench.RampStep] = []
    result = await bench.run_ramp(kind, SMALL, max_sessions=1, warmup_s=0.5, window_s=1.5, progress=steps.append)
    assert len(result.steps) == 1 and steps == list(result.steps)
    step = result.steps[0]
    assert step.sessions == 1 and step.fps == SMALL.fps
    (stream,) = step.streams
    assert stream.received > 0 and stream.received_fps > 0
    assert (stream.width, stream.height) == (SMALL.width, SMALL.height)  # pinned: no ladder step-down
    assert stream.encoder is not None and stream.encode_p50 is not None and stream.encode_p50 > 0
    assert stream.grab_p50 is not None and stream.grab_p50 > 0
    assert 0 < step.node_cpu <= 2.5 and step.process_cpu > 0 and step.viewer_cpu >= 0
    if kind == "desktop":
        assert step.xvfb_cpu >= 0
        # xvfb, wm, app, viewer, plus the session's PulseAudio and its capture where it is installed
        assert len(result.pids) == (6 if shutil.which("pulseaudio") else 4)
    else:
        assert step.xvfb_cpu == 0 and len(result.pids) == 1  # the viewer
    assert result.sustained >= 1 and result.capped
    # Everything the ramp started is gone: processes reaped, frame/input threads joined.
    assert [pid for pid in result.pids if _alive(pid)] == []
    assert _bench_threads() == []


def test_pinned_profile_keeps_the_requested_rung() -> None:
    for kind in bench.KINDS:
        for profile in bench.PROFILES:
            pinned = bench.pinned_bitrate_profile(kind, profile)
            top = bench._ladder(kind, profile).rungs[0]
            assert pinned.min_bps >= top.floor_bps and pinned.min_bps <= pinned.start_bps <= pinned.max_bps
    # What the pin works around: a default game profile starts 1080p60 below its top rung.
    rung = bench.default_start_rung("game", bench.Profile("1080p60", 1920, 1080, 60))
    assert (rung.width, rung.height, rung.fps) == (1280, 720, 60)
