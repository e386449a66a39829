"""Sound end to end: a desktop app plays a tone into its session's PulseAudio, an aiortc viewer hears it as Opus.

Real processes throughout: Xvfb + openbox, the session's pulseaudio and parec, the app's pacat,
aiortc on both sides (127.0.0.1 only).  Skipped with the reason where pulseaudio or the desktop
tools are not installed.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest

from streamer.desktop import sessionuser
from streamer.desktop.audio import audio_available
from streamer.media.session import RuntimeConfig, SessionRefused, SessionRuntime, SessionSpec
from tests.procs import alive
from tests.streamer.tone import rms, tone_amplitude
from tests.streamer.viewer import Viewer, until

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(
        any(shutil.which(tool) is None for tool in ("Xvfb", "openbox", "pacat")),
        reason="desktop sessions with sound need Xvfb, openbox and pacat (Debian xvfb, openbox, pulseaudio-utils)",
    ),
    pytest.mark.skipif(audio_available() is not None, reason=f"no audio server: {audio_available()}"),
]

CONFIG = RuntimeConfig(advertise_addresses=("127.0.0.1",), stats_interval_ms=100)
TONE_HZ = 440
FULL_SCALE = 32767



def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def owner(pid: int) -> int:
    """The uid a process runs as."""
    return Path(f"/proc/{pid}").stat().st_uid


def hears_tone(viewer: Viewer) -> bool:
    """The last 200 ms received hold the tone: loud, at its frequency, not at another."""
    window = viewer.sound(0.2)
    if len(window) < 9_600:
        return False
    return (
        rms(window) > 0.1 * FULL_SCALE
        and tone_amplitude(window, TONE_HZ) > 0.2 * FULL_SCALE
        and tone_amplitude(window, 1000) < 0.02 * FULL_SCALE
    )


@pytest.mark.parametrize("as_user", [None, "nobody"])
async def test_a_desktop_apps_tone_reaches_the_viewer_as_opus_and_stop_leaves_nothing(
    as_user: str | None, tone_file: Path
) -> None:
    """Also with the session's programs (app, WM, PulseAudio) running as an unprivileged account."""
    config = CONFIG
    if as_user is not None:
        if os.geteuid() != 0:
            pytest.skip("running session programs as another account needs root")
        config = dataclasses.replace(CONFIG, session_user=sessionuser.lookup(as_user))
    play = f"while :; do pacat --raw --format=s16le --rate=48000 --channels=2 {tone_file} || exit 1; done"
    spec = SessionSpec(id="desk-sound", kind="desktop", width=320, height=240, fps=30, app_command=("sh", "-c", play))
    runtime = SessionRuntime(spec, config)
    await runtime.start()
    pids = runtime.pids
    assert {"xvfb", "wm", "app", "audio", "audio_capture"} <= set(pids)
    if as_user is not None:
        uid = sessionuser.lookup(as_user).uid
        assert [owner(pids[r]) for r in ("app", "wm", "audio")] == [uid] * 3
    env = environ(pids["app"])
    assert env["PULSE_SERVER"].startswith("unix:") and env["PULSE_SERVER"].endswith("/pulse.sock")
    viewer = Viewer(audio=True)
    silent = Viewer()  # an offer without audio (a native client, an older page) still gets video
    try:
        await viewer.connect(runtime.handle_signal)
        assert runtime.stats()["audio_codec"] == "opus"
        await viewer.wait_frames(3)
        await until(lambda: viewer.audio_frames >= 25, "no audio frames decoded")
        await until(lambda: hears_tone(viewer), f"no {TONE_HZ} Hz tone in the sound received", deadline_s=10)
        window = viewer.sound(0.2)
        assert tone_amplitude(window, TONE_HZ) > 10 * tone_amplitude(window, 2 * TONE_HZ + 137)

        await silent.connect(runtime.handle_signal)  # replaces the first viewer
        assert runtime.stats()["audio_codec"] is None
        await silent.wait_frames(3)
        assert silent.audio_frames == 0
    finally:
        await viewer.close()
        await silent.close()
        await runtime.stop()
    assert [role for role, pid in pids.items() if alive(pid)] == []
    assert not Path(env["PULSE_SERVER"].removeprefix("unix:")).parent.exists()


def hears(viewer: Viewer, freq_hz: int, window_s: float = 1.0) -> bool:
    """The last ``window_s`` received hold a clear ``freq_hz`` component."""
    window = viewer.sound(window_s)
    return len(window) >= 9_600 and tone_amplitude(window, freq_hz) > 0.02 * FULL_SCALE


async def test_the_built_in_games_sound_is_synthesized_in_process_and_reaches_the_viewer() -> None:
    """A game session needs no audio server: its beeps (the benchmark's beacon here) arrive as Opus."""
    config = RuntimeConfig(advertise_addresses=("127.0.0.1",), stats_interval_ms=100, game_beacon_ms=250)
    runtime = SessionRuntime(SessionSpec(id="game-sound", kind="game", width=320, height=240, fps=30), config)
    await runtime.start()
    viewer = Viewer(audio=True)
    try:
        assert "audio" not in runtime.pids  # no PulseAudio for the built-in game
        await viewer.connect(runtime.handle_signal)
        await viewer.wait_frames(3)
        assert runtime.stats()["audio_codec"] == "opus"
        await until(lambda: viewer.audio_frames >= 50, "no audio frames decoded")
        await until(lambda: hears(viewer, 1000), "no 1 kHz beacon in the sound received", deadline_s=10)
        assert not hears(viewer, 440)
    finally:
        await viewer.close()
        await runtime.stop()


async def test_audio_off_on_the_node_makes_every_session_silent() -> None:
    config = RuntimeConfig(advertise_addresses=("127.0.0.1",), stats_interval_ms=100, audio=False, game_beacon_ms=250)
    runtime = SessionRuntime(SessionSpec(id="game-mute", kind="game", width=320, height=240, fps=30), config)
    await runtime.start()
    viewer = Viewer(audio=True)
    try:
        await viewer.connect(runtime.handle_signal)
        await viewer.wait_frames(3)
        assert runtime.stats()["audio_codec"] is None and viewer.audio_frames == 0
    finally:
        await viewer.close()
        await runtime.stop()


async def test_an_audio_server_that_cannot_start_leaves_the_session_silent_not_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("streamer.desktop.audio.PULSEAUDIO", "false")  # starts, exits at once with status 1
    spec = SessionSpec(id="desk-mute", kind="desktop", width=320, height=240, fps=30, app_command=("sleep", "30"))
    runtime = SessionRuntime(spec, CONFIG)
    await runtime.start()
    viewer = Viewer(audio=True)
    try:
        pids = runtime.pids
        assert "audio" not in pids and "PULSE_SERVER" not in environ(pids["app"])
        await viewer.connect(runtime.handle_signal)
        await viewer.wait_frames(3)
        assert runtime.stats()["audio_codec"] is None and viewer.audio_frames == 0
    finally:
        await viewer.close()
        await runtime.stop()


async def test_a_node_that_refuses_root_sessions_fails_a_desktop_start_and_still_runs_the_game() -> None:
    why = "session programs would run as root: set NODE_SESSION_USER"
    config = dataclasses.replace(CONFIG, app_refusal=why)
    desktop = SessionRuntime(SessionSpec(id="desk-root", kind="desktop", width=320, height=240, fps=30,
                                         app_command=("sleep", "30")), config)
    with pytest.raises(SessionRefused, match="NODE_SESSION_USER"):
        await desktop.start()
    assert desktop.pids == {}  # nothing was started
    game = SessionRuntime(SessionSpec(id="game-root", kind="game", width=320, height=240, fps=30), config)
    await game.start()
    await game.stop()
