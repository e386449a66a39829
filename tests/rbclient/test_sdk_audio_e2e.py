"""The client SDK hears a desktop session: an app's 440 Hz tone through the session's PulseAudio and Opus.

A real broker and render node run a desktop pool whose app plays a sine with ``pacat``; a guest's
``Stream(audio=True)`` offers a recvonly audio section, gets Opus back, and the decoded sound holds
the tone (Goertzel) while video frames keep arriving.  Skipped, with the reason, without Xvfb or
PulseAudio.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from rbclient import Broker, start
from streamer.desktop.audio import audio_available
from tests.conftest import ADMIN, auth
from tests.rbclient.sysfix import broker, node
from tests.streamer.tone import tone_amplitude
from tests.streamer.viewer import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
TONE_HZ = 440


def left_channel(frames: list[object]) -> np.ndarray:
    chunks = []
    for f in frames:
        pcm = f.to_ndarray()  # type: ignore[attr-defined]  # s16 packed: (1, samples * channels)
        chunks.append(pcm.reshape(-1)[:: len(f.layout.channels)].astype(np.float64))  # type: ignore[attr-defined]
    return np.concatenate(chunks) if chunks else np.zeros(0)


async def test_sdk_receives_a_desktop_apps_sound(
    redis_url: str, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tone_file: Path
) -> None:
    for tool in ("Xvfb", "openbox", "pacat"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (a desktop session with sound needs it)")
    if (why := audio_available()) is not None:
        pytest.skip(f"no audio server: {why}")
    play = (f"while :; do pacat --raw --format=s16le --rate=48000 --channels=2 {shlex.quote(str(tone_file))} "
            "|| exit 1; done")
    monkeypatch.setenv("NODE_APP_COMMAND", shlex.join(["sh", "-c", play]))  # the node inherits the environment
    async with broker(redis_url, prefix, tmp_path) as url, Broker(url) as client:
        async with aiohttp.ClientSession() as http, http.put(
                f"{url}/api/v1/pools/loud", json={"kind": "desktop", "max_sessions_per_gpu": 1,
                                                  "vram_per_session_mb": 1024}, headers=auth(ADMIN)) as r:
            assert r.status in (200, 201)
        await client.sign_in_guest()
        async with node(url, "loud", "node-loud", tmp_path / "node.log"):
            stream = await start(client, "loud", width=640, height=360, fps=30, audio=True,
                                 host_addresses=("127.0.0.1",), read_stamps=False)
            try:
                assert "m=audio" in stream.pc.remoteDescription.sdp
                await until(lambda: stream.audio_frames >= 75, "fewer than 1.5 s of sound arrived", deadline_s=30)

                def tone_level() -> float:
                    sound = left_channel(list(stream.audio)[-25:])  # the last 0.5 s
                    return tone_amplitude(sound, TONE_HZ) / 32767

                await until(lambda: tone_level() > 0.1, f"no {TONE_HZ} Hz tone in the sound", deadline_s=20)
                sound = left_channel(list(stream.audio)[-25:])
                assert tone_amplitude(sound, TONE_HZ) > 10 * tone_amplitude(sound, 1000)  # a tone, not noise
                frames = stream.frames_decoded
                await until(lambda: stream.frames_decoded > frames + 10, "video stopped while sound played")
            finally:
                ended = await stream.end()
            assert ended["end_reason"] == "user"
