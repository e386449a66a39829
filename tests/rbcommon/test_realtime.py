"""Nothing the test run starts can take real-time priority, and a process can give it up itself
(rbcommon.realtime; tests/conftest.py calls ``forbid_realtime(this_process=False)`` for the run).

The failure it guards against: run as root, Chromium puts its audio threads on SCHED_RR and a render
node's SVT-AV1 its threads on SCHED_FIFO 99; on two cores a busy one starves the machine.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading

import pytest

from rbcommon.realtime import forbid_realtime, sys_nice_in

CHILD = """import os
from rbcommon.realtime import sys_nice_in
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    print("fifo", sys_nice_in("CapEff"))
except PermissionError:
    print("refused", sys_nice_in("CapEff"))"""


def test_nothing_the_run_starts_can_take_realtime_priority() -> None:
    assert not sys_nice_in("CapInh") and not sys_nice_in("CapAmb")
    if os.geteuid() == 0:  # root's programs get the bounding set: the capability is gone from it
        assert not sys_nice_in("CapBnd")
    assert resource.getrlimit(resource.RLIMIT_RTPRIO) == (0, 0)
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=30,
                           env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert child.stdout.strip() == "refused False", child


def test_a_process_can_give_it_up_itself() -> None:
    """What ``render-node`` does at start (the default), here in a thread: capabilities are per thread."""
    out: dict[str, object] = {}

    def run() -> None:
        out["notes"] = forbid_realtime()
        out["cap"] = sys_nice_in("CapEff")
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
            out["fifo"] = "taken"
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        except PermissionError:
            out["fifo"] = "refused"

    if os.geteuid() != 0:
        pytest.skip("only root holds CAP_SYS_NICE to give up")
    assert sys_nice_in("CapEff")  # the test process keeps its own (tests/encoder/test_encoder_sched.py uses it)
    t = threading.Thread(target=run)
    t.start()
    t.join(10)
    assert out == {"notes": [], "cap": False, "fifo": "refused"}
