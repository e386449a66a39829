"""On a host with NVIDIA GPUs: telemetry, seats, GPU rendering and NVENC as the node will use them.

Every test here is marked ``gpu`` and skips with NVML's own reason where no NVIDIA GPU is found,
so CI (no GPU) reports them skipped, never passed.  ``scripts/gpu-check.sh`` runs them on a GPU
machine together with the doctor and the benchmarks.  Tests are synchronous on purpose: the GPU
machine's Python has pytest but not pytest-asyncio.
"""

from __future__ import annotations

import pytest

from encoder.backends import backend_by_name
from encoder.pattern import moving_pattern
from encoder.video import EncoderConfig, VideoEncoder
from streamer.desktop.game import Game, find_player, read_stamp
from streamer.node.gpus import GpuTelemetry, read_gpus
from streamer.node.inventory import probe_nvenc, take_inventory

HARDWARE, WHY = read_gpus()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HARDWARE, reason=f"no NVIDIA GPU here: {WHY}")]
INDEXES = [g.index for g in HARDWARE]


def test_telemetry_reads_every_gpu_and_never_raises() -> None:
    rows = GpuTelemetry().read(INDEXES)
    assert [r["index"] for r in rows] == INDEXES
    for r in rows:
        # what every NVIDIA card reports; encoder fields may be None (a card without NVENC)
        assert r["vram_total_mb"] and r["vram_total_mb"] > 0, r
        assert r["vram_used_mb"] is not None and r["utilization"] is not None, r
        assert r["temperature_c"] is not None, r


def test_every_gpu_gets_seats_with_a_reason() -> None:
    budget = 2 * len(INDEXES)
    inv = take_inventory(budget)
    assert inv.gpu_render and [g.index for g in inv.gpus] == INDEXES
    for g in inv.gpus:
        assert g.reason
        if g.encode == "nvenc":
            assert inv.nvenc[g.index].ok and g.nvenc
        else:  # renders on the GPU, encodes on the CPU: its share of the software budget
            assert not inv.nvenc[g.index].ok and g.encoder_session_limit == 2, g


@pytest.mark.parametrize("index", INDEXES)
def test_opengl_renders_on_the_gpu_and_the_frame_reads_back(index: int) -> None:
    from streamer.desktop.glgame import GlGameRenderer

    renderer = GlGameRenderer(1280, 720, device_index=index)
    try:
        assert "NVIDIA" in renderer.renderer_string.upper(), renderer.renderer_string
        assert "LLVMPIPE" not in renderer.renderer_string.upper()
        game = Game(1280, 720)
        frame = renderer.render(game.scene(1_700_000_000_000))
        stamp = read_stamp(frame)
        assert stamp is not None and stamp.ts_ms == 1_700_000_000_000
        found = find_player(frame)
        px, py = game.player_position()
        assert found is not None and abs(found[0] - px) <= 1 and abs(found[1] - py) <= 1
    finally:
        renderer.close()


@pytest.mark.parametrize("index", INDEXES)
def test_nvenc_keyframes_from_bitrate_steps_are_the_ones_the_plan_counts(index: int) -> None:
    """Where NVENC exists: 1080p60 on this GPU, ten live bitrate steps between 8 and 4 Mbps.  Every
    keyframe after the first must be one the rate plan said a step costs (FFmpeg's NVENC: an IDR
    per applied step); a backend that avoids them (goal: 0) shows 1 keyframe in all."""
    probe = probe_nvenc(index)
    if not probe.ok:
        pytest.skip(f"GPU {index} has no working NVENC: {probe.reason}")
    config = EncoderConfig(1920, 1080, 60.0, 8_000_000, gpu=index)
    keyframes = costed = 0
    with VideoEncoder(backend_by_name("h264_nvenc"), config) as enc:
        for i in range(120):
            stepped = i > 0 and i % 10 == 0
            if stepped:
                enc.set_bitrate(4_000_000 if (i // 10) % 2 else 8_000_000)
            keyframes += sum(1 for p in enc.encode(moving_pattern(1920, 1080, i)) if p.is_keyframe)
            decision = enc.last_bitrate_decision
            if stepped and decision is not None and decision.costs_keyframe:
                costed += 1
    assert keyframes == 1 + costed
