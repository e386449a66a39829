"""Plumbing of ``bench/bench_abr.py``'s matrix mode (issue #22), on synthetic runs: no Lab, no peers.

The cells (capacity x queue x RTT, ``burst``, ``step``), ``--cells`` patterns, the loss-burst clock,
and the per-cell figures and table from a hand-made ``RunData`` whose answers are known exactly.
The real runs are the benchmark's (``test_abr_bench.py`` smoke-runs ``run_one`` in a Lab).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from tests.streamer.benchload import load_bench_abr


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench_abr()


def test_cells_cover_the_grid_a_burst_and_a_step(bench: ModuleType) -> None:
    cells = bench.cells(quick=True)
    assert len(cells) == 3 * 3 * 3 + 2
    cell = cells["2M-q30-r120"]
    warm, measured = cell.scenario.phases
    assert (warm.down.rate_bps, measured.down.rate_bps) == (4_000_000, 2_000_000)
    assert (measured.down.queue_ms, measured.down.delay_ms, measured.up.delay_ms) == (30, 60.0, 60.0)
    assert (cell.fixed_bps, cell.measure_from) == (1_600_000, 1)
    assert [p.down.rate_bps for p in cells["step"].scenario.phases] == [10_000_000, 3_000_000, 10_000_000]
    assert cells["burst"].scenario.phases[1].bursts == (2.5, 0.15, 50.0)
    full = bench.cells(quick=False)
    assert full["8M-q100-r20"].scenario.phases[1].duration_s == 24.0


def test_cell_patterns_select_in_matrix_order(bench: ModuleType) -> None:
    cells = bench.cells(quick=True)
    chosen = bench.select_cells(cells, ["step", "*-q30-r120", "2M-q30-r120"])
    assert [c.key for c in chosen] == ["2M-q30-r120", "4M-q30-r120", "8M-q30-r120", "step"]
    with pytest.raises(ValueError, match="'9M-\\*' matches no cell"):
        bench.select_cells(cells, ["9M-*"])


def test_loss_bursts_follow_their_clock(bench: ModuleType) -> None:
    phase = bench.cells(quick=True)["burst"].scenario.phases[1]
    # first burst at period / 2 = 1.25 s for 0.15 s, then every 2.5 s; 0 % between
    assert [phase.burst_loss(t) for t in (0.0, 1.2, 1.25, 1.39, 1.41, 3.8, 3.95)] == [0, 0, 50, 50, 0, 50, 0]
    assert bench.cells(quick=True)["4M-q60-r60"].scenario.phases[1].burst_loss(1.3) == 0.0


def synthetic_run(bench: ModuleType) -> Any:
    """Warm 0-4 s at 8 Mbps, measured 4-14 s at 4 Mbps: 3.2 Mbps goodput, 50 ms frames, one 500 ms gap."""
    phases = [
        {"start": 0.0, "end": 4.0, "capacity_bps": 8_000_000, "delay_ms": 30.0, "jitter_ms": 0.0},
        {"start": 4.0, "end": 14.0, "capacity_bps": 4_000_000, "delay_ms": 30.0, "jitter_ms": 0.0},
    ]
    frames = [[round(i / 30, 4), 50.0 + (i % 20), i] for i in range(420) if not 10.0 < i / 30 < 10.5]
    bins = [[k, 40_000] for k in range(140)]  # 40 kB per 100 ms: 3.2 Mbps
    viewer = {
        "bin_s": 0.1,
        "bins": bins,
        "frames": frames,
        "pings": [[t / 20, 70.0] for t in range(280)],
        "pings_unanswered": [],
        "unreadable_stamps": 0,
    }
    sender = {"samples": [[t / 10, 3_300_000, 3_250_000] for t in range(140)]}
    link = [[t / 4, 0, 0, 0] for t in range(57)]
    return bench.RunData("4M-q60-r60", "ours", True, phases, [60.0] * 40, viewer, sender, link)


def test_cell_figures_cover_the_measured_phase(bench: ModuleType) -> None:
    figures = bench.cell_figures(synthetic_run(bench), 1)
    assert figures.freezes_after == 1  # the 0.5 s gap at 10 s, after the phase settled at once
    assert figures.settle_s == [0.0]  # the measured phase is entered by a drop
    assert figures.settled_min == pytest.approx(10 / 60)
    assert figures.freezes_per_min == pytest.approx(6.0)
    assert figures.utilization == pytest.approx(0.8)
    assert figures.delay_p95_ms == 69.0
    assert (figures.input_p95_ms, figures.path_rtt_p95_ms, figures.overflows_after) == (70.0, 60.0, 0)


def test_cell_table_judges_against_the_goals(bench: ModuleType) -> None:
    run = synthetic_run(bench)
    ours = bench.cell_figures(run, 1)
    other = bench.cell_figures(run, 1)
    other.delay_p95_ms = 50.0  # the best sender's p95: ours (69) is within 15 ms of it? no
    text = bench.cell_table(bench.cells(quick=True)["4M-q60-r60"], {"ours": ours, "stock": other}, True)
    ours_row = next(line for line in text.splitlines() if line.startswith("ours"))
    assert "6.0 (1 in 10 s) MISS" in ours_row
    assert "0.0 ok" in ours_row
    assert "69 MISS" in ours_row and "80 % ok" in ours_row and "70 (+10) ok" in ours_row
    stock_row = next(line for line in text.splitlines() if line.startswith("stock"))
    assert "50 ok" in stock_row
