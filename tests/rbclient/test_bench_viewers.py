"""Smoke test of bench/bench_viewers.py: SDK viewers decoding from a real render node for a few seconds.

One viewer in this process, then two viewers in two child processes (the ``--procs`` path).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_viewers.py"
SANITY_MS = 2000.0  # a loopback frame later than this means something is broken, not slow


def _load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_viewers", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


def test_bench_viewers_in_process_and_in_child_processes(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _load_bench()
    rounds = bench.run(["--viewers", "1,2", "--procs", "2", "--seconds", "1.5", "--warmup-s", "0.3",
                        "--size", "320x180"])
    out = capsys.readouterr().out
    assert [(r.viewers, r.procs, len(r.results)) for r in rounds] == [(1, 1, 1), (2, 2, 2)]
    assert [v.index for v in rounds[1].results] == [0, 1]
    for viewer in [*rounds[0].results, *rounds[1].results]:
        s = viewer.summary
        assert s.frames >= 10 and s.fps > 3, s  # 30 fps asked; a loaded CI machine may fall far short
        assert s.render_to_decode_p50_ms is not None and 0 < s.render_to_decode_p50_ms < SANITY_MS, s
        assert s.bitrate_bps > 0 and viewer.codec == "H264"
    assert all(r.node_cpu_pct > 0 and r.client_cpu_pct > 0 for r in rounds)  # the processes were found, measured
    assert "2 viewer(s) in 2 process(es)" in out and "nodes' CPU" in out and "summary" in out


def test_viewers_split_evenly_over_processes() -> None:
    bench = _load_bench()
    assert bench.split(5, 2) == [3, 2] and bench.split(2, 4) == [1, 1] and bench.split(3, 1) == [3]


async def test_bench_viewers_against_an_existing_deployment(redis_url: str, prefix: str, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from tests.rbclient.sysfix import broker, game_pool, node, seats_used

    bench = _load_bench()
    async with broker(redis_url, prefix, tmp_path) as url, node(url, "game", "node-remote", tmp_path / "node.log"):
        await game_pool(url)
        opts = bench.parse_args(["--broker", url, "--viewers", "1", "--seconds", "1", "--warmup-s", "0.3",
                                 "--size", "320x180", "--host-address", "127.0.0.1"])
        rounds = await bench.measure_remote(opts)
        assert await seats_used(url) == 0  # the round ended its session
    out = capsys.readouterr().out
    [one] = rounds
    assert one.node_cpu_pct is None and one.nodes == 0 and one.results[0].summary.frames > 0
    assert "the deployment's nodes" in out and "not measured" in out
