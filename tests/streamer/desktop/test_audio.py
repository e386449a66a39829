"""A session's private PulseAudio and its capture: real pulseaudio, real pacat/parec, nothing left behind."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from streamer.desktop.audio import SINK_NAME, AudioCapture, AudioError, AudioServer, audio_available
from streamer.desktop.pcm import FRAME_SAMPLES, PcmFramer
from tests.procs import alive
from tests.streamer.tone import rms, sine_pcm, tone_amplitude

pytestmark = [
    pytest.mark.timeout(30),
    pytest.mark.skipif(audio_available() is not None, reason=f"no audio server: {audio_available()}"),
]



async def test_an_app_plays_into_the_sink_and_the_capture_hears_the_tone(tmp_path: Path) -> None:
    tone = tmp_path / "tone.raw"
    tone.write_bytes(sine_pcm(440, 3.0))
    server = AudioServer()
    await server.start()
    framer = PcmFramer(max_samples=48_000 * 4)  # keep everything: nobody pops while the tone plays
    capture = AudioCapture(server, framer)
    player = None
    try:
        env = server.app_env()
        assert env["PULSE_SERVER"] == f"unix:{server.socket_path}" and server.socket_path.is_socket()
        assert oct(server.socket_path.parent.stat().st_mode & 0o777) == "0o700"
        await capture.start()
        player = await asyncio.create_subprocess_exec(
            "pacat", "--raw", "--format=s16le", "--rate=48000", "--channels=2", str(tone),
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env},
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while framer.buffered_samples < 48_000 * 2:
            assert time.monotonic() < deadline, f"captured only {framer.buffered_samples} samples"
            await asyncio.sleep(0.05)
        frames = [framer.pop() for _ in range(framer.buffered_samples // FRAME_SAMPLES)]
        left = np.frombuffer(b"".join(f.pcm for f in frames), "<i2")[::2].astype(np.float64)
        loud = [i for i in range(0, len(left) - 4800, 4800) if rms(left[i : i + 4800]) > 3000]
        assert loud, f"no loud 100 ms window in {len(left)} samples (rms {rms(left):.0f})"
        window = left[loud[len(loud) // 2] : loud[len(loud) // 2] + 4800]
        assert tone_amplitude(window, 440) > 10_000  # 0.5 full scale = 16384; the sink keeps the level
        assert tone_amplitude(window, 1000) < 500
        pids = [server.pid, capture.pid, player.pid]
    finally:
        if player is not None and player.returncode is None:
            player.kill()
            await player.wait()
        await capture.close()
        await server.close()
    assert [pid for pid in pids if pid is not None and alive(pid)] == []
    assert not server.socket_path.parent.exists()


async def test_clients_cannot_stop_the_server_or_load_modules(tmp_path: Path) -> None:
    async with AudioServer() as server:
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **server.app_env()}
        for argv in (("pactl", "exit"), ("pactl", "load-module", "module-native-protocol-tcp")):
            proc = await asyncio.create_subprocess_exec(*argv, env=env, stderr=asyncio.subprocess.DEVNULL)
            assert await proc.wait() != 0, f"{argv} was allowed"
        info = await asyncio.create_subprocess_exec(
            "pactl", "list", "short", "sinks", env=env, stdout=asyncio.subprocess.PIPE
        )
        out, _ = await info.communicate()
        assert [line.split()[1] for line in out.decode().splitlines()] == [SINK_NAME]
        assert server.pid is not None and alive(server.pid)


async def test_a_server_that_cannot_start_says_why_and_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("streamer.desktop.audio.PULSEAUDIO", "/nonexistent/pulseaudio")
    server = AudioServer()
    with pytest.raises(AudioError, match="cannot run '/nonexistent/pulseaudio'"):
        await server.start()
    assert server.pid is None and not server.socket_path.parent.exists()  # its runtime dir is gone too
    with pytest.raises(AudioError, match="not started"):
        _ = AudioServer().socket_path
