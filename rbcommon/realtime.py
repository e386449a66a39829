"""Keep a process and everything it starts off real-time scheduling (SCHED_FIFO/SCHED_RR).

Why: run as root, programs and libraries take real-time priority on their own.  SVT-AV1 (PyAV's
libsvtav1) puts the thread that opens an encoder and its ~40 workers on SCHED_FIFO 99
(``encoder.sched`` undoes it after each open); Chromium puts its audio threads on SCHED_RR 8, in
its own processes, where nothing of ours can undo it.  A busy real-time process on a two-core
machine starves everything else, down to the processes sent SIGKILL that never get the CPU to exit.

``forbid_realtime()`` removes CAP_SYS_NICE from the calling thread's bounding, inheritable and
ambient sets, so no program it executes gets it (root's programs get the bounding set), and sets
RLIMIT_RTPRIO to 0, which binds any process without the capability: nothing started afterwards can
take real-time priority, whoever runs it.  By default it also drops the capability from the
process's own effective and permitted sets (a render node: nothing in it may); ``this_process=False``
keeps them (the test run, whose own tests take real-time priority on purpose, in threads they reset).
Lowering is always allowed; dropping from the bounding set needs CAP_SETPCAP (root has it; a
non-root process has no capability to hand on anyway).

Concurrency: capabilities are per thread and new threads copy their creator's: call it first thing
in ``main()`` (or at test-session start), before other threads start.  Linux only; elsewhere it does
nothing.  No state.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

CAP_SYS_NICE = 23  # linux/capability.h
PR_CAPBSET_DROP = 24  # linux/prctl.h
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_LOWER = 3
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_sys_nice(libc: ctypes.CDLL, this_process: bool) -> list[str]:
    """Drop CAP_SYS_NICE from the bounding set, ambient and inheritable sets (and effective/permitted)."""
    notes = []
    if libc.prctl(PR_CAPBSET_DROP, CAP_SYS_NICE, 0, 0, 0) != 0 and os.geteuid() == 0:
        notes.append(f"bounding set kept CAP_SYS_NICE ({os.strerror(ctypes.get_errno())})")
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_LOWER, CAP_SYS_NICE, 0, 0)  # fails harmlessly on old kernels
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        return [*notes, f"capget failed ({os.strerror(ctypes.get_errno())})"]
    mask = ~(1 << CAP_SYS_NICE) & 0xFFFFFFFF  # CAP_SYS_NICE < 32: word 0
    data[0].inheritable &= mask
    if this_process:
        data[0].effective &= mask
        data[0].permitted &= mask
    if libc.capset(ctypes.byref(header), data) != 0:
        notes.append(f"capset failed ({os.strerror(ctypes.get_errno())})")
    return notes


def forbid_realtime(*, this_process: bool = True) -> list[str]:
    """Make real-time scheduling unreachable for what this process starts (and, by default, for itself);
    returns notes on what could not be done (empty when everything held)."""
    if not sys.platform.startswith("linux"):
        return []
    import resource

    notes = []
    try:
        notes += _drop_sys_nice(ctypes.CDLL(None, use_errno=True), this_process)
    except (OSError, AttributeError) as exc:  # no libc symbols (a static or unusual runtime)
        notes.append(f"capabilities untouched: {exc}")
    try:
        resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
    except (ValueError, OSError) as exc:
        notes.append(f"RLIMIT_RTPRIO kept: {exc}")
    return notes


def sys_nice_in(status_field: str, pid: int | str = "thread-self") -> bool:
    """Whether CAP_SYS_NICE is in ``status_field`` (CapEff, CapPrm, CapInh, CapBnd, CapAmb) of ``pid``
    (default: the calling thread)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(status_field + ":"):
            return bool(int(line.split()[1], 16) >> CAP_SYS_NICE & 1)
    raise ValueError(f"no {status_field} in /proc/{pid}/status")
