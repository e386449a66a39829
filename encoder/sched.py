"""Keep encoder libraries from making our threads real-time.

SVT-AV1 (``libsvtav1``), when the process may raise priorities (root, or
CAP_SYS_NICE), puts the thread that opens it and each of its ~40 worker
threads in ``SCHED_FIFO`` at priority 99, and the opening thread stays there
after the encoder is closed.  Every process that thread starts afterwards
inherits the policy: on a render node the session's Xvfb, window manager and
game; in the test suite every later broker, node and Chromium.  A busy
FIFO-99 process cannot be preempted by anything ordinary: on a two-core
machine two of them starve the rest of the system, including the ``kill``
meant to stop them (measured: a headless Chromium spinning after its browser
died held the machine until it was rebooted).

``no_realtime()`` wraps a codec open: the calling thread gets back the policy
it had, and any thread of this process that turned real-time during the open
returns to ``SCHED_OTHER``.  Threads that were real-time before (set so on
purpose by someone else) are left alone.  Linux only; elsewhere a no-op.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

REALTIME_POLICIES = frozenset(
    p for p in (getattr(os, "SCHED_FIFO", None), getattr(os, "SCHED_RR", None), getattr(os, "SCHED_DEADLINE", None))
    if p is not None
)
_TASKS = "/proc/self/task"


def realtime_threads() -> set[int]:
    """Thread ids of this process whose scheduling policy is real-time (empty where it cannot be read)."""
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return set()
    found: set[int] = set()
    for name in tids:
        try:
            if os.sched_getscheduler(int(name)) in REALTIME_POLICIES:
                found.add(int(name))
        except OSError:  # the thread ended meanwhile
            continue
    return found


@contextmanager
def no_realtime(what: str = "encoder") -> Iterator[None]:
    """Undo, on exit, any real-time scheduling the wrapped code gave this process's threads."""
    if not hasattr(os, "sched_getscheduler") or not os.path.isdir(_TASKS):
        yield
        return
    policy = os.sched_getscheduler(0)
    param = os.sched_getparam(0)
    before = realtime_threads()
    try:
        yield
    finally:
        restored = 0
        if os.sched_getscheduler(0) != policy or os.sched_getparam(0) != param:
            os.sched_setscheduler(0, policy, param)
            restored += 1
        for tid in realtime_threads() - before:
            try:
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                restored += 1
            except OSError:  # ended meanwhile, or not ours to change
                continue
        if restored:
            log.info("%s: %d thread(s) made real-time by the library returned to normal scheduling", what, restored)
