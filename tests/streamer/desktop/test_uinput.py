"""Virtual gamepads through uinput: the exact ioctl sequence and ``input_event`` bytes (a pipe stands in for
the device fd), the struct layouts and ioctl numbers against ``linux/uinput.h`` (compiled with gcc where it
exists), the desktop sink's routing, and a real pad read back from /dev/input where /dev/uinput exists."""

from __future__ import annotations

import errno
import os
import select
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from streamer.desktop import padmap as pm
from streamer.desktop import uinput as ui
from streamer.desktop.inputs import Gamepad, Key
from streamer.desktop.inputsink import XInputSink


class Device:
    """A pipe standing in for /dev/uinput: writes land in the pipe, ioctls are recorded."""

    def __init__(self, fail_setup: int | None = None) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self.calls: list[tuple[int, Any]] = []
        self.opened: list[tuple[str, int]] = []
        self.fail_setup = fail_setup

    def open(self, path: str, flags: int) -> int:
        self.opened.append((path, flags))
        return os.dup(self.write_fd)

    def ioctl(self, fd: int, request: int, arg: Any) -> Any:
        assert fd != self.write_fd and fd >= 0
        if request == ui.UI_DEV_SETUP and self.fail_setup is not None:
            raise OSError(self.fail_setup, os.strerror(self.fail_setup))
        self.calls.append((request, arg))
        return 0

    def written(self) -> bytes:
        out = b""
        while select.select([self.read_fd], [], [], 0)[0]:
            chunk = os.read(self.read_fd, 65536)
            if not chunk:
                break
            out += chunk
        return out

    def pad(self, name: str = "pad") -> ui.UinputPad:
        return ui.UinputPad(name, opener=self.open, ioctl=self.ioctl)

    def close(self) -> None:
        os.close(self.read_fd)
        os.close(self.write_fd)


@pytest.fixture
def device() -> Iterator[Device]:
    d = Device()
    yield d
    d.close()


def _event(kind: int, code: int, value: int) -> bytes:
    """One ``struct input_event`` on a 64-bit little-endian Linux, written out by hand."""
    head = bytes(16) + kind.to_bytes(2, "little") + code.to_bytes(2, "little")
    return head + value.to_bytes(4, "little", signed=True)


needs_lp64_le = pytest.mark.skipif(struct.calcsize("l") != 8 or sys.byteorder != "little",
                                   reason="the hand-written input_event bytes are for 64-bit little-endian Linux")


def test_creating_a_pad_issues_the_uinput_ioctls_in_order(device: Device) -> None:
    pad = device.pad("render-broker pad 0 (s1)")
    assert device.opened == [("/dev/uinput", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)]
    requests = [r for r, _ in device.calls]
    n_keys, n_abs = len(pm.KEYS), len(pm.ABS_RANGES)
    assert requests == ([ui.UI_SET_EVBIT] * 2 + [ui.UI_SET_KEYBIT] * n_keys + [ui.UI_SET_ABSBIT] * n_abs
                        + [ui.UI_DEV_SETUP] + [ui.UI_ABS_SETUP] * n_abs + [ui.UI_DEV_CREATE])
    args = [a for _, a in device.calls]
    assert args[:2] == [pm.EV_KEY, pm.EV_ABS]
    assert args[2:2 + n_keys] == [0x130, 0x131, 0x133, 0x134, 0x136, 0x137, 0x13A, 0x13B, 0x13C, 0x13D, 0x13E]
    assert args[2 + n_keys:2 + n_keys + n_abs] == [0x00, 0x01, 0x03, 0x04, 0x02, 0x05, 0x10, 0x11]
    setup = args[2 + n_keys + n_abs]
    assert len(setup) == 92
    bus, vendor, product, _version = struct.unpack_from("<HHHH", setup)
    assert (bus, vendor, product) == (0x03, 0x045E, 0x028E)  # USB, Microsoft, Xbox 360 pad
    assert setup[8:88].rstrip(b"\0") == b"render-broker pad 0 (s1)"
    abs_setups = {struct.unpack_from("<H", a)[0]: struct.unpack_from("<6i", a, 4) for a in args[-1 - n_abs:-1]}
    assert abs_setups[pm.ABS_X] == (0, -32768, 32767, 16, 128, 0)  # value, min, max, fuzz, flat, resolution
    assert abs_setups[pm.ABS_RZ] == (0, 0, 255, 0, 0, 0)
    assert abs_setups[pm.ABS_HAT0Y] == (0, -1, 1, 0, 0, 0)
    assert device.written() == b""  # nothing written before a state
    pad.close()


@needs_lp64_le
def test_state_changes_are_written_as_input_events_then_syn_report(device: Device) -> None:
    pad = device.pad()
    axes, buttons = (0.0, 1.0), [1.0] + [0.0] * 12 + [1.0]  # A down, left stick down, d-pad down
    assert pad.set_state(pm.map_state(axes, buttons)) == 3
    assert device.written() == (_event(1, 0x130, 1) + _event(3, 0x01, 32767) + _event(3, 0x11, 1)
                                + _event(0, 0, 0))
    assert pad.set_state(pm.map_state(axes, buttons)) == 0  # nothing changed: nothing written
    assert device.written() == b""
    pad.close()
    assert device.written() == _event(1, 0x130, 0) + _event(3, 0x01, 0) + _event(3, 0x11, 0) + _event(0, 0, 0)
    assert [r for r, _ in device.calls][-1] == ui.UI_DEV_DESTROY
    calls = len(device.calls)
    pad.close()  # idempotent
    assert len(device.calls) == calls and pad.set_state(pm.map_state((1.0,), ())) == 0


def test_a_kernel_without_ui_dev_setup_gets_the_legacy_uinput_user_dev_write() -> None:
    d = Device(fail_setup=errno.EINVAL)
    try:
        pad = d.pad("old kernel")
        requests = [r for r, _ in d.calls]
        assert ui.UI_ABS_SETUP not in requests and requests[-1] == ui.UI_DEV_CREATE
        record = d.written()
        assert len(record) == ui.UINPUT_USER_DEV.size == 1116
        fields = ui.UINPUT_USER_DEV.unpack(record)
        assert fields[0].rstrip(b"\0") == b"old kernel" and fields[1:4] == (0x03, 0x045E, 0x028E)
        absmax, absmin = fields[6:6 + 64], fields[6 + 64:6 + 128]
        assert (absmin[pm.ABS_X], absmax[pm.ABS_X]) == (-32768, 32767)
        assert (absmin[pm.ABS_Z], absmax[pm.ABS_Z]) == (0, 255)
        pad.close()
    finally:
        d.close()


def test_a_failed_create_closes_the_fd_and_raises() -> None:
    d = Device(fail_setup=errno.EPERM)
    opened: list[int] = []

    def opener(path: str, flags: int) -> int:
        opened.append(d.open(path, flags))
        return opened[-1]

    try:
        with pytest.raises(PermissionError):
            ui.UinputPad("x", opener=opener, ioctl=d.ioctl)
        with pytest.raises(OSError):
            os.fstat(opened[0])  # closed
    finally:
        d.close()


def test_probe_names_why_there_are_no_pads(tmp_path: Path) -> None:
    assert ui.probe_uinput(str(tmp_path / "uinput")) == (
        f"no {tmp_path / 'uinput'} (load the uinput kernel module; in a container, mount the host's "
        f"{tmp_path / 'uinput'})")
    (tmp_path / "file").write_text("")
    assert ui.probe_uinput(str(tmp_path / "file")) == f"{tmp_path / 'file'} is not a character device"

    def denied(path: str, flags: int) -> int:
        raise PermissionError(errno.EACCES, "Permission denied")

    why = ui.probe_uinput("/dev/null", opener=denied)
    assert why is not None and why.startswith("cannot open /dev/null: Permission denied (see docs/operations.md")
    assert ui.probe_uinput("/dev/null") is None  # a character device this process can open
    assert ui.gamepad_capability(None)["ok"] is True
    assert ui.gamepad_capability("no /dev/uinput") == {"ok": False, "reason": "no /dev/uinput"}


def test_padset_makes_pads_lazily_per_index_and_releases_them(device: Device) -> None:
    made: list[str] = []

    def factory(name: str) -> ui.UinputPad:
        made.append(name)
        return device.pad(name)

    pads = ui.PadSet("s9", factory=factory)
    pads.apply(Gamepad(2, (), (0.0,) * 17))  # a neutral state (a disconnect) makes no pad
    assert made == []
    pads.apply(Gamepad(2, (), (1.0,)))
    pads.apply(Gamepad(2, (), (1.0, 1.0)))
    pads.apply(Gamepad(0, (-1.0,), ()))
    assert made == ["render-broker pad 2 (s9)", "render-broker pad 0 (s9)"]
    assert pads.pads[2].state[(pm.EV_KEY, pm.BTN_EAST)] == 1
    device.written()
    pads.release_all()  # the viewer left: every button up, every stick centred, the pads kept
    assert all(set(p.state.values()) == {0} for p in pads.pads.values()) and len(pads.pads) == 2
    assert len(device.written()) == 24 * (2 + 1 + 1 + 1)  # pad 2: A, B, SYN; pad 0: X axis, SYN
    pads.close()
    assert pads.pads == {} and [r for r, _ in device.calls].count(ui.UI_DEV_DESTROY) == 2


def test_padset_drops_input_after_a_pad_cannot_be_made(caplog: pytest.LogCaptureFixture) -> None:
    def factory(name: str) -> ui.UinputPad:
        raise PermissionError(errno.EACCES, "Permission denied", "/dev/uinput")

    pads = ui.PadSet("s3", factory=factory)
    pads.apply(Gamepad(0, (), (1.0,)))
    pads.apply(Gamepad(1, (), (1.0,)))
    assert pads.failure is not None and "Permission denied" in pads.failure and pads.dropped == 2
    assert sum("gamepad input dropped" in r.message for r in caplog.records) == 1  # said once


class FakeInjector:
    def __init__(self) -> None:
        self.events: list[Any] = []
        self.released = 0
        self.closed = False

    def inject(self, event: Any) -> None:
        self.events.append(event)

    def release_all(self) -> None:
        self.released += 1

    def close(self) -> None:
        self.closed = True


def test_the_desktop_sink_routes_pads_to_uinput_and_releases_and_destroys_them(device: Device) -> None:
    injector = FakeInjector()
    pads = ui.PadSet("s1", factory=device.pad)
    sink = XInputSink(injector, ThreadPoolExecutor(1), pads)  # type: ignore[arg-type]
    sink.submit(Gamepad(0, (), (1.0,)))
    sink.submit(Key("KeyA", 0x61, True))
    sink.release_all()
    sink.close()
    assert injector.events == [Key("KeyA", 0x61, True)] and injector.released == 1 and injector.closed
    assert sink.skipped == 0 and pads.pads == {}
    requests = [r for r, _ in device.calls]
    assert requests.count(ui.UI_DEV_CREATE) == 1 and requests[-1] == ui.UI_DEV_DESTROY
    assert len(device.written()) == 24 * 4  # A down + SYN, released (A up + SYN); the destroy had nothing held


def test_without_uinput_the_desktop_sink_counts_and_drops_pads() -> None:
    injector = FakeInjector()
    sink = XInputSink(injector, ThreadPoolExecutor(1))  # type: ignore[arg-type]
    sink.submit(Gamepad(0, (), (1.0,)))
    sink.close()
    assert sink.skipped == 1 and injector.events == []


C_LAYOUT = r"""
#include <stdio.h>
#include <linux/input.h>
#include <linux/uinput.h>
int main(void) {
    printf("%zu %zu %zu %zu %zu\n", sizeof(struct input_event), sizeof(struct input_id),
           sizeof(struct uinput_setup), sizeof(struct uinput_abs_setup), sizeof(struct uinput_user_dev));
    printf("%lu %lu %lu %lu %lu %lu %lu %lu\n", (unsigned long)UI_DEV_CREATE, (unsigned long)UI_DEV_DESTROY,
           (unsigned long)UI_DEV_SETUP, (unsigned long)UI_ABS_SETUP, (unsigned long)UI_SET_EVBIT,
           (unsigned long)UI_SET_KEYBIT, (unsigned long)UI_SET_ABSBIT, (unsigned long)UI_GET_SYSNAME(64));
    printf("%d %d %d %d %d %d %d %d %d\n", BTN_SOUTH, BTN_EAST, BTN_NORTH, BTN_WEST, BTN_MODE, BTN_THUMBR,
           ABS_RZ, ABS_HAT0Y, ABS_CNT);
    return 0;
}
"""


def test_struct_layouts_and_ioctl_numbers_match_linux_uinput_h(tmp_path: Path) -> None:
    gcc = shutil.which("gcc")
    if gcc is None or not Path("/usr/include/linux/uinput.h").exists():
        pytest.skip("no gcc or no /usr/include/linux/uinput.h (linux-libc-dev) to compare the layouts with")
    (tmp_path / "layout.c").write_text(C_LAYOUT)
    subprocess.run([gcc, "-o", str(tmp_path / "layout"), str(tmp_path / "layout.c")], check=True, timeout=60)
    lines = subprocess.run([str(tmp_path / "layout")], capture_output=True, text=True, check=True,
                           timeout=10).stdout.split("\n")
    sizes, ioctls, codes = ([int(x) for x in line.split()] for line in lines[:3])
    assert sizes == [ui.INPUT_EVENT.size, ui.INPUT_ID.size, ui.UINPUT_SETUP.size, ui.UINPUT_ABS_SETUP.size,
                     ui.UINPUT_USER_DEV.size]
    assert ioctls == [ui.UI_DEV_CREATE, ui.UI_DEV_DESTROY, ui.UI_DEV_SETUP, ui.UI_ABS_SETUP, ui.UI_SET_EVBIT,
                      ui.UI_SET_KEYBIT, ui.UI_SET_ABSBIT, ui.UI_GET_SYSNAME]
    assert codes == [pm.BTN_SOUTH, pm.BTN_EAST, pm.BTN_NORTH, pm.BTN_WEST, pm.BTN_MODE, pm.BTN_THUMBR, pm.ABS_RZ,
                     pm.ABS_HAT0Y, ui.ABS_CNT]


def test_a_real_virtual_pad_reports_its_events_through_dev_input() -> None:
    missing = ui.probe_uinput()
    if missing is not None:
        pytest.skip(missing)
    pad = ui.UinputPad("render-broker test pad")
    try:
        sysfs = Path("/sys/devices/virtual/input") / pad.sysname()
        deadline = time.monotonic() + 5
        nodes: list[Path] = []
        while not nodes and time.monotonic() < deadline:
            nodes = sorted(sysfs.glob("event*"))
            time.sleep(0.05)
        assert nodes, f"no event node under {sysfs}"
        dev = Path("/dev/input") / nodes[0].name
        while not dev.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            fd = os.open(dev, os.O_RDONLY | os.O_NONBLOCK)
        except PermissionError as exc:
            pytest.skip(f"cannot read {dev} (not in its group): {exc}")
        try:
            assert (sysfs / "name").read_text().strip() == "render-broker test pad"
            pad.set_state(pm.map_state((0.0, -1.0), (1.0,)))
            got: list[tuple[int, int, int]] = []
            while len(got) < 3 and time.monotonic() < deadline:
                if select.select([fd], [], [], 0.5)[0]:
                    data = os.read(fd, ui.INPUT_EVENT.size * 16)
                    for off in range(0, len(data), ui.INPUT_EVENT.size):
                        _s, _us, kind, code, value = ui.INPUT_EVENT.unpack_from(data, off)
                        got.append((kind, code, value))
            assert got[:3] == [(pm.EV_KEY, pm.BTN_SOUTH, 1), (pm.EV_ABS, pm.ABS_Y, pm.STICK_MIN),
                               (pm.EV_SYN, pm.SYN_REPORT, 0)]
        finally:
            os.close(fd)
    finally:
        pad.close()
