"""Stopping a child process and everything it started.

Children that may start children of their own (a render node starts Xvfb, a window manager
and the session app) are started with ``start_new_session=True``, which makes each the leader
of its own process group.  ``terminate_group`` signals that whole group: SIGTERM, a grace
period, then SIGKILL, and SIGKILL is sent to the group even when the leader already exited,
so nothing it left behind survives.  One coroutine, no shared state.

Scratch folders of a process's children (a session's display and audio folders) are made by
`owned_tmpdir`, which writes the owner's pid into them, so that `sweep_stale_tmpdirs` can remove
the ones whose owner died without cleaning up (a SIGKILLed render node) and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)

OWNER_FILE = ".rb-owner"  # the pid of the process that made an owned scratch folder
UNOWNED_GRACE_S = 3600.0  # a folder without an owner file (made by an older version) is stale this old


def owned_tmpdir(prefix: str, owner: int | None = None) -> Path:
    """A fresh private folder in the temp dir that records ``owner`` (default: this process)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    (path / OWNER_FILE).write_text(str(owner if owner is not None else os.getpid()))
    return path


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists (ours or another user's; a zombie counts as existing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, someone else's
    return True


def sweep_stale_tmpdirs(prefixes: Sequence[str], root: str | None = None, now: float | None = None) -> list[Path]:
    """Remove folders named ``<prefix>*`` under ``root`` (the temp dir) whose owner is gone; returns them.

    A folder whose owner pid is alive is kept (another node on this machine, or a session running);
    one without an owner file is removed only when older than ``UNOWNED_GRACE_S``.
    """
    base = Path(root or tempfile.gettempdir())
    now = time.time() if now is None else now
    removed = []
    for prefix in prefixes:
        for path in base.glob(prefix + "*"):
            if not path.is_dir() or path.is_symlink():
                continue
            try:
                owner = int((path / OWNER_FILE).read_text().strip())
                stale = not pid_alive(owner)
            except FileNotFoundError:
                stale = now - path.stat().st_mtime > UNOWNED_GRACE_S
            except (OSError, ValueError):
                continue
            if stale:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


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
