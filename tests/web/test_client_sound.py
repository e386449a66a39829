"""Sound in Chromium: a desktop app's tone, through the session's PulseAudio and Opus, heard by the page.

A real ``render-node`` (as in ``test_client_stream.py``) runs a desktop whose app plays a 440 Hz sine
into its session's PulseAudio with ``pacat``.  The page offers audio (protocol v3), plays it in its
``#sound`` element, and a WebAudio analyser on that element's stream must find the tone: the
loudest bin near 440 Hz, well above the spectrum elsewhere, and an RMS clearly above silence.
"""

from __future__ import annotations

import asyncio
import shlex
import shutil
import time
from pathlib import Path

import aiohttp
import pytest

from streamer.desktop.audio import audio_available
from tests.conftest import ADMIN
from tests.procs import Proc
from tests.web.conftest import call, page_errors, user_token
from tests.web.test_client_stream import render_node, wait_host

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

TONE_HZ = 440

# Listen to #sound for half a second: peak frequency, its level and the median level (dBFS), time-domain RMS.
ANALYSE_JS = """async () => {
  const el = document.querySelector('#sound');
  const ctx = new AudioContext();
  await ctx.resume();
  const analyser = ctx.createAnalyser();
  analyser.fftSize = 8192;
  analyser.smoothingTimeConstant = 0;  // one spectrum, not averaged with the silence before it
  ctx.createMediaStreamSource(el.srcObject).connect(analyser);
  await new Promise((r) => setTimeout(r, 500));
  const bins = new Float32Array(analyser.frequencyBinCount);
  analyser.getFloatFrequencyData(bins);
  const wave = new Float32Array(analyser.fftSize);
  analyser.getFloatTimeDomainData(wave);
  let peak = 0;
  for (let i = 1; i < bins.length; i++) if (bins[i] > bins[peak]) peak = i;
  const sorted = Array.from(bins).sort((a, b) => a - b);
  const rms = Math.sqrt(wave.reduce((s, v) => s + v * v, 0) / wave.length);
  const out = { peakHz: peak * ctx.sampleRate / analyser.fftSize, peakDb: bins[peak],
                medianDb: sorted[sorted.length >> 1], rms, state: ctx.state, paused: el.paused };
  await ctx.close();
  return out;
}"""


AUDIO_STATS_JS = """async () => {
  let out = null;
  (await window.renderBroker.pc.getStats()).forEach((s) => {
    if (s.type === 'inbound-rtp' && s.kind === 'audio') out = { packets: s.packetsReceived, level: s.audioLevel,
      energy: s.totalAudioEnergy, samples: s.totalSamplesReceived };
  });
  return out;
}"""


async def test_a_desktop_apps_tone_is_heard_by_the_page(
    broker: Proc, http: aiohttp.ClientSession, browser, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tone_file: Path
) -> None:
    for tool in ("Xvfb", "openbox", "pacat"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (a desktop session with sound needs it)")
    if (why := audio_available()) is not None:
        pytest.skip(f"no audio server: {why}")
    play = (f"while :; do pacat --raw --format=s16le --rate=48000 --channels=2 {shlex.quote(str(tone_file))} "
            "|| exit 1; done")
    monkeypatch.setenv("NODE_APP_COMMAND", shlex.join(["sh", "-c", play]))  # render_node copies os.environ
    base, api = broker.url, f"{broker.url}/api/v1"
    await call(http, "PUT", f"{api}/pools/loud", ADMIN, {"kind": "desktop", "max_sessions_per_gpu": 1})
    async with render_node(base, "loud", tmp_path / "render-node.log") as node:
        await wait_host(http, base, node)
        token = await user_token(http, base, "listener")
        page = await browser.new_page()
        errors = page_errors(page)
        await page.goto(f"{base}/")
        await page.fill("#token", token)
        await page.click("#signin-submit")
        await page.locator('#pools article[data-pool="loud"] button').click()  # the click that allows sound
        await page.locator('body[data-view="stream"]').wait_for(timeout=20_000)
        sdp = await page.evaluate("window.renderBroker.pc.remoteDescription.sdp")
        assert "m=audio" in sdp and "opus/48000/2" in sdp and "a=sendonly" in sdp.split("m=audio")[1], sdp
        await page.wait_for_function("() => { const s = document.querySelector('#sound');"
                                     " return s.srcObject && !s.paused; }", timeout=10_000)  # fmt: skip
        # Chromium's own measure of the decoded sound (inbound-rtp audioLevel, 0..1) rises above silence
        deadline = time.monotonic() + 10
        while not ((audio_in := await page.evaluate(AUDIO_STATS_JS)) and audio_in["level"] > 0.1):
            assert time.monotonic() < deadline, f"no sound in the inbound audio stats: {audio_in}"
            await asyncio.sleep(0.1)
        assert audio_in["packets"] > 0 and audio_in["energy"] > 0, audio_in
        heard = await page.evaluate(ANALYSE_JS)
        assert heard["state"] == "running" and not heard["paused"], heard
        assert abs(heard["peakHz"] - TONE_HZ) < 15, heard  # bins are 48000/8192 = 5.9 Hz wide
        # the loudness is the RMS below; the peak only has to stand far above the rest of the spectrum (a
        # 170 ms window holding the gap where the tone file loops lost 0.5 dB under -20 once: -20.5)
        assert heard["peakDb"] > -30 and heard["peakDb"] - heard["medianDb"] > 40, heard
        assert heard["rms"] > 0.1, heard  # 0.5 full scale sine: RMS 0.35
        # the picture still plays in the video element: the sound did not replace it
        await page.wait_for_function("async () => (await window.renderBroker.stats())?.framesDecoded >= 10")
        # a desktop with sound gets lip sync (web/playout.js "sync"): no playout-delay extension, and the
        # video floor set from the measured audio and video delays (a step needs two readings 500 ms apart)
        assert "rtp-hdrext/playout-delay" not in sdp, sdp
        assert await page.get_attribute("#btn-sync", "aria-pressed") == "true"
        await page.wait_for_function("() => window.renderBroker.playout?.sync !== null", timeout=5_000)
        pl = await page.evaluate("window.renderBroker.playout")
        assert pl["mode"] == "sync" and pl["sync"]["soundMs"] > 0 and pl["targetMs"] >= 0, pl
        # the user turns it off: remembered for desktops, and the stream reconnects in "low"
        await page.click("#btn-sync")
        await page.wait_for_function("() => window.renderBroker.playout?.mode === 'low'"
                                     " && window.renderBroker.pc.connectionState === 'connected'", timeout=15_000)
        assert await page.get_attribute("#btn-sync", "aria-pressed") == "false"
        assert await page.evaluate("localStorage.getItem('rb.playout.desktop')") == "low"
        await page.wait_for_function("async () => (await window.renderBroker.stats())?.framesDecoded > 0")
        await page.click("#btn-end")
        await page.locator('body[data-view="ended"]').wait_for()
        assert not errors, errors
