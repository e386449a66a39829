"""Processes a test run leaves behind: found after each test module, reported, and killed at the end.

A process is this run's when it descends from the pytest process, or when its environment carries
``RB_TEST_RUN=<this run's id>`` (tests/conftest.py sets it; children inherit it, so it also finds the
ones that re-parented to init: a daemonized helper, a node whose parent died).  Another engineer's
run on the same machine has another id, so nothing of theirs is ever touched.

After each module (tests/conftest.py's module fixture) the processes of this run that appeared
during the module and are still alive after a short grace are reported as a warning naming the
module; at session end every process of this run still alive is SIGKILLed (each one, and the
process group it leads) and listed in the terminal summary.  Long-lived helpers a session fixture
starts on purpose are registered with ``keep``.

Cost: one pass over /proc (stat, and environ for processes outside the tree): milliseconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

MARKER = "RB_TEST_RUN"
GRACE_S = 3.0  # a process may take this long to exit after its test's teardown (Chromium's crashpad handler)
# Python's multiprocessing resource tracker lives as long as the process that started it, by design
BENIGN = ("multiprocessing.resource_tracker",)


@dataclass(frozen=True)
class Proc:
    pid: int
    start: int  # start time in clock ticks since boot: (pid, start) names one process even when pids are reused
    ppid: int
    pgid: int
    comm: str
    cmdline: str

    @property
    def key(self) -> tuple[int, int]:
        return (self.pid, self.start)

    def describe(self) -> str:
        return f"{self.pid} {self.cmdline[:120] or self.comm}"


def run_id() -> str:
    """This run's id, set in the environment on first use (children inherit it)."""
    return os.environ.setdefault(MARKER, uuid.uuid4().hex)


_kept: set[tuple[int, int]] = set()
_blamed: dict[tuple[int, int], str] = {}  # leaked process -> the test module after which it was found


def keep(pid: int) -> None:
    """A process a session fixture runs on purpose (and stops itself): never reported nor killed."""
    proc = _read(pid)
    if proc is not None:
        _kept.add(proc.key)


def _read(pid: int) -> Proc | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    comm = stat[stat.index("(") + 1:stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):  # a zombie holds no resources and cannot be killed; its parent reaps it
        return None
    return Proc(pid=pid, start=int(fields[19]), ppid=int(fields[1]), pgid=int(fields[2]), comm=comm,
                cmdline=cmdline.replace(b"\0", b" ").decode(errors="replace").strip())


def running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    return _read(pid) is not None


def _marked(pid: int, token: bytes) -> bool:
    try:
        return token in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def ours(root: int | None = None) -> dict[tuple[int, int], Proc]:
    """This run's live processes other than the pytest process itself (and kept or benign ones)."""
    root = os.getpid() if root is None else root
    token = f"{MARKER}={run_id()}".encode()
    procs: dict[int, Proc] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (p := _read(int(d.name))) is not None:
            procs[p.pid] = p
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)
    tree: set[int] = set()
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo.extend(children.get(pid, []))
    found = {}
    for pid, p in procs.items():
        if pid == root or p.key in _kept or any(b in p.cmdline for b in BENIGN):
            continue
        if pid in tree or _marked(pid, token):
            found[p.key] = p
    return found


def left_after(before: set[tuple[int, int]], grace_s: float = GRACE_S) -> list[Proc]:
    """Processes of this run that were not there in ``before`` and are still alive after ``grace_s``."""
    deadline = time.monotonic() + grace_s
    while True:
        new = [p for k, p in ours().items() if k not in before]
        if not new or time.monotonic() >= deadline:
            return new
        time.sleep(0.1)


def blame(procs: list[Proc], module: str) -> None:
    """Remember which module left these processes (the session-end report names it)."""
    for p in procs:
        _blamed.setdefault(p.key, module)


def report(procs: list[Proc]) -> list[str]:
    """One line per process: what it is and the module after which it was first found alive."""
    return [f"{p.describe()} (left by {_blamed.get(p.key, 'session teardown')})" for p in procs]


def kill(procs: list[Proc]) -> None:
    """SIGKILL each process, and the process group each one leads (never the pytest process's own group)."""
    own_group = os.getpgid(0)
    for p in procs:
        if p.pgid == p.pid and p.pgid != own_group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pgid, signal.SIGKILL)
        current = _read(p.pid)
        if current is not None and current.key == p.key:  # still the same process, not a reused pid
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    for p in procs:  # wait (bounded) until each is gone or a zombie (left for its parent to reap)
        while time.monotonic() < deadline:
            current = _read(p.pid)
            if current is None or current.key != p.key:
                break
            time.sleep(0.05)
