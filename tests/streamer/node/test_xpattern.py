"""The self-test's X source: the source choice (pure), and the painter with the sessions' capture on a real
Xvfb: the frames x11grab grabbed when it was opened are skipped and counted, after which every grab shows the
painted picture to the pixel."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from streamer.desktop.game import read_stamp
from streamer.node.framecheck import stamped_pattern
from streamer.node.selftest import SelftestConfig
from streamer.node.xpattern import capture_backends, choose_source, x11_source

XVFB = shutil.which("Xvfb")
NO_XVFB = choose_source("auto", None, ("mss",)).reason
needs_xvfb = pytest.mark.skipif(XVFB is None, reason=f"Xvfb is not installed (Debian package xvfb): {NO_XVFB}")
pytestmark = pytest.mark.timeout(60)


def xvfb_children() -> list[int]:
    """Pids of Xvfb processes whose parent is this test process (the self-test's own displays)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)
            comm, ppid = fields[0].split("(", 1)[1], int(fields[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if comm == "Xvfb" and ppid == os.getpid():
            out.append(int(stat.parent.name))
    return out


def test_auto_is_x11_where_xvfb_and_a_capture_backend_are_present_else_the_pattern() -> None:
    assert choose_source("auto", "/usr/bin/Xvfb", ("x11grab", "mss")).source == "x11"
    no_xvfb = choose_source("auto", None, ("x11grab", "mss"))
    assert no_xvfb.source == "pattern" and "no Xvfb" in no_xvfb.reason
    no_grab = choose_source("auto", "/usr/bin/Xvfb", ("mss",), "x11grab")
    assert no_grab.source == "pattern" and "no x11grab capture" in no_grab.reason
    assert choose_source("pattern", "/usr/bin/Xvfb", ("mss",)).source == "pattern"
    with pytest.raises(ValueError, match="x11 cannot run here: no Xvfb"):
        choose_source("x11", None, ("mss",))
    with pytest.raises(ValueError, match="source must be one of"):
        choose_source("x12", "/usr/bin/Xvfb", ("mss",))
    with pytest.raises(ValueError, match="source must be one of"):
        SelftestConfig(source="camera")  # the node refuses it at start, not at its first self-test
    with pytest.raises(ValueError, match="capture backend must be one of"):
        SelftestConfig(capture_backend="gdi")


@needs_xvfb
@pytest.mark.parametrize("backend", capture_backends())
async def test_after_the_stale_grabs_every_grab_shows_the_painted_frame(backend: str) -> None:
    async with x11_source(320, 240, capture_backend=backend) as source:
        assert source.backend == backend
        if backend == "x11grab":  # its stream probe's frames, grabbed at open before anything was painted
            assert source.stale_skipped > 0
        for n in range(1, 4):
            grabbed = source.grab().to_ndarray(format="bgr24")
            stamp = read_stamp(grabbed)
            assert stamp is not None and stamp.frame_no == n
            painted = stamped_pattern(320, 240, n, stamp.ts_ms)[..., :3]
            assert np.array_equal(grabbed, painted)  # the pointer is parked outside, no tearing
        assert xvfb_children()
    assert not xvfb_children()
