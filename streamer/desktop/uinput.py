"""Virtual Xbox-360-like gamepads for desktop sessions, through the Linux uinput API.

Job: ``probe_uinput`` says whether this node can make virtual input devices (None) or why not;
``UinputPad`` is one virtual pad (``/dev/uinput`` opened, capabilities declared with
``UI_SET_EVBIT``/``UI_SET_KEYBIT``/``UI_SET_ABSBIT``, described with ``UI_DEV_SETUP`` +
``UI_ABS_SETUP`` -- or, on kernels before 4.5, the legacy ``uinput_user_dev`` write -- then
``UI_DEV_CREATE``; state changes written as ``input_event`` records closed by a ``SYN_REPORT``;
``UI_DEV_DESTROY`` on close); ``PadSet`` holds a session's pads, one per viewer pad index, made on
first use, and turns each ``Gamepad`` state into the events that differ (``streamer.desktop.padmap``).

Only ``fcntl.ioctl`` and ``struct``: no new dependency.  The ioctl numbers are computed with the
generic ``_IOC`` encoding (x86, arm, arm64, riscv); ``tests/streamer/desktop/test_uinput.py`` compares
them and the struct sizes with a C program built against ``linux/uinput.h`` where gcc exists.

Concurrency model: not thread-safe; ``streamer.desktop.inputsink.XInputSink`` calls it from its one
input thread only.  Invariants: a pad that fails to be made disables the set (logged once, later
states dropped); ``release_all`` sends every pad to neutral (buttons up, sticks centred) and keeps
it; ``close`` destroys every pad and is idempotent.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import struct
from collections.abc import Callable
from typing import Any, Final

from streamer.desktop.inputs import Gamepad
from streamer.desktop.padmap import (
    ABS_RANGES,
    EV_ABS,
    EV_KEY,
    EV_SYN,
    KEYS,
    SYN_REPORT,
    PadEvent,
    PadState,
    diff,
    map_state,
    neutral,
)

log = logging.getLogger(__name__)

UINPUT_PATH: Final = "/dev/uinput"

# asm-generic/ioctl.h
_IOC_NONE, _IOC_WRITE, _IOC_READ = 0, 1, 2


def _ioc(direction: int, nr: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (ord("U") << 8) | nr


# linux/input.h and linux/uinput.h layouts (native alignment)
INPUT_EVENT: Final = struct.Struct("@llHHi")  # struct timeval {long sec, usec}; __u16 type, code; __s32 value
INPUT_ID: Final = struct.Struct("@HHHH")  # bustype, vendor, product, version
UINPUT_SETUP: Final = struct.Struct("@HHHH80sI")  # struct input_id; char name[80]; __u32 ff_effects_max
UINPUT_ABS_SETUP: Final = struct.Struct("@HH6i")  # __u16 code; (pad); struct input_absinfo (6 x __s32)
ABS_CNT: Final = 0x40
UINPUT_USER_DEV: Final = struct.Struct(f"@80sHHHHI{4 * ABS_CNT}i")  # legacy: name, id, ff, absmax/min/fuzz/flat

UI_DEV_CREATE: Final = _ioc(_IOC_NONE, 1, 0)
UI_DEV_DESTROY: Final = _ioc(_IOC_NONE, 2, 0)
UI_DEV_SETUP: Final = _ioc(_IOC_WRITE, 3, UINPUT_SETUP.size)
UI_ABS_SETUP: Final = _ioc(_IOC_WRITE, 4, UINPUT_ABS_SETUP.size)
UI_SET_EVBIT: Final = _ioc(_IOC_WRITE, 100, 4)
UI_SET_KEYBIT: Final = _ioc(_IOC_WRITE, 101, 4)
UI_SET_ABSBIT: Final = _ioc(_IOC_WRITE, 103, 4)
SYSNAME_LEN: Final = 64
UI_GET_SYSNAME: Final = _ioc(_IOC_READ, 44, SYSNAME_LEN)

BUS_USB: Final = 0x03
XBOX360_VENDOR: Final = 0x045E
XBOX360_PRODUCT: Final = 0x028E
XBOX360_VERSION: Final = 0x0110

Ioctl = Callable[[int, int, Any], Any]  # fcntl.ioctl's shape
Opener = Callable[[str, int], int]


def probe_uinput(path: str = UINPUT_PATH, *, opener: Opener = os.open) -> str | None:
    """None if this process can make virtual input devices through ``path``, else why not (one sentence)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"no {path} (load the uinput kernel module; in a container, mount the host's {path})"
    except OSError as exc:
        return f"cannot stat {path}: {exc.strerror}"
    if not stat.S_ISCHR(st.st_mode):
        return f"{path} is not a character device"
    try:
        fd = opener(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        hint = " (see docs/operations.md: udev rule or group for the node's user)" if exc.errno == errno.EACCES else ""
        return f"cannot open {path}: {exc.strerror}{hint}"
    os.close(fd)
    return None


def gamepad_capability(missing: str | None) -> dict[str, Any]:
    """``/healthz``'s ``capabilities.gamepad`` from ``probe_uinput()``'s answer (pure)."""
    if missing is None:
        return {"ok": True, "reason": "virtual gamepads through /dev/uinput for desktop sessions"}
    return {"ok": False, "reason": missing}


def event_bytes(events: list[PadEvent]) -> bytes:
    """``input_event`` records for ``events`` then a ``SYN_REPORT`` (time 0: the kernel stamps them)."""
    out = [INPUT_EVENT.pack(0, 0, kind, code, value) for kind, code, value in events]
    out.append(INPUT_EVENT.pack(0, 0, EV_SYN, SYN_REPORT, 0))
    return b"".join(out)


class UinputPad:
    """One virtual Xbox-360-like pad; made in the constructor (blocking, raises ``OSError``)."""

    def __init__(self, name: str, *, path: str = UINPUT_PATH, opener: Opener = os.open,
                 ioctl: Ioctl = fcntl.ioctl) -> None:
        self.name = name
        self._ioctl = ioctl
        self._fd: int | None = opener(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            self._create()
        except BaseException:
            os.close(self._fd)
            self._fd = None
            raise
        self.state: PadState = neutral()

    def _create(self) -> None:
        fd = self._fd
        assert fd is not None
        for ev in (EV_KEY, EV_ABS):
            self._ioctl(fd, UI_SET_EVBIT, ev)
        for code in KEYS:
            self._ioctl(fd, UI_SET_KEYBIT, code)
        for code in ABS_RANGES:
            self._ioctl(fd, UI_SET_ABSBIT, code)
        name = self.name.encode()[:79]
        try:
            self._ioctl(fd, UI_DEV_SETUP, UINPUT_SETUP.pack(BUS_USB, XBOX360_VENDOR, XBOX360_PRODUCT,
                                                            XBOX360_VERSION, name, 0))
            for code, (lo, hi, fuzz, flat) in ABS_RANGES.items():
                self._ioctl(fd, UI_ABS_SETUP, UINPUT_ABS_SETUP.pack(code, 0, 0, lo, hi, fuzz, flat, 0))
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOTTY):
                raise
            os.write(fd, self.legacy_setup(name))  # a kernel before 4.5: no UI_DEV_SETUP
        self._ioctl(fd, UI_DEV_CREATE, 0)

    @staticmethod
    def legacy_setup(name: bytes) -> bytes:
        """The ``uinput_user_dev`` record kernels before 4.5 read instead of UI_DEV_SETUP/UI_ABS_SETUP."""
        absmax, absmin, absfuzz, absflat = ([0] * ABS_CNT for _ in range(4))
        for code, (lo, hi, fuzz, flat) in ABS_RANGES.items():
            absmin[code], absmax[code], absfuzz[code], absflat[code] = lo, hi, fuzz, flat
        return UINPUT_USER_DEV.pack(name, BUS_USB, XBOX360_VENDOR, XBOX360_PRODUCT, XBOX360_VERSION, 0,
                                    *absmax, *absmin, *absfuzz, *absflat)

    def sysname(self) -> str:
        """The kernel's name of the device (``inputN``: /sys/devices/virtual/input/inputN/eventM)."""
        assert self._fd is not None
        raw = self._ioctl(self._fd, UI_GET_SYSNAME, bytes(SYSNAME_LEN))
        assert isinstance(raw, bytes)
        return raw.split(b"\0", 1)[0].decode()

    def set_state(self, state: PadState) -> int:
        """Move the pad to ``state``: write what changed, then SYN_REPORT; returns the events written."""
        if self._fd is None:
            return 0
        events = diff(self.state, state)
        if events:
            os.write(self._fd, event_bytes(events))
            self.state = state
        return len(events)

    def close(self) -> None:
        """Release everything, destroy the device, close the fd; idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            events = diff(self.state, neutral())
            if events:
                os.write(fd, event_bytes(events))
            self._ioctl(fd, UI_DEV_DESTROY, 0)
        except OSError as exc:
            log.warning("gamepad %s: destroying the device failed: %s", self.name, exc)
        finally:
            os.close(fd)


class PadSet:
    """A session's virtual pads, one per viewer pad index, made on first use."""

    def __init__(self, session: str, *, factory: Callable[[str], UinputPad] = UinputPad) -> None:
        self._session = session
        self._factory = factory
        self.pads: dict[int, UinputPad] = {}
        self.failure: str | None = None  # why pads could not be made (then every state is dropped)
        self.dropped = 0

    def apply(self, event: Gamepad) -> None:
        if self.failure is not None:
            self.dropped += 1
            return
        state = map_state(event.axes, event.buttons)
        pad = self.pads.get(event.index)
        if pad is None:
            if state == neutral():
                return  # a disconnect's neutral state for a pad never made
            try:
                pad = self._factory(f"render-broker pad {event.index} ({self._session})")
            except OSError as exc:
                self.failure = f"cannot make a virtual gamepad: {exc}"
                log.warning("session %s: %s; gamepad input dropped", self._session, self.failure)
                self.dropped += 1
                return
            self.pads[event.index] = pad
        pad.set_state(state)

    def release_all(self) -> None:
        """The viewer left: every pad to neutral (kept for the next viewer)."""
        for pad in self.pads.values():
            pad.set_state(neutral())

    def close(self) -> None:
        pads, self.pads = self.pads, {}
        for pad in pads.values():
            pad.close()
