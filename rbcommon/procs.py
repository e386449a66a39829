"""Stopping a child process and everything it started.

Children that may start children of their own (a render node starts Xvfb, a window manager
and the session app) are started with ``start_new_session=True``, which makes each the leader
of its own process group.  ``terminate_group`` signals that whole group: SIGTERM, a grace
period, then SIGKILL, and SIGKILL is sent to the group even when the leader already exited,
so nothing it left behind survives.  One coroutine, no shared state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal

log = logging.getLogger(__name__)


def kill_group(pgid: int) -> None:
    """SIGKILL process group ``pgid``; a group that is already gone (or not ours) is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def terminate_group(proc: asyncio.subprocess.Process, timeout_s: float = 10.0) -> int:
    """SIGTERM the process group led by ``proc``, SIGKILL it after ``timeout_s``; returns the exit code.

    ``proc`` must have been started with ``start_new_session=True`` (its pid is its group id).
    """
    pgid = proc.pid
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            log.warning("pid %d ignored SIGTERM for %.1f s: SIGKILL", pgid, timeout_s)
    kill_group(pgid)  # the leader, if still there, and anything left in its group
    return await proc.wait()
