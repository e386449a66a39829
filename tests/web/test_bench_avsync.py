"""bench/bench_avsync.py: beeps and the frames of their instants are paired right, and a quick run measures both.

The pairing is pure and checked on synthetic timelines; the smoke test runs the benchmark (broker, render
node with the game's beacon, headless Debian Chromium) for a few beeps in the ``sync`` and ``low`` modes and
checks that both sides were measured and the sync control ran (not how close they are: that is the
benchmark's figure). Skips, saying why, where Chromium or
Playwright cannot run.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.web.conftest import CHROMIUM

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_avsync.py"
SANITY_MS = 2000.0


def _load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_avsync", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


def test_each_onset_is_paired_with_the_first_frame_shown_at_or_after_its_instant() -> None:
    bench = _load_bench()
    t = 1_796_410_180_000
    stamps = [t - 16, t + 4, t + 20, t + 1_004, t + 1_020]  # frames rendered around two beeps
    display = [s + 40.0 for s in stamps]  # each shown 40 ms after its render
    # the third beep's frames were never read; t + 400 is a hit the game played after the first beep
    heard = [t + 90.0, t + 400.0, t + 1_000 + 95.0, t + 3_000 + 90.0]
    beeps = bench.pair(display, stamps, heard)
    assert [(b.t_ms, b.video_ms, b.audio_ms) for b in beeps] == [(t, 44.0, 90.0), (t + 1_000, 44.0, 95.0)]
    assert [b.offset_ms for b in beeps] == [46.0, 51.0]
    assert bench.pair(display, stamps, [t + 1_600.0]) == []  # too long after any beep


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_bench_avsync_quick(capsys: pytest.CaptureFixture[str]) -> None:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium package (browsers are never downloaded)")
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        pytest.skip("the playwright package is not installed")
    bench = _load_bench()
    # the desktops' "sync" mode (the picture waits for the sound) and the games' "low", one session each
    by_mode = bench.run(["--quick", "--beeps", "3", "--warmup-s", "1", "--playout", "sync", "low"])
    out = capsys.readouterr().out
    assert "offset ms p50 / p95" in out and "jitter buffer" in out
    assert list(by_mode) == ["sync", "low"], out
    assert "video floor (jitterBufferTarget) at the end" in out  # the page ran its sync control
    for beeps in by_mode.values():
        assert len(beeps) >= 2, out
        for b in beeps:
            assert b.t_ms % bench.BEACON_MS == 0
            assert 0 < b.video_ms < SANITY_MS and 0 < b.audio_ms < SANITY_MS, out
