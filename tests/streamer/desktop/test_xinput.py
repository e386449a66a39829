"""XTEST injection into a real Xvfb: typing into xterm, pointer, buttons, wheel, keys, clipboard."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from Xlib import X
from Xlib import display as xdisplay

from streamer.desktop.display import DisplayConfig, VirtualDisplay
from streamer.desktop.inputs import (
    KEYSYMS,
    Gamepad,
    InputEvent,
    Ping,
    PointerMove,
    PointerRelative,
    Resize,
    parse_input,
)
from streamer.desktop.xinput import InjectError, XInjector
from tests.streamer.viewer import until

pytestmark = [
    pytest.mark.skipif(shutil.which("Xvfb") is None, reason="Xvfb is not installed (Debian package xvfb)"),
    pytest.mark.timeout(60),
]
DEADLINE_S = 15.0  # generous upper bound for things that normally take well under a second


def _event(raw: str) -> InputEvent:
    event = parse_input(raw)
    assert not hasattr(event, "reason"), event
    return event  # type: ignore[return-value]


def _key(code: str, down: bool) -> InputEvent:
    return _event(f'{{"t":"k","c":"{code}","d":{"true" if down else "false"}}}')


# Characters of a shell command -> (KeyboardEvent.code, needs shift) on a US layout.
_CHARS = {
    " ": ("Space", False),
    ">": ("Period", True),
    "/": ("Slash", False),
    ".": ("Period", False),
    "-": ("Minus", False),
    "_": ("Minus", True),
    "\n": ("Enter", False),
}


def _type_text(injector: XInjector, text: str) -> None:
    for char in text:
        if char.isalpha():
            code, shift = f"Key{char.upper()}", char.isupper()
        elif char.isdigit():
            code, shift = f"Digit{char}", False
        else:
            code, shift = _CHARS[char]
        if shift:
            assert injector.inject(_key("ShiftLeft", True))
        assert injector.inject(_key(code, True))
        assert injector.inject(_key(code, False))
        if shift:
            assert injector.inject(_key("ShiftLeft", False))


@pytest.fixture
async def bare_display() -> AsyncIterator[VirtualDisplay]:
    """800x600 (framebuffer up to 1280x720), no WM, no app."""
    config = DisplayConfig(width=800, height=600, max_width=1280, max_height=720, window_manager=None)
    async with VirtualDisplay(config) as d:
        yield d


@pytest.fixture
def injector(bare_display: VirtualDisplay) -> Iterator[XInjector]:
    with XInjector(bare_display.name) as inj:
        yield inj


@pytest.fixture
def observer(bare_display: VirtualDisplay) -> Iterator[xdisplay.Display]:
    """A second client, as an app would be: a full-screen window listening for pointer events."""
    dpy = xdisplay.Display(bare_display.name)
    screen = dpy.screen()
    window = screen.root.create_window(
        0,
        0,
        800,
        600,
        0,
        screen.root_depth,
        X.InputOutput,
        X.CopyFromParent,
        event_mask=X.ButtonPressMask | X.ButtonReleaseMask,
        override_redirect=True,
    )
    window.map()
    dpy.sync()
    yield dpy
    dpy.close()


def _button_events(dpy: xdisplay.Display, count: int) -> list[tuple[str, int]]:
    """The next ``count`` button events as ("press"|"release", X button), waiting with a deadline."""
    events: list[tuple[str, int]] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(events) < count:
        if not dpy.pending_events():
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"only {events} arrived"
            select.select([dpy], [], [], remaining)
            continue
        event = dpy.next_event()
        if event.type in (X.ButtonPress, X.ButtonRelease):
            events.append(("press" if event.type == X.ButtonPress else "release", event.detail))
    return events


def _pointer(name: str) -> tuple[int, int]:
    dpy = xdisplay.Display(name)
    try:
        reply = dpy.screen().root.query_pointer()
        return int(reply.root_x), int(reply.root_y)
    finally:
        dpy.close()


def test_pointer_move_scales_to_the_screen(bare_display: VirtualDisplay, injector: XInjector) -> None:
    assert injector.inject(PointerMove(0.25, 0.75))
    injector.sync()
    assert _pointer(bare_display.name) == (200, 450)
    injector.move(1.0, 1.0)
    injector.sync()
    assert _pointer(bare_display.name) == (799, 599)
    injector.move(0.0, 0.0)
    injector.sync()
    assert _pointer(bare_display.name) == (0, 0)


def test_relative_motion_moves_from_the_pointer_and_stops_at_the_edges(
    bare_display: VirtualDisplay, injector: XInjector
) -> None:
    injector.move(0.5, 0.5)
    assert injector.inject(PointerRelative(30, -20))
    injector.sync()
    assert _pointer(bare_display.name) == (430, 280)
    assert injector.inject(PointerRelative(-7, 5))
    injector.sync()
    assert _pointer(bare_display.name) == (423, 285)
    injector.move_relative(-4096, 4096)  # the server clamps to the screen, as with a real mouse
    injector.sync()
    assert _pointer(bare_display.name) == (0, 599)
    assert injector.stats().injected["move_relative"] == 3


@pytest.mark.skipif(shutil.which("xdotool") is None, reason="xdotool is not installed")
def test_pointer_agrees_with_xdotool(bare_display: VirtualDisplay, injector: XInjector) -> None:
    injector.move(0.5, 0.1)
    injector.sync()
    out = subprocess.run(
        ["xdotool", "getmouselocation", "--shell"],
        env={"DISPLAY": bare_display.name},
        capture_output=True,
        text=True,
        check=True,
        timeout=DEADLINE_S,
    ).stdout
    fields = dict(line.split("=", 1) for line in out.split())
    assert (int(fields["X"]), int(fields["Y"])) == (400, 60)


async def test_pointer_follows_a_resize(bare_display: VirtualDisplay, injector: XInjector) -> None:
    assert injector.size == (800, 600)
    await bare_display.resize(1280, 720)
    injector.sync()  # the root ConfigureNotify is in our queue once the round trip returns
    assert injector.size == (1280, 720)
    injector.move(0.5, 0.5)
    injector.sync()
    assert _pointer(bare_display.name) == (640, 360)


def test_buttons_and_wheel_reach_a_window(injector: XInjector, observer: xdisplay.Display) -> None:
    injector.move(0.5, 0.5)
    assert injector.inject(_event('{"t":"pb","b":1,"d":true}'))
    assert injector.inject(_event('{"t":"pb","b":1,"d":false}'))
    assert injector.inject(_event('{"t":"pb","b":3,"d":true}'))
    assert injector.inject(_event('{"t":"pb","b":3,"d":false}'))
    assert injector.inject(_event('{"t":"pb","b":4,"d":true}'))  # browser "back" -> X button 8
    assert injector.inject(_event('{"t":"pb","b":4,"d":false}'))
    injector.sync()
    assert _button_events(observer, 6) == [
        ("press", 1), ("release", 1), ("press", 3), ("release", 3), ("press", 8), ("release", 8),
    ]  # fmt: skip
    assert injector.inject(_event('{"t":"pw","dx":0,"dy":2.5}'))  # 2 notches down, 0.5 carried
    assert injector.inject(_event('{"t":"pw","dx":0,"dy":0.5}'))  # the carried half completes a third
    assert injector.inject(_event('{"t":"pw","dx":-1,"dy":-1}'))  # one up, one left
    injector.sync()
    events = _button_events(observer, 10)
    presses = [button for kind, button in events if kind == "press"]
    assert presses == [5, 5, 5, 4, 6]
    assert injector.stats().injected == {"move": 1, "button": 6, "wheel": 3}


def test_release_all_releases_held_keys_and_buttons(bare_display: VirtualDisplay, injector: XInjector) -> None:
    assert injector.key(KEYSYMS["ShiftLeft"], True)
    assert injector.button(1, True)
    injector.sync()
    probe = xdisplay.Display(bare_display.name)
    try:
        shift = probe.keysym_to_keycode(KEYSYMS["ShiftLeft"])

        def shift_down() -> bool:
            keymap = probe.query_keymap()
            return bool(keymap[shift // 8] & (1 << (shift % 8)))

        def button1_down() -> bool:
            return bool(probe.screen().root.query_pointer().mask & X.Button1Mask)

        assert shift_down() and button1_down()
        injector.release_all()
        injector.sync()
        assert not shift_down() and not button1_down()
    finally:
        probe.close()


def test_every_mapped_key_has_a_keycode(bare_display: VirtualDisplay) -> None:
    dpy = xdisplay.Display(bare_display.name)
    try:
        missing = [code for code, keysym in KEYSYMS.items() if not dpy.keysym_to_keycode(keysym)]
    finally:
        dpy.close()
    assert missing == []


def test_server_autorepeat_is_off_by_default(bare_display: VirtualDisplay) -> None:
    dpy = xdisplay.Display(bare_display.name)
    try:
        assert dpy.get_keyboard_control().global_auto_repeat == X.AutoRepeatModeOn
        with XInjector(bare_display.name):
            assert dpy.get_keyboard_control().global_auto_repeat == X.AutoRepeatModeOff
    finally:
        dpy.close()


def test_non_x_events_are_not_injected(injector: XInjector) -> None:
    assert not injector.inject(Gamepad(0, (0.5,), ()))
    assert not injector.inject(Ping(1, 2.0))
    assert not injector.inject(Resize(800, 600))
    assert not injector.button(7, True)  # no such viewer button
    assert not injector.key(0x1000000 + 0x10FFFF, True)  # a keysym no key produces
    assert injector.stats().skipped == {
        "not_x_input:gp": 1,
        "not_x_input:ping": 1,
        "not_x_input:rs": 1,
        "unknown_button": 1,
        "unmapped_keysym": 1,
    }


def test_missing_display_raises() -> None:
    with pytest.raises(InjectError):
        XInjector(":4000")


def test_closed_injector_refuses(injector: XInjector) -> None:
    injector.close()
    injector.close()  # idempotent
    with pytest.raises(InjectError):
        injector.inject(PointerMove(0.5, 0.5))


def _xclip_processes(display_name: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except (FileNotFoundError, PermissionError, ProcessLookupError, NotADirectoryError):
            continue
        if b"xclip" in cmdline.split(b"\0")[0] and f"DISPLAY={display_name}".encode() in environ.split(b"\0"):
            pids.append(int(entry.name))
    return pids


@pytest.mark.skipif(shutil.which("xclip") is None, reason="xclip is not installed (Debian package xclip)")
async def test_clipboard_set_and_xclip_goes_with_the_display() -> None:
    config = DisplayConfig(width=320, height=240, window_manager=None)
    async with VirtualDisplay(config) as display:
        injector = XInjector(display.name)
        try:
            assert injector.can_set_clipboard
            text = "héllo wörld 😀\nline two"
            event = _event(json.dumps({"t": "cb", "text": text}))
            assert await asyncio.to_thread(injector.inject, event)
            out = await asyncio.to_thread(
                subprocess.run,
                ["xclip", "-o", "-selection", "clipboard"],
                env={"DISPLAY": display.name},
                capture_output=True,
                check=True,
                timeout=DEADLINE_S,
            )
            assert out.stdout.decode() == text
            assert _xclip_processes(display.name)  # the selection server xclip forked
        finally:
            injector.close()
    # It exits when its X connection drops.
    await until(lambda: not _xclip_processes(display.name), "xclip outlived its display")


@pytest.mark.skipif(
    shutil.which("xterm") is None or shutil.which("openbox") is None, reason="xterm and openbox are needed"
)
async def test_typing_into_xterm_runs_a_command(tmp_path: Path) -> None:
    target = tmp_path / "typed_hello.txt"
    ready = tmp_path / "shell_ready"
    # The interactive shell itself writes the marker (POSIX sh sources $ENV at start-up, after it
    # has set up the pty): keys typed before that may be flushed, so typing waits for it.
    rc = tmp_path / "shrc"
    rc.write_text(f"touch {ready}\n")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "SHELL": "/bin/sh",
           "ENV": str(rc)}
    app = ("xterm", "-e", "sh", "-i")
    config = DisplayConfig(width=800, height=600, app=app, env=env)
    async with VirtualDisplay(config) as display:
        await until(lambda: ready.exists(), "the shell in xterm never started")
        await asyncio.to_thread(_wait_for_xterm_focus, display.name)
        injector = XInjector(display.name)
        try:
            # Rarely (about 1 run in 20 here) the first keys typed right after xterm took the focus
            # never reach the shell, even with the marker written by the shell itself: type the
            # line again (a leading newline ends any partial line) before calling it lost.
            for _attempt in range(3):
                await asyncio.to_thread(_type_text, injector, f"\necho hello > {target}\n")
                with contextlib.suppress(AssertionError):
                    await until(lambda: _read(target) == "hello\n", "", deadline_s=3.0)
                    break
        finally:
            injector.close()
        await until(lambda: _read(target) == "hello\n", "the typed command never ran")


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def _wait_for_xterm_focus(name: str) -> None:
    """Poll (with a deadline) until the input focus is in a window of class xterm."""
    dpy = xdisplay.Display(name)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            window = dpy.get_input_focus().focus
            while isinstance(window, type(dpy.screen().root)) and window != dpy.screen().root:
                wm_class = window.get_wm_class()
                if wm_class and "xterm" in (c.lower() for c in wm_class):
                    return
                window = window.query_tree().parent
            assert time.monotonic() < deadline, "xterm never got the focus"
            time.sleep(0.02)
    finally:
        dpy.close()
