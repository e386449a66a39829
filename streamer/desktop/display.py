"""A session's virtual X display: Xvfb, an optional window manager and the app.

Job: start Xvfb at a given size on a display number Xvfb picks itself
(``-displayfd``: the server claims the first free number by binding its
abstract socket, which is atomic, and writes the number to our pipe only once
it accepts connections: no race for the number, no readiness poll), then
optionally a window
manager (default ``openbox``; we wait until it announces itself through the
EWMH ``_NET_SUPPORTING_WM_CHECK`` root property *and* has mapped a probe
window, so the app's first window is managed and focused at once) and the
session's app (any argv, ``DISPLAY`` set).
``resize`` changes the screen size through RandR within the framebuffer Xvfb
was started with (``DisplayConfig.max_width/max_height``): Xvfb's RandR 1.5
accepts any size up to that framebuffer and nothing beyond it.

Concurrency model: asyncio.  Children are asyncio subprocesses, each the leader
of its own process group (``start_new_session``), so a signal to the group
reaches everything the child forked.  Blocking X calls (RandR, the WM wait) run
in worker threads with their own short-lived X connections.  One task owns a
``VirtualDisplay``; ``close`` is idempotent and shielded from cancellation, so
a cancelled session still tears its display down.

Invariants:
- After ``close()`` (or a failed ``start()``, which closes what it started)
  no child of ours is left: app, WM and Xvfb get SIGTERM on their process
  group, then SIGKILL after ``stop_timeout_s``; all are reaped.
- Xvfb removes its own ``/tmp/.X11-unix/X<n>`` socket file on SIGTERM (with
  ``-displayfd`` it claims the number through the abstract socket and writes
  no ``/tmp/.X<n>-lock``); if it had to be killed we remove the socket file
  it left, but only when no server listens on it any more.
- Our temp dir (Xvfb's log) is removed on close.
- Xvfb runs with ``-noreset``: the server must not reset (dropping RandR
  modes and state) whenever its last client disconnects.

Limits: a descendant that leaves our process group on purpose (``setsid``,
a daemon) escapes the group signal; containment of such apps needs a cgroup
or a container per session.  xterm's shell is such a case but exits on the
SIGHUP of its closed pty.

Isolation note: no X authority cookie is used; local clients of the same
machine may connect.  The WM and the app run as ``DisplayConfig.user`` (the
node's ``session_user``, e.g. ``nobody``: never root unless the operator says
so, see ``streamer.desktop.sessionuser``), with a private HOME; sessions that
share that account can still reach each other's displays and files, so
per-session accounts or containers are the boundary between sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import select
import shutil
import signal
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from Xlib import X
from Xlib import display as xdisplay
from Xlib.error import ConnectionClosedError, XError
from Xlib.error import DisplayError as XDisplayError
from Xlib.ext import randr

from rbcommon.procs import owned_tmpdir
from streamer.desktop import sessionuser
from streamer.desktop.sessionuser import SessionUser

log = logging.getLogger(__name__)

DISPLAY_TMP_PREFIX = "render-display-"  # a session display's scratch folder (swept by the node when stale)


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _find_prctl() -> Any:
    """libc's prctl, looked up once in the parent: a forked child (preexec_fn) should not dlopen."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux / not glibc
        return None


_PRCTL: Final = _find_prctl()


def die_with_parent() -> None:
    """In the child, before exec: ask the kernel to SIGKILL it when the node process dies.

    Sessions' processes live in their own process groups so they can be signalled as a
    group; without this a SIGKILLed node (no chance to clean up) would leave Xvfb and the
    app running.  Linux only; elsewhere a no-op.
    """
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


X11_UNIX_DIR: Final = Path("/tmp/.X11-unix")
LOCK_DIR: Final = Path("/tmp")
_LOG_TAIL_BYTES: Final = 2000  # of Xvfb's stderr quoted in a start error


class DisplayError(Exception):
    """The display could not be started or changed; the message says why."""


# What a session's apps may inherit from the node's environment.  An allowlist, not a denylist:
# the node runs with its broker token (and, under scripts/run.sh, the admin token) in its
# environment, and a user's desktop must never be able to print them.
APP_ENV_NAMES: Final = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ",
                                  "TMPDIR", "LD_LIBRARY_PATH"})
APP_ENV_PREFIXES: Final = ("LC_", "XDG_", "__GL", "__EGL", "__NV", "VK_", "MESA_", "LIBGL_", "PULSE_", "PIPEWIRE_")


def app_env(base: Mapping[str, str]) -> dict[str, str]:
    """The part of ``base`` a session's apps inherit: locale, paths and graphics/audio driver settings,
    never the node's tokens or settings (``NODE_*``, ``BROKER_*``).  Pure."""
    return {k: v for k, v in base.items() if k in APP_ENV_NAMES or k.startswith(APP_ENV_PREFIXES)}


# NVIDIA's GLX vendor library: glvnd dispatches GL calls of X clients to it instead of Mesa, so
# an OpenGL app inside Xvfb renders on the NVIDIA GPU (see docs/gpu.md for what was measured).
GLX_VENDOR_NVIDIA: Final = "nvidia"


def gpu_render_env(base: Mapping[str, str], gpu: int) -> dict[str, str]:
    """The environment of a session's apps so they render and compute on GPU ``gpu`` (NVML index).

    ``__GLX_VENDOR_LIBRARY_NAME`` sends GLX to NVIDIA's library; ``CUDA_VISIBLE_DEVICES`` leaves the
    app only its own card for CUDA (and an in-app NVENC) work, counted in NVML's PCI bus order;
    ``RB_GPU_INDEX`` names the card for our own EGL code.  Pure: returns a new mapping.
    """
    if gpu < 0:
        raise ValueError(f"gpu must be >= 0, got {gpu}")
    return {**base, "__GLX_VENDOR_LIBRARY_NAME": GLX_VENDOR_NVIDIA, "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": str(gpu), "RB_GPU_INDEX": str(gpu)}


@dataclass(frozen=True, slots=True)
class DisplayConfig:
    """What to start.  Sizes in pixels; timeouts in seconds."""

    width: int = 1280
    height: int = 720
    depth: int = 24  # colour depth in bits (24: 32-bit pixels that capture reads as bgr0)
    # Xvfb's framebuffer: resize() may go up to it.  None: the start size.
    max_width: int | None = None
    max_height: int | None = None
    window_manager: Sequence[str] | None = ("openbox",)
    wait_for_wm: bool = True  # start the app only once the WM manages windows (see _wait_for_wm)
    app: Sequence[str] | None = None  # e.g. ("xterm",)
    # Environment of the WM and the app (DISPLAY is added).  None: this process's environment.
    env: Mapping[str, str] | None = None
    xvfb: str = "Xvfb"  # executable name or path
    # The account the WM and the app run as (Xvfb stays the node's); None: this process's.  Another
    # account than this process's needs root here; it gets a private HOME in the display's scratch folder.
    user: SessionUser | None = None
    xvfb_args: Sequence[str] = ()  # extra Xvfb arguments
    start_timeout_s: float = 5.0  # per step: Xvfb ready, WM ready
    stop_timeout_s: float = 2.0  # SIGTERM grace before SIGKILL, per process

    def framebuffer(self) -> tuple[int, int]:
        """The Xvfb screen size: at least the start size."""
        return (max(self.width, self.max_width or 0), max(self.height, self.max_height or 0))


@dataclass(slots=True)
class StartTimings:
    """Milliseconds each start step took (for logs and benchmarks)."""

    xvfb_ms: float = 0.0
    resize_ms: float = 0.0
    wm_ms: float = 0.0
    app_ms: float = 0.0


@dataclass(slots=True)
class _Child:
    name: str
    proc: asyncio.subprocess.Process
    pid: int = field(init=False)

    def __post_init__(self) -> None:
        self.pid = self.proc.pid


class VirtualDisplay:
    """Xvfb + optional WM + optional app; use ``async with VirtualDisplay(cfg) as d``."""

    def __init__(self, config: DisplayConfig) -> None:
        self.config = config
        self.timings = StartTimings()
        self._number: int | None = None
        self._size = (config.width, config.height)
        self._tmpdir: Path | None = None
        self._xvfb: _Child | None = None
        self._wm: _Child | None = None
        self._app: _Child | None = None
        self._close_task: asyncio.Task[None] | None = None
        self._user_env: dict[str, str] = {}  # HOME/USER/LOGNAME of the configured session user

    # --- properties ---------------------------------------------------------------
    @property
    def number(self) -> int:
        """The display number Xvfb chose (``:<number>``)."""
        if self._number is None:
            raise DisplayError("display not started")
        return self._number

    @property
    def name(self) -> str:
        """The ``DISPLAY`` string, e.g. ``":3"``."""
        return f":{self.number}"

    @property
    def size(self) -> tuple[int, int]:
        """Current screen size (width, height) in pixels."""
        return self._size

    @property
    def pids(self) -> dict[str, int]:
        """Pids of the children started so far, by role (xvfb, wm, app)."""
        return {c.name: c.pid for c in (self._xvfb, self._wm, self._app) if c is not None}

    @property
    def app_returncode(self) -> int | None:
        """The app's exit status once it exited, else None (also None if there is no app)."""
        return self._app.proc.returncode if self._app is not None else None

    async def wait_app(self) -> int:
        """Wait until the app exits; returns its exit status.  The display stays up."""
        if self._app is None:
            raise DisplayError("no app was started")
        return await self._app.proc.wait()

    # --- lifecycle ------------------------------------------------------------------
    async def __aenter__(self) -> VirtualDisplay:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Start Xvfb, then the WM, then the app.  On any failure, stop what was started and raise."""
        if self._xvfb is not None or self._close_task is not None:
            raise DisplayError("a VirtualDisplay starts once")
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise

    async def _start(self) -> None:
        cfg = self.config
        self._tmpdir = owned_tmpdir(DISPLAY_TMP_PREFIX)
        if cfg.user is not None:
            self._user_env = sessionuser.env(cfg.user, sessionuser.prepare_home(self._tmpdir, cfg.user))
        t0 = time.perf_counter()
        self._number = await self._start_xvfb()
        t1 = time.perf_counter()
        self.timings.xvfb_ms = (t1 - t0) * 1000
        if self.config.framebuffer() != (cfg.width, cfg.height):
            self._size = self.config.framebuffer()
            await self.resize(cfg.width, cfg.height)
        t2 = time.perf_counter()
        self.timings.resize_ms = (t2 - t1) * 1000
        if cfg.window_manager:
            self._wm = await self._spawn("wm", cfg.window_manager)
            if cfg.wait_for_wm:
                await self._wait_for_wm(self._wm)
        t3 = time.perf_counter()
        self.timings.wm_ms = (t3 - t2) * 1000
        if cfg.app:
            self._app = await self._spawn("app", cfg.app)
        self.timings.app_ms = (time.perf_counter() - t3) * 1000
        log.info(
            "display %s %dx%d up: xvfb %.0f ms, wm %.0f ms, pids %s",
            self.name,
            *self._size,
            self.timings.xvfb_ms,
            self.timings.wm_ms,
            self.pids,
        )

    async def _start_xvfb(self) -> int:
        cfg = self.config
        assert self._tmpdir is not None
        fb_w, fb_h = cfg.framebuffer()
        read_fd, write_fd = os.pipe()
        argv = [
            cfg.xvfb, "-displayfd", str(write_fd),
            "-screen", "0", f"{fb_w}x{fb_h}x{cfg.depth}",
            "-nolisten", "tcp", "-noreset", *cfg.xvfb_args,
        ]  # fmt: skip
        log_path = self._tmpdir / "xvfb.log"
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=log_fd,
                pass_fds=(write_fd,),
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        except OSError as exc:
            os.close(read_fd)
            raise DisplayError(f"cannot run {cfg.xvfb!r}: {exc}") from exc
        finally:
            os.close(log_fd)
            os.close(write_fd)  # Xvfb holds the only write end: EOF means it died
        self._xvfb = _Child("xvfb", proc)
        line = await self._read_displayfd(read_fd, proc)
        try:
            return int(line.strip())
        except ValueError:
            raise DisplayError(f"Xvfb wrote no display number ({line!r}); log: {self._log_tail()}") from None

    async def _read_displayfd(self, read_fd: int, proc: asyncio.subprocess.Process) -> bytes:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        pipe = os.fdopen(read_fd, "rb", buffering=0)
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
        try:
            line = await asyncio.wait_for(reader.readline(), self.config.start_timeout_s)
        except TimeoutError:
            raise DisplayError(f"Xvfb not ready after {self.config.start_timeout_s} s") from None
        finally:
            transport.close()  # closes the pipe
        if not line:
            status = await proc.wait()
            raise DisplayError(f"Xvfb exited with status {status}: {self._log_tail()}")
        return line

    def _log_tail(self) -> str:
        if self._tmpdir is None:
            return ""
        try:
            data = (self._tmpdir / "xvfb.log").read_bytes()
        except OSError:
            return ""
        return data[-_LOG_TAIL_BYTES:].decode("utf-8", "replace").strip()

    def child_env(self) -> dict[str, str]:
        """The environment children get: the configured one plus ``DISPLAY``."""
        base = self.config.env if self.config.env is not None else os.environ
        return {**base, **self._user_env, "DISPLAY": self.name}

    async def _spawn(self, role: str, argv: Sequence[str]) -> _Child:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                env=self.child_env(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent,
                **sessionuser.spawn_kwargs(self.config.user),
            )
        except OSError as exc:
            raise DisplayError(f"cannot run {role} {argv[0]!r}: {exc}") from exc
        return _Child(role, proc)

    async def _wait_for_wm(self, wm: _Child) -> None:
        timeout = self.config.start_timeout_s
        ready = asyncio.ensure_future(asyncio.to_thread(_wait_for_wm, self.name, timeout))
        # The thread cannot be cancelled; if we stop waiting it ends at its deadline or when
        # Xvfb goes.  Retrieve its outcome then, so nothing is logged as never retrieved.
        ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        exited = asyncio.ensure_future(wm.proc.wait())
        try:
            await asyncio.wait({ready, exited}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            exited.cancel()
        if ready.done():
            if ready.exception() is not None:
                raise DisplayError(f"waiting for the window manager failed: {ready.exception()!r}")
            if ready.result():
                return
        if wm.proc.returncode is not None:
            raise DisplayError(f"window manager exited with status {wm.proc.returncode} during start")
        raise DisplayError(f"window manager not ready after {timeout} s")

    async def resize(self, width: int, height: int) -> None:
        """Set the screen size through RandR; at most the framebuffer size (``DisplayConfig.max_*``).

        Captures opened at the old size must be reopened by the caller.
        """
        fb_w, fb_h = self.config.framebuffer()
        if not (0 < width <= fb_w and 0 < height <= fb_h):
            raise DisplayError(f"{width}x{height} outside 1x1..{fb_w}x{fb_h} (Xvfb framebuffer)")
        if (width, height) == self._size:
            return
        await asyncio.to_thread(_randr_set_size, self.name, width, height)
        self._size = (width, height)

    async def close(self) -> None:
        """Stop app, WM and Xvfb and remove temp files; safe to call more than once."""
        if self._close_task is None:
            self._close_task = asyncio.ensure_future(self._close())
        await asyncio.shield(self._close_task)

    async def _close(self) -> None:
        timeout = self.config.stop_timeout_s
        # Clients first, so they exit cleanly with a live server; Xvfb last.
        await asyncio.gather(*(_stop(c, timeout) for c in (self._app, self._wm) if c is not None))
        if self._xvfb is not None:
            await _stop(self._xvfb, timeout)
            if self._number is not None:
                _remove_stale_server_files(self._number, self._xvfb.pid)
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)


async def _stop(child: _Child, timeout_s: float) -> None:
    """SIGTERM the child's process group, SIGKILL it after ``timeout_s``, reap the leader."""
    proc = child.proc
    _signal_group(child.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), timeout_s)
    except TimeoutError:
        log.warning("%s (pid %d) ignored SIGTERM for %.1f s: SIGKILL", child.name, child.pid, timeout_s)
        _signal_group(child.pid, signal.SIGKILL)
        await proc.wait()
    # Members of the group that outlived their leader (forked helpers) go too.
    _signal_group(child.pid, signal.SIGKILL)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _remove_stale_server_files(number: int, xvfb_pid: int) -> None:
    """Remove what a killed Xvfb left: its socket file if nothing listens on it, its lock if it names it.

    With ``-displayfd`` Xvfb claims a number by binding the abstract socket
    ``@/tmp/.X11-unix/X<n>`` (atomic, gone with the process) and writes no lock
    file; the filesystem socket stays behind after SIGKILL.  A server that took
    the number since answers on it, and then we leave it alone.
    """
    lock = LOCK_DIR / f".X{number}-lock"
    try:
        if int(lock.read_text().strip()) == xvfb_pid:
            lock.unlink(missing_ok=True)
    except (OSError, ValueError):
        pass  # no lock (the -displayfd case) or not one we understand: leave it
    path = X11_UNIX_DIR / f"X{number}"
    if path.exists() and not socket_listening(path):
        path.unlink(missing_ok=True)


def socket_listening(path: Path) -> bool:
    """True if a server accepts connections on the Unix socket ``path`` (answers at once either way)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
        return True


# --- blocking X helpers (run in worker threads) ---------------------------------------


def _wait_for_wm(display_name: str, timeout_s: float) -> bool:
    """Block until a window manager manages windows; False on timeout or a lost connection.

    Two steps: the EWMH ``_NET_SUPPORTING_WM_CHECK`` root property (any
    EWMH WM), then a probe: map a 1x1 top-level window and wait until the WM
    has mapped it.  The property alone is not enough: openbox sets it early
    in its start and, measured here, a window mapped right after it was left
    unmapped for ~5 s in about half the runs.  A probe map request that goes
    unanswered is repeated every ``_PROBE_REMAP_S``.
    """
    deadline = time.monotonic() + timeout_s
    try:
        dpy = xdisplay.Display(display_name)
    except XDisplayError:
        return False
    try:
        root = dpy.screen().root
        root.change_attributes(event_mask=X.PropertyChangeMask)
        atom = dpy.intern_atom("_NET_SUPPORTING_WM_CHECK")

        def has_check_property() -> bool:
            prop = root.get_full_property(atom, X.AnyPropertyType)
            return prop is not None and len(prop.value) > 0

        if not _wait_until(dpy, has_check_property, deadline):
            return False
        probe = root.create_window(0, 0, 1, 1, 0, X.CopyFromParent, event_mask=X.StructureNotifyMask)
        try:
            probe.set_wm_name("render-broker wm probe")
            mapped_at = [0.0]

            def probe_mapped() -> bool:
                if probe.get_attributes().map_state == X.IsViewable:
                    return True
                if time.monotonic() - mapped_at[0] >= _PROBE_REMAP_S:
                    probe.map()  # a no-op for the WM if a request is already pending
                    mapped_at[0] = time.monotonic()
                return False

            return _wait_until(dpy, probe_mapped, deadline, poll_s=_PROBE_REMAP_S)
        finally:
            probe.destroy()
            dpy.sync()
    except ConnectionClosedError:
        return False
    finally:
        dpy.close()


# Seconds between repeated probe map requests.  openbox leaves the first request unanswered when it
# comes before it manages windows, so this is how late a ready WM is noticed: 0.25 cost ~250 ms of
# every desktop's start (bench_first_frame: WM wait 270-340 ms at 0.25, 50-110 ms at 0.02); a
# repeated request is one X request, a no-op for the WM while one is pending.
_PROBE_REMAP_S: Final = 0.02


def _wait_until(dpy: xdisplay.Display, ready: Callable[[], bool], deadline: float, poll_s: float = 1.0) -> bool:
    """Re-check ``ready()`` whenever X events arrive (or every ``poll_s``) until ``deadline``."""
    while True:
        if ready():
            return True
        # Events already read into Xlib's queue are drained first: select() would not see them.
        if dpy.pending_events():
            while dpy.pending_events():
                dpy.next_event()
            continue
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        select.select([dpy], [], [], min(remaining, poll_s))


def _randr_set_size(display_name: str, width: int, height: int) -> None:
    """Switch the (single) output of an Xvfb screen to a ``width x height`` mode via RandR."""
    try:
        dpy = xdisplay.Display(display_name)
    except XDisplayError as exc:
        raise DisplayError(f"cannot connect to {display_name}: {exc}") from exc
    try:
        if not dpy.has_extension("RANDR"):
            raise DisplayError("the X server has no RANDR extension")
        root = dpy.screen().root
        res = root.xrandr_get_screen_resources()
        if not res.crtcs or not res.outputs:
            raise DisplayError("RandR reports no CRTC or output")
        crtc, output = res.crtcs[0], res.outputs[0]
        ts = res.config_timestamp
        mode_id = next((m.id for m in res.modes if (m.width, m.height) == (width, height)), None)
        if mode_id is None:
            name = f"{width}x{height}"
            info = {
                "id": 0,
                "width": width,
                "height": height,
                "dot_clock": 0,
                "h_sync_start": 0,
                "h_sync_end": 0,
                "h_total": 0,
                "h_skew": 0,
                "v_sync_start": 0,
                "v_sync_end": 0,
                "v_total": 0,
                "name_length": len(name),
                "flags": 0,
            }
            mode_id = root.xrandr_create_mode(info, name).mode
        if mode_id not in dpy.xrandr_get_output_info(output, ts).modes:
            dpy.xrandr_add_output_mode(output, mode_id)
        # The screen cannot shrink below an enabled CRTC: disable, resize, re-enable.
        dpy.xrandr_set_crtc_config(crtc, ts, 0, 0, 0, randr.Rotate_0, [])
        mm_w, mm_h = round(width * 25.4 / 96), round(height * 25.4 / 96)  # millimetres at 96 dpi
        root.xrandr_set_screen_size(width, height, mm_w, mm_h)
        reply = dpy.xrandr_set_crtc_config(crtc, ts, 0, 0, mode_id, randr.Rotate_0, [output])
        if reply.status != 0:
            raise DisplayError(f"RandR refused {width}x{height} (status {reply.status})")
        dpy.sync()
    except XError as exc:
        raise DisplayError(f"RandR resize to {width}x{height} failed: {exc}") from exc
    finally:
        dpy.close()
