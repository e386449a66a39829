"""Smoke test of bench/bench_first_frame.py: click -> first frame in Chromium, broken down into steps.

Runs the benchmark's ``run`` with one measured session per case for a game pool, cold and staged
(broker with embedded defaults, a render node, the viewer page in headless Debian Chromium) and checks
the breakdown is sane: every step present, in order, under a loopback sanity bound, and the staged
case really handed out a staged session.  Skips, saying why, where Chromium or Playwright is missing.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.web.conftest import CHROMIUM

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_first_frame.py"
SANITY_MS = 10_000.0  # a loopback first frame later than this means something is broken, not slow


def _load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_first_frame", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


def test_bench_first_frame_quick(capsys: pytest.CaptureFixture[str]) -> None:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium package (browsers are never downloaded)")
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        pytest.skip("the playwright package is not installed")

    bench = _load_bench()
    cases = bench.run(["--kinds", "game", "--modes", "cold,staged", "--sessions", "1", "--warmup", "0"])
    out = capsys.readouterr().out

    assert [(c.kind, c.mode) for c in cases] == [("game", "cold"), ("game", "staged")], out
    for case in cases:
        [marks] = case.sessions
        assert bench.monotonic_marks(marks), (case.mode, marks, out)
        assert 0 < marks["seat"] <= marks["frame"] < SANITY_MS, (case.mode, marks)
    cold, staged = cases
    assert cold.seat_states == ["starting"], out  # seated: the node starts it now
    assert staged.seat_states == ["running"], out  # handed a staged session, already running
    assert "click -> first frame" in out and "p50 / p95" in out
