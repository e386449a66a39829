"""The built-in game's synth: blips where and when their events say, beacons on the render clock, no clicks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from streamer.desktop.game import Game
from streamer.desktop.gamesound import (
    VOICES,
    GameSynth,
    SoundEvent,
    SynthFramer,
    envelope,
)
from streamer.desktop.pcm import FRAME_BYTES, FRAME_SAMPLES
from tests.streamer.tone import tone_amplitude

FULL = 32767


def mono(pcm: bytes) -> np.ndarray:
    stereo = np.frombuffer(pcm, dtype="<i2").reshape(-1, 2)
    assert (stereo[:, 0] == stereo[:, 1]).all()
    return stereo[:, 0].astype(np.float64)


def onset_ms(signal: np.ndarray, start_ms: float, threshold: float = 0.01 * FULL) -> float | None:
    loud = np.nonzero(np.abs(signal) > threshold)[0]
    return None if len(loud) == 0 else start_ms + loud[0] / 48.0


def test_an_event_sounds_at_its_instant_with_its_voice_and_then_stops() -> None:
    synth = GameSynth()
    synth.add(SoundEvent("hit", 1_000_010.0))
    synth.add(SoundEvent("nonsense", 1_000_010.0))  # unknown kinds are ignored
    out = np.concatenate([mono(synth.render(1_000_000.0 + 20 * i, FRAME_SAMPLES)) for i in range(10)])
    voice = VOICES["hit"]
    start = onset_ms(out, 1_000_000.0)
    assert start is not None and 1_000_010.0 <= start <= 1_000_010.0 + 2.0  # within the attack ramp
    body = out[(10 * 48) : int((10 + voice.duration_ms) * 48)]
    assert tone_amplitude(body, voice.freq_hz) > 0.5 * voice.gain * FULL
    assert tone_amplitude(body, 1000) < 0.05 * voice.gain * FULL
    after = out[int((10 + voice.duration_ms) * 48) + 1 :]
    assert np.abs(after).max() == 0  # gone once its duration is over
    assert synth.events == 1 and synth.late_events == 0


def test_a_sound_spanning_windows_is_continuous_across_the_boundary() -> None:
    synth = GameSynth()
    synth.add(SoundEvent("hit", 15.0))
    a, b = mono(synth.render(0.0, FRAME_SAMPLES)), mono(synth.render(20.0, FRAME_SAMPLES))
    whole = GameSynth()
    whole.add(SoundEvent("hit", 15.0))
    assert np.array_equal(np.concatenate([a, b]), mono(whole.render(0.0, 2 * FRAME_SAMPLES)))


def test_an_event_for_a_window_already_rendered_plays_whole_at_the_next_one() -> None:
    synth = GameSynth()
    synth.render(0.0, FRAME_SAMPLES)
    synth.add(SoundEvent("hit", 5.0))  # its window [0, 20) went out already
    out = mono(synth.render(20.0, FRAME_SAMPLES * 6))
    assert onset_ms(out, 20.0) == pytest.approx(20.0, abs=2.0)
    assert synth.late_events == 1
    loud = np.nonzero(np.abs(out) > 0)[0]
    assert (loud[-1] - loud[0]) / 48.0 == pytest.approx(VOICES["hit"].duration_ms, abs=1.0)


def test_beacons_start_at_every_multiple_of_the_period_of_the_render_clock() -> None:
    synth = GameSynth(beacon_period_ms=250)
    start = 1_700_000_000_013.0  # not on a multiple
    out = np.concatenate([mono(synth.render(start + 20 * i, FRAME_SAMPLES)) for i in range(60)])  # 1.2 s
    loud = np.nonzero(np.abs(out) > 0.01 * FULL)[0]
    firsts = [int(loud[0])] + [int(b) for a, b in itertools.pairwise(loud) if b - a > 100 * 48]
    onsets = [start + i / 48.0 for i in firsts]  # the first loud sample after 100 ms of quiet
    expected = [t for t in range(1_700_000_000_250, 1_700_000_001_213, 250)]
    assert len(onsets) == len(expected) == synth.beacons
    for got, want in zip(onsets, expected, strict=True):
        assert want <= got <= want + 1.5  # the raised-cosine attack crosses 1 % within 1.5 ms
    assert tone_amplitude(out[(237 * 48) : (287 * 48)], 1000) > 0.3 * FULL


def test_the_envelope_has_no_step() -> None:
    t = np.arange(-5.0, 100.0, 1 / 48)
    env = envelope(t, 90.0)
    assert env.min() == 0.0 and env.max() == 1.0
    assert np.abs(np.diff(env)).max() < 0.02  # at most 2 % of full scale between samples: no click


def test_the_framer_renders_a_continuous_timeline_and_resyncs_after_a_stall() -> None:
    now = [1000.0]
    synth = GameSynth()
    framer = SynthFramer(synth, lambda: now[0])
    frames = []
    for _ in range(5):
        frames.append(framer.pop())
        now[0] += 21.0  # the track's pops drift a little: the timeline stays 20 ms a frame
    assert [f.pts for f in frames] == [i * FRAME_SAMPLES for i in range(5)]
    assert all(len(f.pcm) == FRAME_BYTES and not f.silent for f in frames)
    assert framer.resyncs == 0
    now[0] += 1000.0  # the track stalled a second: restart from the clock, not a burst of old audio
    synth.add(SoundEvent("hit", now[0]))
    f = framer.pop()
    assert framer.resyncs == 1 and onset_ms(mono(f.pcm), now[0]) == pytest.approx(now[0], abs=2.0)


def test_the_game_reports_a_hit_when_the_player_starts_touching_an_enemy() -> None:
    game = Game(320, 240)
    heard: list[SoundEvent] = []
    game.on_sound = heard.append
    touching_before = False
    starts = []
    for i in range(30 * 60):  # a minute at 30 fps; the player stays in the middle, enemies sweep across it
        now = 1_000_000 + i * 33
        scene = game.scene(now)
        p = scene.player
        touching = any(p.x < e.x + e.w and e.x < p.x + p.w and p.y < e.y + e.h and e.y < p.y + p.h
                       for e in scene.enemies)
        if touching and not touching_before:
            starts.append(now)
        touching_before = touching
    assert starts, "no enemy crossed the player in a minute: the test needs another path"
    assert {e.kind for e in heard} == {"hit"}
    # every new contact is a hit at that frame's clock (two enemies arriving together make two)
    assert sorted(set(e.at_ms for e in heard)) == starts
