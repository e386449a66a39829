"""``render-broker play`` errors a user can make: one line on stderr, no traceback, a non-zero exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from broker.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]  # the checkout under test, for the child's imports
pytest.importorskip("pygame", reason="pygame is not installed: pip install 'render-broker[play]'")


def play(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "broker", "play", *args], capture_output=True, text=True,
                          timeout=60, check=False, env={"SDL_VIDEODRIVER": "dummy", "PATH": "/usr/bin:/bin",
                                                        "PYTHONPATH": str(ROOT)})


def test_an_unreachable_broker_is_one_line() -> None:
    done = play("--broker", f"http://127.0.0.1:{free_port()}")
    assert done.returncode == 1
    assert done.stderr.startswith("render-broker play: cannot reach http://127.0.0.1:")
    assert "Traceback" not in done.stderr


def test_a_bad_option_is_refused_by_the_parser() -> None:
    done = play("--width", "wide")
    assert done.returncode == 2 and "--width: invalid int value: 'wide'" in done.stderr


def test_help_names_the_keys() -> None:
    done = play("--help")
    assert done.returncode == 0 and "F8 toggles the stats overlay" in done.stdout and "F9" in done.stdout
