"""A session's audio server and its capture: a private PulseAudio with one null sink, read by ``parec``.

Job: ``AudioServer`` starts one PulseAudio daemon per desktop session (Debian's ``pulseaudio``,
run by the node like Xvfb), with its own runtime directory (mode 0700) and no modules but the two
it needs: ``module-null-sink`` (sink ``rb``, s16le stereo 48 kHz: what the session's apps play
into) and ``module-native-protocol-unix`` on ``<dir>/pulse.sock``.  ``app_env()`` is what the
session's app needs to find it (``PULSE_SERVER=unix:<socket>``, and a client config that never
autospawns a daemon of its own).  ``AudioCapture`` runs ``parec`` on the sink's monitor source and
pushes the raw PCM into a ``streamer.desktop.pcm.PcmFramer`` from an asyncio pipe reader.

Flags that matter (PulseAudio 16, run as root as the node is): ``--system=false`` with a private
``HOME``/``XDG_RUNTIME_DIR``/``PULSE_RUNTIME_PATH``/``PULSE_STATE_PATH`` (root gets a warning, which
``--log-level=error`` hides, and runs); ``-n`` (no default.pa: no ALSA/udev/X11/D-Bus modules);
``--exit-idle-time=-1`` (stays up with no client); ``--disallow-exit`` and ``--disallow-module-loading``
(a session's app can neither stop it nor load e.g. a TCP protocol module); ``--disable-shm``
(PCM is copied over the socket, 192 kB/s, and no shm segments are left behind after a SIGKILL);
``--realtime=no --high-priority=no`` (no rtkit); ``--use-pid-file=no``.
``auth-anonymous=1`` on the socket: access is decided by the 0700 directory it lives in (the
same boundary as the X display: see ``streamer.desktop.display``).  With a session user
(``AudioServer(user=...)``, ``streamer.desktop.sessionuser``) the daemon runs as that account and the
directory is that account's; ``parec`` stays the node's (root reaches the socket).

Concurrency model: asyncio.  Both children are asyncio subprocesses that lead their own process
group (``start_new_session``) and die with the node (``die_with_parent``); they are stopped with
``rbcommon.procs.terminate_group`` (SIGTERM, grace, SIGKILL to the group).

Latency: ``parec --latency-msec=20`` asks the sink for 20 ms blocks (measured: 3840-byte chunks
every ~20 ms, 1.00x real time, p95 gap 21 ms on the 2-core test machine; pulseaudio ~1.2 % and
parec ~0.3 % of a core).  Until a client asks for less, the null sink renders in blocks of its
maximum latency (2 s), so parec's first bytes come up to 2 s after it connects (measured 0.5-2 s);
the session starts it before the display, so that wait overlaps the rest of the session's start.

Invariants: after ``close()`` (or a failed ``start()``) no daemon or ``parec`` of ours is left and
the runtime directory is gone.  Readiness is a connectable socket *and* a live daemon, polled
every 10 ms up to ``start_timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from rbcommon.procs import owned_tmpdir, terminate_group
from streamer.desktop import sessionuser
from streamer.desktop.display import die_with_parent, socket_listening
from streamer.desktop.pcm import CHANNELS, FRAME_MS, SAMPLE_RATE, PcmFramer
from streamer.desktop.sessionuser import SessionUser

log = logging.getLogger(__name__)

AUDIO_TMP_PREFIX = "render-audio-"  # a session audio server's scratch folder (swept by the node when stale)

SINK_NAME: Final = "rb"
MONITOR_SOURCE: Final = f"{SINK_NAME}.monitor"
PULSEAUDIO: Final = "pulseaudio"
PAREC: Final = "parec"
READ_CHUNK_BYTES: Final = 16_384
_LOG_TAIL_BYTES: Final = 2000


class AudioError(Exception):
    """The audio server or its capture could not start; the message says why."""


def audio_available() -> str | None:
    """None when ``pulseaudio`` and ``parec`` are installed, else why a session will be silent."""
    missing = [tool for tool in (PULSEAUDIO, PAREC) if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (Debian packages pulseaudio, pulseaudio-utils)"
    return None


class AudioServer:
    """A private PulseAudio with one null sink; ``async with AudioServer() as audio``."""

    def __init__(
        self, *, start_timeout_s: float = 5.0, stop_timeout_s: float = 2.0, base_env: Mapping[str, str] | None = None,
        user: SessionUser | None = None,
    ) -> None:
        self.user = user  # the account the daemon runs as (the session's); None: this process's
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._base_env = base_env if base_env is not None else os.environ
        self._dir: Path | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._closed = False

    @property
    def socket_path(self) -> Path:
        if self._dir is None:
            raise AudioError("audio server not started")
        return self._dir / "pulse.sock"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def app_env(self) -> dict[str, str]:
        """What a session's app (and our ``parec``) need to play into this server's sink."""
        assert self._dir is not None
        return {
            "PULSE_SERVER": f"unix:{self.socket_path}",
            "PULSE_CLIENTCONFIG": str(self._dir / "client.conf"),
            "PULSE_SINK": SINK_NAME,
        }

    async def __aenter__(self) -> AudioServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Start the daemon and wait until it accepts clients; on failure stop it and raise ``AudioError``."""
        if self._proc is not None or self._closed:
            raise AudioError("an AudioServer starts once")
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise

    async def _start(self) -> None:
        self._dir = owned_tmpdir(AUDIO_TMP_PREFIX)
        d = self._dir
        (d / "client.conf").write_text("autospawn = no\n")
        env = {
            "PATH": self._base_env.get("PATH", os.defpath),
            "HOME": str(d), "XDG_RUNTIME_DIR": str(d), "XDG_CONFIG_HOME": str(d / "config"),
            "PULSE_RUNTIME_PATH": str(d), "PULSE_STATE_PATH": str(d), "PULSE_CLIENTCONFIG": str(d / "client.conf"),
        }  # fmt: skip
        argv = [
            PULSEAUDIO, "--system=false", "--daemonize=no", "-n", "--exit-idle-time=-1", "--use-pid-file=no",
            "--disallow-exit", "--realtime=no", "--high-priority=no", "--disable-shm=yes",
            "--log-target=stderr", "--log-level=error",
            f"--load=module-null-sink sink_name={SINK_NAME} rate={SAMPLE_RATE} channels={CHANNELS}",
            f"--load=module-native-protocol-unix socket={d / 'pulse.sock'} auth-anonymous=1",
            "--disallow-module-loading",
        ]  # fmt: skip
        log_fd = os.open(d / "pulse.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        if sessionuser.switches(self.user):
            # the daemon runs as the session user, in a folder that user owns (0700); our parec, as root,
            # still reaches the socket
            assert self.user is not None
            for path in (d, d / "client.conf", d / "pulse.log"):
                os.chown(path, self.user.uid, self.user.gid)
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *argv, env=env, cwd=str(d), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=log_fd, start_new_session=True, preexec_fn=die_with_parent,
                **sessionuser.spawn_kwargs(self.user),
            )  # fmt: skip
        except OSError as exc:
            raise AudioError(f"cannot run {PULSEAUDIO!r}: {exc}") from exc
        finally:
            os.close(log_fd)
        deadline = time.monotonic() + self.start_timeout_s
        while not socket_listening(self.socket_path):
            if self._proc.returncode is not None:
                raise AudioError(f"pulseaudio exited with status {self._proc.returncode}: {self._log_tail()}")
            if time.monotonic() > deadline:
                raise AudioError(f"pulseaudio not ready after {self.start_timeout_s} s: {self._log_tail()}")
            await asyncio.sleep(0.01)
        log.info("audio server up: pid %d, %s", self._proc.pid, self.socket_path)

    def _log_tail(self) -> str:
        if self._dir is None:
            return ""
        try:
            return (self._dir / "pulse.log").read_bytes()[-_LOG_TAIL_BYTES:].decode("utf-8", "replace").strip()
        except OSError:
            return ""

    async def close(self) -> None:
        """Stop the daemon (its whole process group) and remove the runtime directory.  Idempotent."""
        self._closed = True
        proc, self._proc = self._proc, None
        if proc is not None:
            await asyncio.shield(terminate_group(proc, self.stop_timeout_s))
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


class AudioCapture:
    """``parec`` on the server's sink monitor, its output pushed into ``framer`` as it arrives."""

    def __init__(self, server: AudioServer, framer: PcmFramer, *, stop_timeout_s: float = 2.0) -> None:
        self._server = server
        self.framer = framer
        self.stop_timeout_s = stop_timeout_s
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    async def start(self) -> None:
        argv = [
            PAREC,
            "--raw",
            "--format=s16le",
            f"--rate={SAMPLE_RATE}",
            f"--channels={CHANNELS}",
            f"--device={MONITOR_SOURCE}",
            f"--latency-msec={FRAME_MS}",
            "--client-name=render-broker",
        ]
        env = {
            "PATH": os.environ.get("PATH", os.defpath),
            "HOME": str(self._server.socket_path.parent),
            **self._server.app_env(),
        }
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *argv, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent,
            )  # fmt: skip
        except OSError as exc:
            raise AudioError(f"cannot run {PAREC!r}: {exc}") from exc
        self._reader = asyncio.ensure_future(self._read(self._proc))

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while True:
            data = await proc.stdout.read(READ_CHUNK_BYTES)
            if not data:
                break
            self.framer.push(data)
        status = await proc.wait()
        log.warning("audio capture (parec) ended with status %s: the session is silent from now", status)

    async def close(self) -> None:
        """Stop ``parec`` and its reader.  Idempotent."""
        reader, self._reader = self._reader, None
        proc, self._proc = self._proc, None
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        if proc is not None:
            await asyncio.shield(terminate_group(proc, self.stop_timeout_s))

