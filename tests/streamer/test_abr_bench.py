"""Smoke test of the adaptive-bitrate benchmark: our sender through a real capacity drop.

One shortened step-down scenario (6 Mbps -> 1.5 Mbps) in a ``tests.netem.lab.Lab`` with the
``ours`` sender of ``bench/abr_peers.py`` (the node's ``SessionRuntime``) and the aiortc
viewer, driven by ``bench/bench_abr.py``'s own ``run_one``.  It asserts behaviour, not
timing: the target ends below the new capacity, frames keep arriving after the drop,
input pings are answered.  Skips with the Lab's reason where namespaces cannot be made.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.netem.lab import Link, unavailable_reason

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(unavailable_reason() is not None, reason=f"network lab: {unavailable_reason()}"),
]

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_abr.py"
HIGH_BPS, LOW_BPS = 6_000_000, 1_500_000


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_abr", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_abr"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def test_our_sender_follows_a_capacity_drop_and_input_stays_answered() -> None:
    bench = load_bench()
    base = Link(delay_ms=10.0)
    scenario = bench.Scenario(
        "smoke",
        "6 -> 1.5 Mbps",
        (
            bench.Phase(6.0, Link(rate_bps=HIGH_BPS, delay_ms=10.0), base),
            bench.Phase(10.0, Link(rate_bps=LOW_BPS, delay_ms=10.0), base),
        ),
    )
    run = bench.run_one(scenario, "ours", use_lab=True)
    assert run.shaped
    drop, end = run.phases[1]["start"], run.phases[1]["end"]

    # The controller's target ends below the new capacity (the last 2 s of the low phase).
    late = [s for s in run.sender_result["samples"] if end - 2.0 <= s[0] <= end and s[1] is not None]
    assert late, "no sender samples at the end of the low phase"
    assert max(s[1] for s in late) < LOW_BPS, [s[1] for s in late]
    counts = run.sender_result["decision_counts"]
    assert counts.get("start") == 1 and sum(counts.values()) > 10

    # Frames keep arriving after the drop, with readable stamps at the sender's size.
    after = [f for f in run.viewer["frames"] if drop <= f[0] <= end]
    assert len(after) >= 30, f"only {len(after)} frames decoded after the drop"
    numbers = [f[2] for f in after]
    assert numbers == sorted(numbers)

    # Input pings sent after the drop were answered.
    answered = [p for p in run.viewer["pings"] if drop <= p[0] <= end]
    assert answered, "no input ping answered after the drop"
    metrics = bench.analyse(run)
    assert metrics.input_p95_ms is not None and metrics.frames > 0
