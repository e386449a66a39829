"""Virtual displays on a real Xvfb: start, resize, and teardown that leaves nothing behind."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest
from Xlib import display as xdisplay

from streamer.desktop.display import DisplayConfig, DisplayError, VirtualDisplay, gpu_render_env

pytestmark = [
    pytest.mark.skipif(shutil.which("Xvfb") is None, reason="Xvfb is not installed (Debian package xvfb)"),
    pytest.mark.timeout(60),
]
needs_openbox = pytest.mark.skipif(shutil.which("openbox") is None, reason="openbox is not installed")
needs_xterm = pytest.mark.skipif(shutil.which("xterm") is None, reason="xterm is not installed")


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _group_members(pgid: int) -> list[int]:
    """Live processes whose process group is ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def _assert_gone(pids: dict[str, int], number: int | None) -> None:
    for role, pid in pids.items():
        assert not _alive(pid), f"{role} (pid {pid}) still alive"
        assert _group_members(pid) == [], f"{role}'s process group still has members"
    if number is not None:
        assert not Path(f"/tmp/.X{number}-lock").exists()
        assert not Path(f"/tmp/.X11-unix/X{number}").exists()


def _socket_file(number: int) -> Path:
    return Path(f"/tmp/.X11-unix/X{number}")


def _root_size(name: str) -> tuple[int, int]:
    dpy = xdisplay.Display(name)
    try:
        geometry = dpy.screen().root.get_geometry()
        return int(geometry.width), int(geometry.height)
    finally:
        dpy.close()


@needs_openbox
@needs_xterm
async def test_start_with_wm_and_app_then_close_leaves_nothing() -> None:
    config = DisplayConfig(width=800, height=600, app=("xterm",))
    async with VirtualDisplay(config) as display:
        pids = display.pids
        number = display.number
        tmpdir = display._tmpdir
        assert set(pids) == {"xvfb", "wm", "app"}
        assert all(_alive(pid) for pid in pids.values())
        assert display.name == f":{number}"
        assert _socket_file(number).is_socket()
        assert _root_size(display.name) == (800, 600)
        assert display.app_returncode is None
        assert display.child_env()["DISPLAY"] == display.name
        assert display.timings.xvfb_ms > 0
    _assert_gone(pids, number)
    assert tmpdir is not None and not tmpdir.exists()
    await display.close()  # idempotent


async def test_two_displays_get_distinct_numbers() -> None:
    config = DisplayConfig(width=320, height=240, window_manager=None)
    first, second = VirtualDisplay(config), VirtualDisplay(config)
    try:
        await asyncio.gather(first.start(), second.start())
        assert first.number != second.number
        assert _root_size(first.name) == _root_size(second.name) == (320, 240)
    finally:
        await asyncio.gather(first.close(), second.close())
    _assert_gone({**first.pids}, first.number)
    _assert_gone({**second.pids}, second.number)


async def test_app_that_exits_early() -> None:
    config = DisplayConfig(width=320, height=240, window_manager=None, app=("sh", "-c", "exit 3"))
    async with VirtualDisplay(config) as display:
        assert await display.wait_app() == 3
        assert display.app_returncode == 3
        assert _alive(display.pids["xvfb"])  # the display outlives its app
    _assert_gone(display.pids, display.number)


async def test_app_ignoring_sigterm_and_its_children_are_killed() -> None:
    # The shell ignores SIGTERM and forks sleepers into its process group.
    script = "trap '' TERM; sleep 30 & sleep 30 & echo started; wait"
    config = DisplayConfig(width=320, height=240, window_manager=None, app=("sh", "-c", script), stop_timeout_s=0.3)
    async with VirtualDisplay(config) as display:
        app_pid = display.pids["app"]
        deadline = asyncio.get_running_loop().time() + 5
        while len(_group_members(app_pid)) < 3:  # the shell and both sleepers
            assert asyncio.get_running_loop().time() < deadline, "app children never appeared"
            await asyncio.sleep(0.01)
    _assert_gone(display.pids, display.number)


async def test_xvfb_that_cannot_start() -> None:
    display = VirtualDisplay(DisplayConfig(xvfb="/nonexistent/Xvfb", window_manager=None))
    with pytest.raises(DisplayError, match="cannot run"):
        await display.start()
    assert display.pids == {}


async def test_xvfb_that_exits_reports_its_log() -> None:
    config = DisplayConfig(width=320, height=240, window_manager=None, xvfb_args=("-no-such-option",))
    display = VirtualDisplay(config)
    with pytest.raises(DisplayError, match="Xvfb exited"):
        await display.start()
    _assert_gone(display.pids, None)


async def test_failure_halfway_stops_xvfb() -> None:
    config = DisplayConfig(width=320, height=240, window_manager=("/nonexistent/wm",))
    display = VirtualDisplay(config)
    with pytest.raises(DisplayError, match="cannot run wm"):
        await display.start()
    assert set(display.pids) == {"xvfb"}
    _assert_gone(display.pids, display.number)


async def test_wm_that_dies_during_start() -> None:
    config = DisplayConfig(width=320, height=240, window_manager=("sh", "-c", "exit 1"), app=("sleep", "30"))
    display = VirtualDisplay(config)
    with pytest.raises(DisplayError, match="window manager exited"):
        await display.start()
    assert "app" not in display.pids
    _assert_gone(display.pids, display.number)


async def test_cancelled_start_cleans_up() -> None:
    # "sleep" never announces itself as a WM: start() waits until it is cancelled.
    config = DisplayConfig(width=320, height=240, window_manager=("sleep", "30"), start_timeout_s=20)
    display = VirtualDisplay(config)
    start = asyncio.create_task(display.start())
    deadline = asyncio.get_running_loop().time() + 15
    while "wm" not in display.pids:  # cancel while start() waits for the WM
        assert asyncio.get_running_loop().time() < deadline, "the WM was never started"
        assert not start.done(), start
        await asyncio.sleep(0.01)
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    assert set(display.pids) == {"xvfb", "wm"}
    _assert_gone(display.pids, display.number)


async def test_socket_of_killed_xvfb_is_removed() -> None:
    display = VirtualDisplay(DisplayConfig(width=320, height=240, window_manager=None))
    await display.start()
    number, pid = display.number, display.pids["xvfb"]
    os.kill(pid, 9)  # no chance to clean up its own socket file
    await display._xvfb.proc.wait()  # type: ignore[union-attr]
    assert _socket_file(number).exists()
    await display.close()
    _assert_gone(display.pids, number)


async def test_resize_within_framebuffer() -> None:
    config = DisplayConfig(width=640, height=360, max_width=1280, max_height=720, window_manager=None)
    async with VirtualDisplay(config) as display:
        assert display.size == (640, 360)
        assert _root_size(display.name) == (640, 360)
        await display.resize(1280, 720)
        assert display.size == _root_size(display.name) == (1280, 720)
        await display.resize(800, 600)
        assert display.size == _root_size(display.name) == (800, 600)
        await display.resize(640, 360)  # an existing mode is reused
        assert _root_size(display.name) == (640, 360)
        with pytest.raises(DisplayError, match="framebuffer"):
            await display.resize(1920, 1080)
        assert _root_size(display.name) == (640, 360)


def test_gpu_render_env_points_gl_and_cuda_at_one_gpu() -> None:
    base = {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    env = gpu_render_env(base, 2)
    assert env == {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "2", "__GLX_VENDOR_LIBRARY_NAME": "nvidia",
                   "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "RB_GPU_INDEX": "2"}
    assert base["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"  # the node's own environment is left alone
    with pytest.raises(ValueError):
        gpu_render_env(base, -1)
