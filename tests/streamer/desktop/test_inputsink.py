"""Input routing: parse, count, answer pings at once, forward user input; the game sink applies on grab."""

from __future__ import annotations

import json
from typing import Any

from streamer.desktop.game import Game
from streamer.desktop.inputs import InputEvent, Key
from streamer.desktop.inputsink import GameSource, InputRouter


class RecordingSink:
    def __init__(self) -> None:
        self.events: list[InputEvent] = []
        self.releases = 0

    def submit(self, event: InputEvent) -> None:
        self.events.append(event)

    def release_all(self) -> None:
        self.releases += 1


def test_router_pings_counts_and_forwards() -> None:
    sink = RecordingSink()
    clock = iter(range(1000, 2000, 10))
    router = InputRouter(sink, clock_ms=lambda: next(clock))
    replies: list[dict[str, Any]] = []
    router.handle(json.dumps({"t": "ping", "id": 7, "ts": 12.5}), replies.append)
    router.handle('{"t":"ping","id":8,"ts":99}', replies.append)
    assert replies == [{"t": "pong", "id": 7, "ts": 12.5}, {"t": "pong", "id": 8, "ts": 99}]
    assert router.last_input_ms is None  # pings are not user activity
    router.handle('{"t":"rs","w":800,"h":600}', replies.append)
    assert router.last_input_ms is None and sink.events == []  # nor is a viewport resize
    router.handle('{"t":"pa","id":1,"rx":10,"rx_ms":5}', replies.append)
    assert router.last_input_ms is None and sink.events == []  # nor a probe answer on the wrong channel
    router.handle('{"t":"k","c":"KeyA","d":true}', replies.append)
    assert sink.events == [Key("KeyA", 0x61, True)] and router.last_input_ms == 1000
    for junk in ("nope", b"\xff\xfe", "[]", '{"t":"k","c":"NoSuchKey","d":true}', '{"t":"pm","x":2,"y":0}', "{}"):
        router.handle(junk, replies.append)
    assert router.accepted == 5 and router.dropped == 6
    snapshot = router.counters.snapshot()
    assert snapshot["accepted"] == {"k": 1, "pa": 1, "ping": 2, "rs": 1}
    assert sum(snapshot["dropped"].values()) == 6
    router.release_all()
    assert sink.releases == 1


def test_router_hands_viewer_stats_to_its_hook_and_they_are_no_activity() -> None:
    sink = RecordingSink()
    seen: list[tuple[float, ...]] = []
    router = InputRouter(sink, clock_ms=lambda: 1000, on_viewer_stats=seen.append)
    router.handle('{"t":"vs","g2g":[41.5,38]}', lambda m: None)
    router.handle('{"t":"vs","g2g":["x"]}', lambda m: None)  # dropped: the hook never sees it
    assert seen == [(41.5, 38.0)]
    assert router.last_input_ms is None and sink.events == []
    assert router.counters.snapshot() == {"accepted": {"vs": 1}, "dropped": {"bad_field_type": 1}}
    InputRouter(sink).handle('{"t":"vs","g2g":[1]}', lambda m: None)  # no hook: counted, nothing else


def test_router_survives_a_failing_sink() -> None:
    class Broken(RecordingSink):
        def submit(self, event: InputEvent) -> None:
            raise RuntimeError("boom")

    router = InputRouter(Broken())
    router.handle('{"t":"k","c":"KeyA","d":true}', lambda m: None)
    assert router.accepted == 1


def test_game_source_applies_input_on_the_frame_thread_before_rendering() -> None:
    clock = iter(range(1_000_000, 2_000_000, 50))  # 50 ms per frame
    source = GameSource(Game(320, 240), lambda: next(clock))
    source.grab()
    x0 = source._game.player_position()[0]
    source.submit(Key("ArrowRight", 0xFF53, True))
    assert source._game.player_position()[0] == x0  # queued, not applied on the submitting thread
    source.grab()
    source.grab()
    x1 = source._game.player_position()[0]
    assert x1 > x0
    source.release_all()
    source.grab()
    source.grab()
    assert source._game.player_position()[0] == x1  # released: the player stops
    assert source.stats().frames == 5
