"""XTEST injection into a real Xvfb: typing into xterm, pointer, buttons, wheel, keys, clipboard."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import shutil
import subprocess
import threading
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
from streamer.desktop.xinput import TEXT_BURST_CHARS, TEXT_RATE_CHARS_S, InjectError, XInjector, keysym_for_char
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


@pytest.fixture
def typist(bare_display: VirtualDisplay) -> Iterator[xdisplay.Display]:
    """A second client with keyboard focus: a window recording key presses (as an app reads them)."""
    dpy = xdisplay.Display(bare_display.name)
    screen = dpy.screen()
    window = screen.root.create_window(0, 0, 200, 100, 0, screen.root_depth, X.InputOutput, X.CopyFromParent,
                                       event_mask=X.KeyPressMask, override_redirect=True)
    window.map()
    window.set_input_focus(X.RevertToParent, X.CurrentTime)
    dpy.sync()
    yield dpy
    dpy.close()


def _typed(dpy: xdisplay.Display, count: int) -> str:
    """The next ``count`` key presses as characters, read with the keymap of the moment (MappingNotify)."""
    chars = ""
    deadline = time.monotonic() + DEADLINE_S
    while len(chars) < count:
        if not dpy.pending_events():
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"only {chars!r} arrived"
            select.select([dpy], [], [], remaining)
            continue
        event = dpy.next_event()
        if event.type == X.MappingNotify:
            dpy.refresh_keyboard_mapping(event)
        elif event.type == X.KeyPress:
            keysym = dpy.keycode_to_keysym(event.detail, 1 if event.state & X.ShiftMask else 0)
            if keysym in (0xFFE1, 0xFFE2):  # Shift itself
                continue
            assert keysym, f"key {event.detail} had no keysym when it was read"
            chars += chr(keysym - 0x01000000 if keysym > 0x01000000 else keysym)
    return chars


def test_text_types_characters_the_keymap_lacks(bare_display: VirtualDisplay, typist: xdisplay.Display) -> None:
    with XInjector(bare_display.name) as injector:
        assert injector.spare_keycodes >= 8
        assert injector.inject(_event(json.dumps({"t": "tx", "text": "é€ßあ😀"})))
        # Shift held (a key the viewer pressed) changes nothing; a repeated character reuses its keycode
        assert injector.key(KEYSYMS["ShiftLeft"], True)
        assert injector.inject(_event('{"t":"tx","text":"éa"}'))
        assert injector.key(KEYSYMS["ShiftLeft"], False)
        assert injector.key(KEYSYMS["KeyB"], True)  # an ordinary key still types its own letter
        injector.sync()
        assert _typed(typist, 8) == "é€ßあ😀éab"
        assert injector.stats().injected == {"text": 2, "key": 3}
    # close() gives the spare keycodes back: the keymap has none of the typed keysyms
    probe = xdisplay.Display(bare_display.name)
    try:
        assert [c for c in "é€ßあ😀" if probe.keysym_to_keycode(keysym_for_char(c))] == []
    finally:
        probe.close()


def test_text_lifts_held_modifiers_and_rebinds_the_oldest_key(
    bare_display: VirtualDisplay, typist: xdisplay.Display
) -> None:
    with XInjector(bare_display.name) as injector:
        assert injector.key(KEYSYMS["ControlLeft"], True)
        assert injector.type_text("ü")
        injector.sync()
        presses = []  # Control's own press, the character, Control pressed again
        while len(presses) < 3:
            event = typist.next_event()
            if event.type == X.MappingNotify:
                typist.refresh_keyboard_mapping(event)
            elif event.type == X.KeyPress:
                presses.append((typist.keycode_to_keysym(event.detail, 0), event.state & X.ControlMask))
        assert presses[1] == (keysym_for_char("ü"), 0), "the character was typed with Control held"
        assert presses[2] == (KEYSYMS["ControlLeft"], 0)  # still held for the viewer's next shortcut
        assert injector.key(KEYSYMS["ControlLeft"], False)
        # more distinct characters than spare keycodes: the least recently used binding is reused
        chars = "".join(chr(0x4E00 + i) for i in range(injector.spare_keycodes + 3))
        # typed while the app reads, as a real one does (a press read after its key was rebound is lost)
        worker = threading.Thread(target=injector.type_text, args=(chars,))
        worker.start()
        try:
            assert _typed(typist, len(chars)) == chars
        finally:
            worker.join()


def test_text_over_the_rate_budget_is_dropped(bare_display: VirtualDisplay) -> None:
    now = [0.0]
    with XInjector(bare_display.name, clock=lambda: now[0]) as injector:
        assert injector.type_text("a" * TEXT_BURST_CHARS)
        assert not injector.type_text("b")
        now[0] += 10 / TEXT_RATE_CHARS_S
        assert injector.type_text("b" * 10)
        assert injector.stats().skipped == {"text_rate": 1}


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
