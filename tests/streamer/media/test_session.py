"""SessionRuntime end to end: a real aiortc viewer in this process, real encoders, real Xvfb for desktops.

The viewer and the node meet on 127.0.0.1 only (both advertise it, as on a
loopback-only CI machine); no STUN server is involved.  Game sessions use
the built-in renderer, whose frames carry a stamp (frame number) and a
green player square that tests find in decoded frames.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from streamer.abr.bitrate import GAME_PROFILE, BitrateProfile, Feedback
from streamer.abr.control import RATE_MATCH_MAX_GAIN, StreamController
from streamer.abr.ladder import game_ladder
from streamer.desktop.audio import audio_available
from streamer.desktop.capture import CaptureError
from streamer.desktop.display import DisplayError
from streamer.desktop.game import Game, find_player, read_stamp
from streamer.media.session import DECISION_LOG_SIZE, RuntimeConfig, SessionRuntime, SessionSpec
from tests.procs import alive
from tests.streamer.viewer import Viewer, until

pytestmark = pytest.mark.timeout(60)
needs_desktop = pytest.mark.skipif(
    any(shutil.which(tool) is None for tool in ("Xvfb", "openbox", "xterm")),
    reason="desktop sessions need Xvfb, openbox and xterm (Debian packages xvfb, openbox, xterm)",
)

CONFIG = RuntimeConfig(advertise_addresses=("127.0.0.1",), stats_interval_ms=100)
GAME_W, GAME_H = 640, 360


class Events:
    """Collects on_event calls."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, name: str, info: dict[str, Any]) -> None:
        self.seen.append((name, info))

    def names(self) -> list[str]:
        return [name for name, _ in self.seen]


def session_threads(session_id: str) -> list[str]:
    return [
        t.name for t in threading.enumerate() if t.name.startswith(("rb-frames-", "rb-input-")) and session_id in t.name
    ]



@pytest.fixture
async def game() -> AsyncIterator[tuple[SessionRuntime, Events]]:
    events = Events()
    runtime = SessionRuntime(SessionSpec(id="game-1", kind="game", width=GAME_W, height=GAME_H, fps=30), CONFIG,
                             on_event=events)  # fmt: skip
    await runtime.start()
    yield runtime, events
    await runtime.stop()
    assert session_threads("game-1") == []


@pytest.fixture
async def viewer() -> AsyncIterator[Viewer]:
    v = Viewer()
    yield v
    await v.close()


async def test_game_streams_stamped_frames_and_input_moves_the_player(
    game: tuple[SessionRuntime, Events], viewer: Viewer
) -> None:
    runtime, events = game
    await viewer.connect(runtime.handle_signal)
    frames = await viewer.wait_frames(10)
    assert frames[0].key_frame
    assert {(f.width, f.height) for f in frames} == {(GAME_W, GAME_H)}
    stamps = [read_stamp(image) for image in list(viewer.images)[-5:]]
    numbers = [s.frame_no for s in stamps if s is not None]
    assert len(numbers) >= 4 and numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    await until(lambda: "connected" in events.names(), "no connected event")

    start = find_player(viewer.images[-1])
    assert start is not None
    viewer.send({"t": "k", "c": "ArrowRight", "d": True})
    await until(lambda: (p := find_player(viewer.images[-1])) is not None and p[0] > start[0] + 20,
                "the player did not move right")  # fmt: skip
    viewer.send({"t": "k", "c": "ArrowRight", "d": False})

    viewer.send({"t": "ping", "id": 42, "ts": 1234.5})
    pong = await viewer.wait_message(lambda m: m.get("t") == "pong", "pong")
    assert pong == {"t": "pong", "id": 42, "ts": 1234.5}

    for junk in ("not json", '{"t":"nope"}', '{"t":"k","c":"KeyA"}', b"\xff" * 10):
        viewer.send(junk)
    await until(lambda: runtime.stats()["input_dropped"] == 4, "malformed messages were not counted")
    count = len(viewer.frames)
    await viewer.wait_frames(10, after=count)  # still streaming
    stats = runtime.stats()
    assert stats["input_accepted"] == 3 and stats["input"]["accepted"] == {"k": 2, "ping": 1}
    assert stats["last_input_ms"] is not None
    assert stats["connected"] is True and stats["encoder"] == "libx264" and stats["codec"] == "H264"
    assert stats["candidate"] == "host"  # a direct loopback path (relay is proven in tests/netem/test_turn.py)
    assert (stats["width"], stats["height"]) == (GAME_W, GAME_H)


async def test_feedback_reaches_the_controller_and_stats(game: tuple[SessionRuntime, Events], viewer: Viewer) -> None:
    runtime, _events = game
    await viewer.connect(runtime.handle_signal)
    # aiortc's receiver sends a receiver report every 0.5-1.5 s and REMB with its estimate.
    await until(lambda: runtime.stats()["rtt_ms"] is not None, "no RTT from receiver reports")
    await until(lambda: runtime.stats()["remb_bps"] is not None, "no REMB")
    await until(lambda: runtime.stats()["bitrate_bps"] not in (None, 0), "no send rate")
    stats = runtime.stats()
    assert stats["jitter_ms"] is not None and 0.0 <= stats["loss"] <= 1.0
    assert stats["target_bps"] is not None and stats["bitrate_reason"] is not None
    # libx264 follows every target live (applied by the frame thread at the next frame).
    # It gets the target x the rate-match gain (1 to 1.3: a one-frame VBV spends less than its bitrate).
    await until(lambda: (s := runtime.stats())["encoder_bitrate_bps"] == s["encoder_bps"], "encoder not following")
    s = runtime.stats()
    assert s["target_bps"] <= s["encoder_bps"] <= s["target_bps"] * RATE_MATCH_MAX_GAIN + 1
    assert stats["fps"] > 0
    message = await viewer.wait_message(lambda m: m.get("t") == "stats", "stats event")
    assert {"fps", "bitrate_bps", "target_bps", "rtt_ms", "encoder"} <= set(message)


async def test_delay_probes_feed_the_controller_round_trips_and_the_receive_rate(
    game: tuple[SessionRuntime, Events], viewer: Viewer
) -> None:
    runtime, _events = game
    await viewer.connect(runtime.handle_signal)

    def probed() -> list[dict[str, Any]]:
        return [d for d in runtime.stats()["decisions"] if d["recv_rate_bps"] and d["probe_rtt_ms"] is not None]

    # 12 steps (1.2 s at 100 ms): past the start, where the send rate (a 500 ms average) still
    # holds the first frames and the viewer's rate (300 ms) does not
    await until(lambda: len(probed()) >= 12, "no control step with probe answers")
    steps = probed()
    assert all(d["fast"] for d in steps)
    # loopback: a probe's round trip is a few milliseconds, and the viewer receives what we send
    assert all(0.0 <= d["probe_rtt_ms"] < 200.0 for d in steps)
    last = steps[-1]
    assert 0.5 * last["send_rate_bps"] < last["recv_rate_bps"] < 1.5 * last["send_rate_bps"], last
    # without the probe channel the controller runs on RTCP alone
    await viewer.close()
    plain = Viewer(probes=False)
    try:
        await plain.connect(runtime.handle_signal)
        await plain.wait_frames(10)
        await asyncio.sleep(1.0)
        recent = runtime.stats()["decisions"][-3:]
        assert recent and not any(d["fast"] for d in recent) and all(d["recv_rate_bps"] is None for d in recent)
    finally:
        await plain.close()


async def test_every_control_step_is_kept_as_telemetry_in_stats(viewer: Viewer) -> None:
    rendered: list[tuple[int, int]] = []

    def make_game(width: int, height: int) -> Game:
        rendered.append((width, height))
        return Game(width, height)

    spec = SessionSpec(id="game-tele", kind="game", width=320, height=240, fps=30)
    runtime = SessionRuntime(spec, CONFIG, game_factory=make_game)
    await runtime.start()
    try:
        assert rendered == [(320, 240)]  # the factory made the session's game
        await viewer.connect(runtime.handle_signal)
        await until(lambda: len(runtime.stats()["decisions"]) >= 3, "no decisions recorded")
        await until(lambda: any(d["rtt_ms"] is not None for d in runtime.stats()["decisions"]), "no RTT in decisions")
        stats = runtime.stats()
        decisions = stats["decisions"]
        assert decisions[0]["reason"] == "start" and decisions[0]["rung"] == "320x240@30"
        times = [d["now_ms"] for d in decisions]
        assert times == sorted(times) and len(set(times)) == len(times)
        assert decisions[-1]["target_bps"] == stats["target_bps"] and decisions[-1]["reason"] == stats["bitrate_reason"]
        assert {"remb_bps", "send_rate_bps", "jitter_ms", "loss", "app_limited", "ladder_reason"} <= set(decisions[-1])
        assert sum(stats["decision_counts"].values()) >= len(decisions) and stats["decision_counts"]["start"] == 1
        await until(lambda: sum(runtime.stats()["decision_counts"].values()) > DECISION_LOG_SIZE,
                    "fewer steps than the log size", deadline_s=30)  # fmt: skip
        assert len(runtime.stats()["decisions"]) == DECISION_LOG_SIZE  # bounded: the oldest went
        assert runtime.stats()["decisions"][0]["reason"] != "start"
    finally:
        await runtime.stop()


async def test_pli_from_the_viewer_yields_a_keyframe(game: tuple[SessionRuntime, Events], viewer: Viewer) -> None:
    runtime, _events = game
    await viewer.connect(runtime.handle_signal)
    await viewer.wait_frames(5)
    assert runtime.stats()["keyframes"] == 1
    count = len(viewer.frames)
    await viewer.send_pli()
    await until(lambda: runtime.stats()["keyframes"] == 2, "PLI did not make a keyframe")
    assert runtime.stats()["keyframe_requests"] == 1
    await until(lambda: any(f.key_frame for f in viewer.frames[count:]), "the viewer decoded no new keyframe")


async def test_a_picture_frozen_while_packets_arrive_gets_a_keyframe_without_a_pli(
    game: tuple[SessionRuntime, Events], viewer: Viewer
) -> None:
    runtime, _events = game
    await viewer.connect(runtime.handle_signal)
    await viewer.wait_frames(5)
    await until(lambda: runtime.stats()["keyframes"] == 1, "no first keyframe")
    assert runtime.stats()["stall_keyframes"] == 0  # frames decode: no stall
    # time to first frame: the offer answered -> the first frame the probe answers say was decoded
    await until(lambda: runtime.stats()["first_frame_ms"] is not None, "no time to first frame")
    assert 0 < runtime.stats()["first_frame_ms"] < 30_000
    freezes = runtime.stats()["freezes"]  # 0 unless this machine stalled the stream 200 ms already
    viewer.frozen_at = len(viewer.frames)  # the probe answers now say nothing decodes
    count = len(viewer.frames)
    await until(lambda: runtime.stats()["stall_keyframes"] >= 1, "no keyframe for a frozen picture")
    await until(lambda: runtime.stats()["freezes"] >= freezes + 1, "the frozen picture was not counted a freeze")
    frozen_s = asyncio.get_running_loop().time()
    await until(lambda: any(f.key_frame for f in viewer.frames[count:]), "the viewer decoded no new keyframe")
    assert runtime.stats()["keyframe_requests"] == 0  # the node's own doing, no PLI/FIR
    # while the stall lasts: one more at most every stall_keyframe_interval_ms (500 ms)
    interval_s = runtime.config.stall_keyframe_interval_ms / 1000
    assert interval_s == 0.5
    await asyncio.sleep(1.5)
    elapsed = asyncio.get_running_loop().time() - frozen_s
    assert 3 <= runtime.stats()["stall_keyframes"] <= 2 + int(elapsed / interval_s)
    viewer.frozen_at = None  # decoding again: no more
    await asyncio.sleep(0.5)
    thawed = runtime.stats()["stall_keyframes"]
    await asyncio.sleep(1.5)
    assert runtime.stats()["stall_keyframes"] == thawed


async def test_a_viewer_can_leave_and_another_connect(game: tuple[SessionRuntime, Events]) -> None:
    runtime, events = game
    first = Viewer()
    await first.connect(runtime.handle_signal)
    await first.wait_frames(3)
    await until(lambda: events.names() == ["connected"], "no connected event")
    assert await runtime.handle_signal({"type": "bye"}) == []
    await until(lambda: events.names() == ["connected", "disconnected"], "no disconnected event")
    assert runtime.stats()["connected"] is False
    await first.close()
    frames_before = runtime.stats()["frames"]

    second = Viewer()
    try:
        await second.connect(runtime.handle_signal)
        received = await second.wait_frames(5)
        assert received[0].key_frame  # the new viewer's decoder starts with a keyframe
        await until(lambda: events.names()[-1] == "connected", "no connected event for the second viewer")
        stats = runtime.stats()
        assert stats["viewers"] == 2 and stats["frames"] > frames_before and stats["state"] == "running"
        # A third offer replaces the second viewer without a bye.
        third = Viewer()
        try:
            await third.connect(runtime.handle_signal)
            assert (await third.wait_frames(3))[0].key_frame
        finally:
            await third.close()
        assert "disconnected" in events.names()[-3:]
    finally:
        await second.close()


@pytest.mark.parametrize(("profile_codec", "viewer_codecs"), [("vp8", None), ("auto", ("VP8",))])
async def test_vp8_when_the_profile_or_the_viewer_wants_it(profile_codec: str, viewer_codecs: Any) -> None:
    spec = SessionSpec(id="game-vp8", kind="game", width=320, height=240, fps=30, codec=profile_codec)
    runtime = SessionRuntime(spec, CONFIG)
    await runtime.start()
    viewer = Viewer(codecs=viewer_codecs)
    try:
        await viewer.connect(runtime.handle_signal)
        frames = await viewer.wait_frames(5)
        assert {(f.width, f.height) for f in frames} == {(320, 240)}
        assert runtime.stats()["encoder"] == "libvpx" and runtime.stats()["codec"] == "VP8"
        answer = viewer.pc.remoteDescription.sdp
        assert re.search(r"a=rtpmap:\d+ VP8/90000", answer) and not re.search(r"a=rtpmap:\d+ H264/", answer)
    finally:
        await viewer.close()
        await runtime.stop()


async def test_answer_offers_only_configured_addresses_and_no_stun(game: tuple[SessionRuntime, Events]) -> None:
    runtime, _events = game
    viewer = Viewer()
    try:
        replies = await runtime.handle_signal(await viewer.offer())
        sdp = replies[0]["sdp"]
        hosts = set(re.findall(r"a=candidate:\S+ \d+ udp \d+ (\S+) \d+ typ (\w+)", sdp))
        assert hosts == {("127.0.0.1", "host")}
        assert "a=rtpmap:" in sdp and re.search(r"a=rtpmap:\d+ H264/90000", sdp)
        assert re.search(r"profile-level-id=42e01f", sdp) and "packetization-mode=1" in sdp
        assert not re.search(r"a=rtpmap:\d+ VP8/90000", sdp)  # only the codec we encode
    finally:
        await viewer.close()


async def test_bad_signaling_is_answered_not_raised(game: tuple[SessionRuntime, Events], viewer: Viewer) -> None:
    runtime, _events = game
    for msg in ({"type": "offer"}, {"type": "offer", "sdp": "garbage"}):
        replies = await runtime.handle_signal(msg)
        assert len(replies) == 1 and replies[0]["type"] == "error"
    assert await runtime.handle_signal({"type": "candidate", "candidate": "junk"}) == []  # no viewer yet
    assert await runtime.handle_signal({"type": "peer_joined"}) == []
    assert await runtime.handle_signal({"type": "what"}) == []
    await viewer.connect(runtime.handle_signal)
    assert await runtime.handle_signal({"type": "candidate", "candidate": "candidate:junk", "sdpMid": "0"}) == []
    assert await runtime.handle_signal({"type": "candidate", "candidate": "", "sdpMid": "0"}) == []
    await viewer.wait_frames(3)
    assert runtime.state == "running"


async def test_warnings_reach_current_and_later_viewers(game: tuple[SessionRuntime, Events]) -> None:
    runtime, _events = game
    await runtime.warn("ending_soon", "maintenance", 300)  # nobody connected yet
    viewer = Viewer()
    try:
        await viewer.connect(runtime.handle_signal)
        warning = await viewer.wait_message(lambda m: m.get("t") == "warn", "warning")
        assert warning == {"t": "warn", "code": "ending_soon", "detail": "maintenance", "ends_in_s": 300}
        await runtime.warn("ending_soon", "now", 60)
        await viewer.wait_message(lambda m: m.get("t") == "warn" and m["ends_in_s"] == 60, "second warning")
    finally:
        await viewer.close()


async def test_stop_is_idempotent_and_signals_after_stop_are_refused() -> None:
    events = Events()
    runtime = SessionRuntime(SessionSpec(id="game-stop", kind="game", width=320, height=240, fps=30), CONFIG,
                             on_event=events)  # fmt: skip
    await runtime.start()
    viewer = Viewer()
    try:
        await viewer.connect(runtime.handle_signal)
        await viewer.wait_frames(3)
        assert session_threads("game-stop") == ["rb-frames-game-stop"]
        await asyncio.gather(runtime.stop("admin"), runtime.stop("again"))
        await runtime.stop()
        assert runtime.state == "stopped" and session_threads("game-stop") == []
        assert "ended" not in events.names()  # the owner stopped it: no event
        replies = await runtime.handle_signal(await Viewer().offer())
        assert replies[0]["type"] == "error" and replies[0]["code"] == "not_running"
    finally:
        await viewer.close()


async def test_a_ladder_step_reopens_the_encoder_at_the_new_rung(viewer: Viewer) -> None:
    """A game ladder step (960x540 -> 640x360, keep fps) reaches the viewer as a keyframe at the new size.

    The viewer's REMB cannot be steered from here, so the step is produced by the
    pure policies under a fake clock and applied through the runtime's own apply step.
    """
    spec = SessionSpec(id="game-ladder", kind="game", width=960, height=540, fps=30)
    runtime = SessionRuntime(spec, CONFIG)
    await runtime.start()
    try:
        await viewer.connect(runtime.handle_signal)
        await viewer.wait_frames(3)
        assert (runtime.stats()["width"], runtime.stats()["height"]) == (960, 540)
        # A low floor lets a 400 kbps REMB pull the target under 540p30's floor (778 kbps).
        profile = BitrateProfile("low", min_bps=200_000, max_bps=GAME_PROFILE.max_bps, start_bps=GAME_PROFILE.start_bps)
        controller = StreamController(profile, game_ladder(960, 540, 30))
        steps = [controller.update(Feedback(remb_bps=400_000), ms) for ms in range(0, 3000, 200)]
        changed = [s for s in steps if s.ladder.changed]
        assert len(changed) == 1
        step = changed[0]
        assert (step.ladder.rung.width, step.ladder.rung.height, step.ladder.rung.fps) == (640, 360, 30)
        count = len(viewer.frames)
        await runtime._apply(step)  # the control loop's apply, with a decision made above
        await until(lambda: any((f.width, f.height) == (640, 360) for f in viewer.frames[count:]), "no 640x360")
        first = next(f for f in viewer.frames[count:] if (f.width, f.height) == (640, 360))
        assert first.key_frame
        stats = runtime.stats()
        assert (stats["width"], stats["height"], stats["target_fps"]) == (640, 360, 30)
    finally:
        await runtime.stop()


async def test_malformed_ice_servers_fail_the_start() -> None:
    spec = SessionSpec(id="game-ice", kind="game", width=320, height=240, fps=30,
                       ice_servers=({"urls": ["http://not-a-stun-url"]},))  # fmt: skip
    runtime = SessionRuntime(spec, CONFIG)
    with pytest.raises(ValueError):
        await runtime.start()
    assert runtime.state == "stopped" and session_threads("game-ice") == []


def test_spec_validation() -> None:
    with pytest.raises(ValueError):
        SessionSpec(id="x", kind="vm", width=640, height=360, fps=30)
    with pytest.raises(ValueError):
        SessionSpec(id="x", kind="game", width=641, height=360, fps=30)
    with pytest.raises(ValueError):
        SessionSpec(id="x", kind="game", width=640, height=360, fps=30, codec="av1")
    with pytest.raises(ValueError):
        RuntimeConfig(capture_backend="gdi")
    with pytest.raises(ValueError, match="gpu"):
        SessionSpec(id="x", kind="game", width=640, height=360, fps=30, gpu=-1)
    with pytest.raises(ValueError, match="gpu"):
        SessionSpec(id="x", kind="game", width=640, height=360, fps=30, gpu=64)


@pytest.mark.parametrize(
    ("renderer", "gpu_render", "gpu", "source"),
    [("gl", False, None, "game-gl"), ("auto", False, 3, "game"), ("cpu", True, 0, "game"),
     ("auto", True, 7, "game")],  # EGL has no device 7 here: auto falls back to numpy
)
async def test_the_game_renders_where_the_config_says(
    renderer: str, gpu_render: bool, gpu: int | None, source: str, viewer: Viewer
) -> None:
    from streamer.desktop.glgame import probe_gl

    ok, why = await asyncio.to_thread(probe_gl, None)
    if renderer == "gl" and not ok:
        pytest.skip(f"no OpenGL through EGL here: {why}")
    spec = SessionSpec(id=f"game-r-{renderer}-{gpu}", kind="game", width=320, height=240, fps=30, gpu=gpu)
    config = RuntimeConfig(advertise_addresses=("127.0.0.1",), gpu_render=gpu_render, game_renderer=renderer)
    runtime = SessionRuntime(spec, config, on_event=Events())
    await runtime.start()
    try:
        assert runtime.stats()["source"] == source
        assert runtime.stats()["gpu"] == (gpu if gpu_render else None)
        await viewer.connect(runtime.handle_signal)
        await viewer.wait_frames(3)
        stamps = [read_stamp(image) for image in list(viewer.images)[-3:]]
        assert len(stamps) == 3 and all(s is not None for s in stamps)
    finally:
        await runtime.stop()


async def test_a_required_gl_renderer_that_cannot_start_fails_the_start() -> None:
    spec = SessionSpec(id="game-gl-missing", kind="game", width=320, height=240, fps=30, gpu=7)
    config = RuntimeConfig(advertise_addresses=("127.0.0.1",), gpu_render=True, game_renderer="gl")
    runtime = SessionRuntime(spec, config, on_event=Events())
    with pytest.raises(CaptureError, match="GL game renderer unavailable"):
        await runtime.start()
    await runtime.stop()
    assert session_threads("game-gl-missing") == []


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


@needs_desktop
@pytest.mark.parametrize("gpu_render", [True, False])
async def test_a_desktop_app_runs_on_the_seated_gpu_only_on_a_gpu_host(
    gpu_render: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a host with NVIDIA GPUs the app gets NVIDIA's GLX and only its seat's GPU; a CPU host's
    pseudo-GPU changes nothing (its apps keep Mesa).  The node's tokens never reach the app."""
    monkeypatch.setenv("NODE_NODE_TOKEN", "node-secret")
    monkeypatch.setenv("BROKER_ADMIN_TOKEN", "admin-secret")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    spec = SessionSpec(id=f"desk-gpu-{gpu_render}", kind="desktop", width=320, height=240, fps=30,
                       app_command=("sleep", "30"), gpu=3)
    config = RuntimeConfig(advertise_addresses=("127.0.0.1",), gpu_render=gpu_render)
    runtime = SessionRuntime(spec, config, on_event=Events())
    await runtime.start()
    try:
        env = _environ(runtime.pids["app"])
    finally:
        await runtime.stop()
    assert "node-secret" not in env.values() and "admin-secret" not in env.values()
    assert env["LC_ALL"] == "C.UTF-8" and env["PATH"] and env["DISPLAY"]
    if gpu_render:
        assert (env["__GLX_VENDOR_LIBRARY_NAME"], env["CUDA_VISIBLE_DEVICES"], env["RB_GPU_INDEX"]) == (
            "nvidia", "3", "3")
    else:
        assert "RB_GPU_INDEX" not in env and env.get("__GLX_VENDOR_LIBRARY_NAME") != "nvidia"


# --- desktops on Xvfb --------------------------------------------------------------------------------

_KEYS = {" ": ("Space", False), ">": ("Period", True), "/": ("Slash", False), ".": ("Period", False),
         "_": ("Minus", True), "-": ("Minus", False), "\n": ("Enter", False)}  # fmt: skip


def type_text(viewer: Viewer, text: str) -> None:
    """Type ``text`` as a browser would send it: KeyboardEvent.code downs and ups (US layout)."""
    for char in text:
        if char.isalpha():
            code, shift = f"Key{char.upper()}", char.isupper()
        elif char.isdigit():
            code, shift = f"Digit{char}", False
        else:
            code, shift = _KEYS[char]
        if shift:
            viewer.send({"t": "k", "c": "ShiftLeft", "d": True})
        viewer.send({"t": "k", "c": code, "d": True})
        viewer.send({"t": "k", "c": code, "d": False})
        if shift:
            viewer.send({"t": "k", "c": "ShiftLeft", "d": False})


@needs_desktop
async def test_desktop_typing_runs_a_command_and_stop_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "typed_hi.txt"
    ready = tmp_path / "shell_ready"
    # The marker says the shell runs on a configured pty: keys typed before that may be flushed.
    app = ("xterm", "-e", "sh", "-c", f"touch {ready}; exec sh -i")
    spec = SessionSpec(id="desk-1", kind="desktop", width=800, height=600, fps=30, app_command=app)
    events = Events()
    runtime = SessionRuntime(spec, CONFIG, on_event=events)
    await runtime.start()
    pids = runtime.pids
    sound = {"audio", "audio_capture"} if audio_available() is None else set()  # the session's PulseAudio + parec
    assert set(pids) == {"xvfb", "wm", "app"} | sound
    viewer = Viewer()
    try:
        await viewer.connect(runtime.handle_signal)
        frames = await viewer.wait_frames(5)
        assert {(f.width, f.height) for f in frames} == {(800, 600)}
        await until(ready.exists, "the shell in xterm never started")
        type_text(viewer, f"echo hi > {target}\n")
        await until(lambda: target.exists() and target.read_text() == "hi\n", "the typed command never ran")
        assert runtime.stats()["input_accepted"] > 0
    finally:
        await viewer.close()
        await runtime.stop()
    assert [role for role, pid in pids.items() if alive(pid)] == []
    assert session_threads("desk-1") == []
    assert "ended" not in events.names()


@needs_desktop
async def test_desktop_app_exit_ends_the_session(tmp_path: Path) -> None:
    release = tmp_path / "exit_now"
    app = ("sh", "-c", f"while [ ! -e {release} ]; do sleep 0.05; done")
    events = Events()
    spec = SessionSpec(id="desk-exit", kind="desktop", width=320, height=240, fps=30, app_command=app)
    runtime = SessionRuntime(spec, CONFIG, on_event=events)
    await runtime.start()
    pids = runtime.pids
    release.touch()
    await until(lambda: "ended" in events.names(), "no ended event after the app exited")
    name, info = events.seen[-1]
    assert info["reason"] == "app_exited"
    await until(lambda: runtime.state == "stopped", "the runtime did not stop itself")
    await runtime.stop()  # the owner's stop after an "ended" event is a no-op
    assert [role for role, pid in pids.items() if alive(pid)] == []
    assert session_threads("desk-exit") == []


@needs_desktop
async def test_a_failed_start_cleans_up() -> None:
    spec = SessionSpec(id="desk-bad", kind="desktop", width=320, height=240, fps=30,
                       app_command=("/nonexistent/app",))  # fmt: skip
    runtime = SessionRuntime(spec, CONFIG)
    with pytest.raises(DisplayError):  # Xvfb and the WM started, the app cannot
        await runtime.start()
    pids = runtime.pids
    assert {"xvfb", "wm"} <= set(pids)
    assert runtime.state == "stopped"
    assert [role for role, pid in pids.items() if alive(pid)] == []
    assert session_threads("desk-bad") == []
