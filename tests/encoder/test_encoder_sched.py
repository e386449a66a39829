"""No encoder library leaves our threads real-time (encoder.sched).

libsvtav1 opened by root puts the opening thread and its workers in SCHED_FIFO 99; every process that
thread starts afterwards inherits it (a render node's sessions, the suite's Chromium).  Each case runs
in a thread of its own so that a failure cannot leave the test process itself real-time.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from fractions import Fraction

import av
import pytest

from encoder.backends import BACKENDS
from encoder.sched import REALTIME_POLICIES, no_realtime, realtime_threads
from encoder.video import EncoderConfig, VideoEncoder

SVT = next(b for b in BACKENDS if b.codec == "libsvtav1")


def _in_thread(fn: Callable[[], object]) -> object:
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        finally:  # never let a real-time thread outlive the case
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    assert out, "the case raised or hung"
    return out[0]


def _svt_or_skip() -> None:
    if SVT.codec not in av.codecs_available:
        pytest.skip("this FFmpeg has no libsvtav1")


def _open_bare() -> tuple[bool, int]:
    """PyAV alone: is the opening thread real-time after the open, how many threads are."""
    ctx = av.CodecContext.create(SVT.codec, "w")
    ctx.width, ctx.height, ctx.pix_fmt = 320, 240, "yuv420p"
    ctx.time_base, ctx.framerate = Fraction(1, 30), Fraction(30)
    ctx.open()
    try:
        return os.sched_getscheduler(0) in REALTIME_POLICIES, len(realtime_threads())
    finally:
        del ctx


def test_the_library_does_make_threads_real_time_as_root() -> None:
    """The control: without the guard, root's libsvtav1 open leaves its thread real-time."""
    _svt_or_skip()
    if os.geteuid() != 0:
        pytest.skip("only root (CAP_SYS_NICE) lets libsvtav1 raise priorities")
    caller_rt, _ = _in_thread(_open_bare)  # type: ignore[misc]
    assert caller_rt


def test_opening_svt_av1_leaves_no_thread_real_time() -> None:
    _svt_or_skip()

    def case() -> tuple[int, set[int]]:
        with VideoEncoder(SVT, EncoderConfig(320, 240, 30, 1_000_000, threads=1)):
            return os.sched_getscheduler(0), realtime_threads()

    policy, during = _in_thread(case)  # type: ignore[misc]
    assert policy not in REALTIME_POLICIES
    assert during == set(), f"threads left real-time after the open: {sorted(during)}"


def test_a_thread_real_time_on_purpose_stays_so() -> None:
    """The guard restores what was; it does not strip a policy someone chose."""
    if os.geteuid() != 0:
        pytest.skip("setting SCHED_RR needs root")

    def case() -> int:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
        with no_realtime("nothing"):
            pass
        return os.sched_getscheduler(0)

    assert _in_thread(case) == os.SCHED_RR
