"""The probe table CLI (``python -m encoder`` / ``render-node encoders``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from encoder.backends import BACKENDS
from encoder.cli import main


def test_table_lists_every_backend_and_the_choice(capsys, probes):
    assert main([]) == 0
    out = capsys.readouterr().out
    for backend in BACKENDS:
        assert backend.name in out
        assert probes[backend.name].reason in out
    assert "selected: " in out
    if not probes["h264_nvenc"].ok:
        assert "selected: libx264" in out


def test_json_output(capsys):
    assert main(["--json", "--prefer", "vp8"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["selected"] == "libvpx"
    assert [p["name"] for p in payload["probes"]] == [b.name for b in BACKENDS]
    assert {"ok", "reason", "probe_ms"} <= set(payload["probes"][0])


def test_no_fit_exits_1(capsys):
    assert main(["--peer-codecs", "VP9"]) == 1
    assert "no encoder" in capsys.readouterr().err


def test_runs_as_module():
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "encoder", "--json"], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["selected"]
