"""``render-broker play``: the reference native client, a pygame (SDL) window on the client SDK.

Job: sign in (a token from ``--token`` / ``RENDER_BROKER_TOKEN``, else a guest token), pick the
pool, create or resume a session and print the queue position live, stream it into a window,
send keyboard (physical keys, ``rbclient.keymap``), mouse (absolute; relative while the pointer
is grabbed: click to grab, F9 to release), wheel and gamepad input (SDL joysticks: axes as the
standard mapping's sticks, buttons, the hat as d-pad buttons 12-15), and draw the web overlay's
stats as text (F8 toggles).  F10 or closing the window quits and ends the session (``--keep``
leaves it running to resume).  ``--frames N`` / ``--seconds S`` quit on their own (tests, bots);
with ``SDL_VIDEODRIVER=dummy`` it runs headless.

Concurrency: one asyncio loop; the SDL event pump and drawing run on it between awaits
(``TICK_S``), aiortc decodes on its own thread.  pygame is imported here only, and only
``broker.cli``'s ``play`` command imports this module, so the broker never loads SDL.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any, Final

os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")  # no banner on stdout (before the import reads it)
import pygame

from broker.protocol import GAMEPAD_MAX_AXES, GAMEPAD_MAX_BUTTONS, GAMEPAD_MAX_INDEX, POINTER_MAX_DELTA
from rbclient import inputs, keymap
from rbclient.api import ApiError, Broker, SessionEnded, SessionView
from rbclient.stream import Frame, SignalingError, Stream, start

TICK_S: Final = 1 / 240  # event pump and redraw period while no frame is pending
TOKEN_ENV: Final = "RENDER_BROKER_TOKEN"
HAT_BUTTONS: Final = (12, 13, 14, 15)  # standard mapping d-pad: up, down, left, right
# SDL mouse buttons -> protocol buttons (browser button + 1); SDL 4/5 are the legacy wheel
SDL_TO_PROTOCOL_BUTTON: Final = {1: 1, 2: 2, 3: 3, 6: 4, 7: 5}
OVERLAY_BG: Final = (0, 0, 0, 170)


class Player:
    """The window's half: SDL events to input messages, frames and the overlay to the screen."""

    def __init__(self, stream: Stream, screen: pygame.Surface, *, show_stats: bool = False) -> None:
        self.stream = stream
        self.screen = screen
        self.show_stats = show_stats
        self.grabbed = False
        self.quit = False
        self.sent: Counter[str] = Counter()  # input messages sent, by ``t``
        self.drawn = 0
        self._drawn_index = -1
        self._pads: dict[int, tuple[list[float], list[float]]] = {}  # joystick instance id -> (axes, buttons)
        self._pad_index: dict[int, int] = {}  # joystick instance id -> protocol pad index 0..3
        self._joysticks: dict[int, Any] = {}
        self._font = pygame.font.Font(None, 20)

    def _send(self, message: dict[str, Any]) -> None:
        if self.stream.send(message):
            self.sent[str(message["t"])] += 1

    # --- input -------------------------------------------------------------------------
    def handle(self, event: pygame.event.Event) -> None:
        """One SDL event."""
        if event.type == pygame.QUIT:
            self.quit = True
        elif event.type in (pygame.KEYDOWN, pygame.KEYUP):
            self._key(event)
        elif event.type == pygame.MOUSEMOTION:
            self._motion(event)
        elif event.type in (pygame.MOUSEBUTTONDOWN, pygame.MOUSEBUTTONUP):
            down = event.type == pygame.MOUSEBUTTONDOWN
            if down and not self.grabbed and event.button == 1:
                self.grab(True)
            button = SDL_TO_PROTOCOL_BUTTON.get(event.button)
            if button is not None:
                self._send(inputs.pointer_button(button, down))
        elif event.type == pygame.MOUSEWHEEL:
            self._send(inputs.wheel(max(-10, min(10, event.x)), max(-10, min(10, -event.y))))
        elif event.type == pygame.JOYDEVICEADDED:
            joystick = pygame.joystick.Joystick(event.device_index)
            self._joysticks[joystick.get_instance_id()] = joystick
        elif event.type == pygame.JOYDEVICEREMOVED:
            self._pad_event(event.instance_id, neutral=True)
            self._joysticks.pop(event.instance_id, None)
        elif event.type in (pygame.JOYAXISMOTION, pygame.JOYBUTTONDOWN, pygame.JOYBUTTONUP, pygame.JOYHATMOTION):
            self._pad_event(event.instance_id, event=event)

    def _key(self, event: pygame.event.Event) -> None:
        down = event.type == pygame.KEYDOWN
        if event.key == pygame.K_F8:
            if down:
                self.show_stats = not self.show_stats
            return
        if event.key == pygame.K_F9:
            if down:
                self.grab(False)
            return
        if event.key == pygame.K_F10:
            self.quit = True
            return
        code = keymap.code_for_scancode(int(getattr(event, "scancode", 0)))
        if code is not None:
            self._send(inputs.key(code, down))

    def _motion(self, event: pygame.event.Event) -> None:
        width, height = self.screen.get_size()
        if self.grabbed:  # relative motion in mouse pixels ("pr"), as the web client sends under pointer lock
            dx, dy = event.rel
            n = POINTER_MAX_DELTA
            self._send(inputs.pointer_relative(max(-n, min(n, int(dx))), max(-n, min(n, int(dy)))))
        else:
            x, y = event.pos
            self._send(self.stream.pointer.move_to(min(1.0, max(0.0, x / max(1, width - 1))),
                                                   min(1.0, max(0.0, y / max(1, height - 1)))))

    def grab(self, on: bool) -> None:
        """Grab the pointer (hidden, relative motion) or release it."""
        self.grabbed = on
        pygame.event.set_grab(on)
        pygame.mouse.set_visible(not on)

    def _pad_event(self, instance_id: int, *, event: pygame.event.Event | None = None, neutral: bool = False) -> None:
        if instance_id not in self._pad_index:
            used = set(self._pad_index.values())
            free = [i for i in range(GAMEPAD_MAX_INDEX + 1) if i not in used]
            if not free:
                return  # more pads than the protocol carries
            self._pad_index[instance_id] = free[0]
            self._pads[instance_id] = ([0.0] * GAMEPAD_MAX_AXES, [0.0] * GAMEPAD_MAX_BUTTONS)
        axes, buttons = self._pads[instance_id]
        if neutral:
            axes[:] = [0.0] * GAMEPAD_MAX_AXES
            buttons[:] = [0.0] * GAMEPAD_MAX_BUTTONS
        elif event is not None and event.type == pygame.JOYAXISMOTION and event.axis < GAMEPAD_MAX_AXES:
            axes[event.axis] = max(-1.0, min(1.0, float(event.value)))
        elif event is not None and event.type in (pygame.JOYBUTTONDOWN, pygame.JOYBUTTONUP):
            if event.button < GAMEPAD_MAX_BUTTONS:
                buttons[event.button] = 1.0 if event.type == pygame.JOYBUTTONDOWN else 0.0
        elif event is not None and event.type == pygame.JOYHATMOTION and event.hat == 0:
            hx, hy = event.value  # SDL: +y is up
            for button, on in zip(HAT_BUTTONS, (hy > 0, hy < 0, hx < 0, hx > 0), strict=True):
                buttons[button] = 1.0 if on else 0.0
        self._send(inputs.gamepad(self._pad_index[instance_id], axes, buttons))
        if neutral:
            del self._pad_index[instance_id], self._pads[instance_id]

    # --- drawing -----------------------------------------------------------------------
    def draw(self) -> bool:
        """Show the newest frame (and the overlay) when there is a new one; True if it drew."""
        frame: Frame | None = self.stream.latest
        if frame is None or frame.index == self._drawn_index:
            return False
        self._drawn_index = frame.index
        rgb = frame.image.to_ndarray(format="rgb24")
        picture = pygame.image.frombuffer(rgb.tobytes(), (frame.image.width, frame.image.height), "RGB")
        size = self.screen.get_size()
        self.screen.blit(picture if picture.get_size() == size else pygame.transform.scale(picture, size), (0, 0))
        if self.show_stats:
            self._overlay(frame.at_ms)
        pygame.display.flip()
        self.drawn += 1
        return True

    def overlay_lines(self, now_ms: float) -> list[str]:
        return ["Stream stats - F8 to hide", *self.stream.stats.snapshot(now_ms).lines()]

    def _overlay(self, now_ms: float) -> None:
        rows = [self._font.render(line, True, (255, 255, 255)) for line in self.overlay_lines(now_ms)]
        width = max(r.get_width() for r in rows) + 16
        height = sum(r.get_height() for r in rows) + 12
        box = pygame.Surface((width, height), pygame.SRCALPHA)
        box.fill(OVERLAY_BG)
        y = 6
        for row in rows:
            box.blit(row, (8, y))
            y += row.get_height()
        self.screen.blit(box, (8, 8))

    async def run(self, *, frames: int | None = None, seconds: float | None = None) -> None:
        """Pump events and draw until quit, the session ends, ``frames`` were drawn or ``seconds`` passed."""
        deadline = None if seconds is None else time.monotonic() + seconds
        while not self.quit and not self.stream.closed:
            for event in pygame.event.get():
                self.handle(event)
            self.draw()
            if frames is not None and self.drawn >= frames:
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            await asyncio.sleep(TICK_S)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="render-broker play", description=(
        "Stream a session into a native window (pygame/SDL). Click grabs the pointer (relative mouse), "
        "F9 releases it, F8 toggles the stats overlay, F10 quits. SDL_VIDEODRIVER=dummy runs it headless."))
    p.add_argument("--broker", default=os.environ.get("RENDER_BROKER_URL", "http://127.0.0.1:8080"),
                   help="broker URL (env RENDER_BROKER_URL)")
    p.add_argument("--token", default=os.environ.get(TOKEN_ENV),
                   help=f"user token (env {TOKEN_ENV}); without one, a guest token")
    p.add_argument("--pool", help="pool name (default: the first pool)")
    p.add_argument("--width", type=int)
    p.add_argument("--height", type=int)
    p.add_argument("--fps", type=int)
    p.add_argument("--codec", choices=["auto", "h264", "vp8"])
    p.add_argument("--host-address", action="append", default=[], dest="host_addresses",
                   help="offer ICE host candidates on this address only (repeatable; 127.0.0.1 on one machine)")
    p.add_argument("--stats", action="store_true", help="show the stats overlay from the start")
    p.add_argument("--frames", type=int, help="quit after drawing this many frames")
    p.add_argument("--seconds", type=float, help="quit after this many seconds of streaming")
    p.add_argument("--keep", action="store_true", help="leave the session running on quit (resume it later)")
    return p.parse_args(argv)


def _position(view: SessionView) -> None:
    state, position = view.get("state"), view.get("queue_position")
    if state == "queued":
        print(f"queued: position {position}", flush=True)
    else:
        print(f"session {view.get('id')}: {state}" + (f" on {view['host']}" if view.get("host") else ""), flush=True)


async def play(args: argparse.Namespace) -> int:
    async with Broker(args.broker, args.token) as broker:
        if not args.token:
            await broker.sign_in_guest()
            print(f"signed in as guest {broker.user}", flush=True)
        pool = args.pool or next((p["name"] for p in await broker.pools()), None)
        if pool is None:
            print("render-broker play: the broker has no pools", file=sys.stderr)
            return 2
        stream = await start(broker, pool, width=args.width, height=args.height, fps=args.fps, codec=args.codec,
                             on_update=_position, end_on_failure=not args.keep,
                             host_addresses=args.host_addresses)
        pygame.display.init()
        pygame.font.init()
        pygame.joystick.init()
        try:
            first = await stream.wait_frames(1)
            pygame.display.set_caption(f"render-broker: {pool}")
            screen = pygame.display.set_mode((first.image.width, first.image.height), pygame.RESIZABLE)
            player = Player(stream, screen, show_stats=args.stats)
            await player.run(frames=args.frames, seconds=args.seconds)
            s = stream.stats.summary()
            latency = "n/a" if s.render_to_decode_p50_ms is None else f"{s.render_to_decode_p50_ms:.1f} ms"
            print(f"frames {s.frames} in {s.duration_s:.1f} s ({s.fps:.1f} fps), freezes {s.freezes}, "
                  f"render-to-decode p50 {latency}, input sent {dict(sorted(player.sent.items()))}", flush=True)
            if stream.bye_reason:
                print(f"the session ended: {stream.bye_reason}", flush=True)
        finally:
            pygame.quit()
            if args.keep or stream.bye_reason:
                await stream.close()
            else:
                ended = await stream.end()
                print(f"session ended ({ended.get('end_reason')})", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return asyncio.run(play(args))
    except ApiError as exc:
        print(f"render-broker play: {exc}", file=sys.stderr)
        return 1
    except SessionEnded as exc:
        print(f"render-broker play: the session ended before it started ({exc.view.get('end_reason')})",
              file=sys.stderr)
        return 1
    except SignalingError as exc:
        print(f"render-broker play: the node refused the stream: {exc}", file=sys.stderr)
        return 1
    except (OSError, TimeoutError) as exc:
        print(f"render-broker play: cannot reach {args.broker}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
