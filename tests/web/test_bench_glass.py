"""Smoke test of bench/bench_glass.py: the whole system on this machine, glass-to-glass read in Chromium.

Runs the benchmark's ``run`` in quick mode (broker with embedded defaults, a render node serving a game
pool, the viewer page in headless Debian Chromium, a few seconds of per-frame stamp samples) and checks
that it measured something real: stamped frames arrived and the latencies are positive and plausible.
Skips, saying why, where Chromium, Playwright or the render node cannot run.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.web.conftest import CHROMIUM

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_glass.py"
SANITY_MS = 2000.0  # a loopback frame later than this means something is broken, not slow


def _load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_glass", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


def test_bench_glass_quick(capsys: pytest.CaptureFixture[str]) -> None:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium package (browsers are never downloaded)")
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        pytest.skip("the playwright package is not installed")
    try:
        import streamer.node.agent  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"the render-node agent is not importable: {exc}")

    bench = _load_bench()
    results = bench.run(["--quick", "--window-s", "3"])  # both buffering modes, one window each
    out = capsys.readouterr().out

    assert sorted(r.playout for r in results) == ["browser", "low"], out
    for result in results:
        assert result.count > 0, out
        p50, p95 = result.pct(50), result.pct(95)
        assert 0 < p50 <= p95 < SANITY_MS, (p50, p95, out)
        assert min(result.glass_ms) > 0, out  # a frame is never shown before it was rendered (one clock)
        assert result.decoded_fps > 0 and result.width > 0 and result.height > 0, out
        assert result.codec in ("H264", "VP8"), out
        assert f"{result.count} samples" in out and "p95" in out
        # low: the node's playout-delay extension is in the answer and the page set a floor; browser: neither
        assert result.playout_negotiated is (result.playout == "low"), out
        assert (result.buffer_floor_ms is not None) is (result.playout == "low"), out
    assert "side by side" in out


def test_frame_shift_pairs_samples_by_rtp_time() -> None:
    """The RTP origin is the common offset; a drawn frame 17 ms newer than the callback's shows as -17 ms."""
    bench = _load_bench()
    origin = (1 << 32) - 90 * 5  # the RTP clock wraps between the samples
    stamps = [1_764_700_000_000 + 17 * i for i in range(5)]
    rtp = [(origin + ts * 90) % (1 << 32) for ts in stamps]
    rtp[3] = (origin + stamps[2] * 90) % (1 << 32)  # callback of frame 2, image of frame 3
    rtp[4] = None  # Chromium gave no RTP time: left as is
    shifts, mismatched = bench.frame_shift_ms(stamps, rtp)
    assert shifts == [0.0, 0.0, 0.0, -17.0, 0.0] and mismatched == 1
