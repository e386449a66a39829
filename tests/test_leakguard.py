"""The leak guard (tests/leakguard.py) finds this run's leftover processes, its children and orphans alike,
never another run's, names the module that left them, and kills them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

from tests import leakguard


def orphan(env: dict[str, str]) -> int:
    """A ``sleep`` whose parent shell exited at once: re-parented away from this process."""
    out = subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], env=env, capture_output=True,
                         text=True, timeout=10, check=True)
    return int(out.stdout)


def test_children_and_orphans_of_this_run_are_found_named_and_killed() -> None:
    before = set(leakguard.ours())
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    ours = orphan(dict(os.environ))
    theirs = orphan({k: v for k, v in os.environ.items() if k != leakguard.MARKER})  # another run's, say
    try:
        left = leakguard.left_after(before, grace_s=0)
        assert {p.pid for p in left} == {child.pid, ours}
        assert leakguard.left_after(set(leakguard.ours()), grace_s=0) == []  # nothing new since
        leakguard.blame(left, "tests.test_leakguard")
        lines = leakguard.report(sorted(left, key=lambda p: p.pid))
        assert all(line.endswith("(left by tests.test_leakguard)") and "sleep 60" in line for line in lines)
        leakguard.kill(left)
        assert child.wait(5) == -signal.SIGKILL
        assert not leakguard.running(ours)
        assert leakguard.running(theirs)  # not this run's: never touched
    finally:
        for pid in (child.pid, ours, theirs):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        child.wait(5)
