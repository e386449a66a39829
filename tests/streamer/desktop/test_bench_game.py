"""Smoke test of bench/bench_game.py: a few tiny frames per renderer, the report and the JSON.

It checks that the benchmark measures both renderers on the same scenes and
says which GL device drew (or why none could); it asserts no timings beyond
"more than zero".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import bench_game as bench
from streamer.desktop.glgame import probe_gl


def test_bench_runs_both_renderers_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "game.json"
    assert bench.main(["--frames", "3", "--sizes", "320x180,400x240", "--list-devices", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    report = capsys.readouterr().out
    assert "ms per frame" in report and "cpu ms/frame" in report
    rows = result["rows"]
    gl_ok, gl_info = probe_gl(None)
    expected = {"cpu", "gl", "gl-draw"} if gl_ok else {"cpu"}
    for size in ("320x180", "400x240"):
        assert {r["renderer"] for r in rows if r["size"] == size} == expected
    for row in rows:
        assert row["frames"] == 3 and 0 < row["p50_ms"] <= row["p95_ms"] and row["fps"] > 0
    assert result["gl"]["available"] is gl_ok
    assert result["devices"] == [{"index": 0, "ok": gl_ok, "info": gl_info}]
    if gl_ok:
        assert result["gl"]["renderer"] == gl_info and gl_info in report
        assert [a["size"] for a in result["agreement"]] == ["320x180", "400x240"]
        assert all(a["stamps_equal"] for a in result["agreement"])
    else:
        assert result["gl"]["reason"] and result["gl"]["reason"] in report


def test_require_gl_fails_when_the_device_is_missing() -> None:
    code = bench.main(["--frames", "1", "--sizes", "320x180", "--device", "99", "--require-gl"])
    assert code == 2
