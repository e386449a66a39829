"""Input messages: what the SDK builds passes the node's own parser; bad values are refused before the wire."""

from __future__ import annotations

import json
import math

import pytest

from rbclient import inputs
from streamer.desktop.inputs import InputError, parse_input


@pytest.mark.parametrize("message", [
    inputs.key("KeyW", True), inputs.key("ArrowLeft", False), inputs.pointer_move(0, 1),
    inputs.pointer_relative(-4096, 4096), inputs.pointer_relative(0, 3),
    inputs.pointer_button(5, True), inputs.wheel(-10, 2.5), inputs.gamepad(3, [0.0, -1.0] * 4, [1.0] * 17),
    inputs.clipboard("héllo"), inputs.ping(2**53 - 1, 12345.6), inputs.text("é€ßあ😀"), inputs.text("x" * 256),
])  # fmt: skip
def test_messages_pass_the_nodes_parser(message: dict[str, object]) -> None:
    assert not isinstance(parse_input(json.dumps(message)), InputError)


@pytest.mark.parametrize(("build", "words"), [
    (lambda: inputs.key("", True), "key code"),
    (lambda: inputs.key("K" * 33, True), "key code"),
    (lambda: inputs.pointer_move(1.01, 0), "x must be within"),
    (lambda: inputs.pointer_move(0, math.nan), "y must be a finite number"),
    (lambda: inputs.pointer_relative(4097, 0), "dx must be an integer"),
    (lambda: inputs.pointer_relative(0, 1.5), "dy must be an integer"),  # type: ignore[arg-type]
    (lambda: inputs.pointer_button(0, True), "button must be an integer"),
    (lambda: inputs.pointer_button(True, True), "button must be an integer"),  # type: ignore[arg-type]
    (lambda: inputs.wheel(0, 11), "dy must be within"),
    (lambda: inputs.gamepad(4, [], []), "gamepad index"),
    (lambda: inputs.gamepad(0, [0.0] * 9, []), "at most 8 axes"),
    (lambda: inputs.gamepad(0, [1.5], []), "axis 0"),
    (lambda: inputs.clipboard("x" * 65_537), "at most 65536"),
    (lambda: inputs.ping(-1, 0), "ping id"),
    (lambda: inputs.text(""), "text must be a string of 1..256"),
    (lambda: inputs.text("x" * 257), "text must be a string of 1..256"),
    (lambda: inputs.text("a\nb"), "U\\+000A is a control character"),
])  # fmt: skip
def test_out_of_range_values_are_refused_with_the_field(build: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        build()  # type: ignore[operator]


def test_relative_motion_integrates_and_clamps() -> None:
    p = inputs.Pointer(1280, 720)
    assert p.move_by(128, -72) == {"t": "pm", "x": pytest.approx(0.6), "y": pytest.approx(0.4)}
    assert p.move_by(10_000, 10_000) == {"t": "pm", "x": 1.0, "y": 1.0}
    p.resize(640, 360)
    assert p.move_by(-64, -36) == {"t": "pm", "x": pytest.approx(0.9), "y": pytest.approx(0.9)}
    assert p.move_to(0.25, 0) == {"t": "pm", "x": 0.25, "y": 0.0}
    assert parse_input(json.dumps(p.move_by(-1e9, 3))) is not None


def test_every_key_the_node_injects_has_an_sdl_scancode() -> None:
    from rbclient.keymap import SCANCODE_TO_CODE, code_for_scancode
    from streamer.desktop.inputs import KEYSYMS

    assert sorted(SCANCODE_TO_CODE.values()) == sorted(KEYSYMS)
    assert (code_for_scancode(4), code_for_scancode(39), code_for_scancode(79)) == ("KeyA", "Digit0", "ArrowRight")
    assert code_for_scancode(0) is None
