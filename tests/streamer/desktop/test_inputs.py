"""Input message parsing: every type, every limit, every malformed shape."""

from __future__ import annotations

import json

import pytest
from Xlib import XK

from broker.protocol import (
    CLIPBOARD_MAX_CHARS,
    GAMEPAD_MAX_AXES,
    GAMEPAD_MAX_BUTTONS,
    POINTER_MAX_DELTA,
    TEXT_MAX_CHARS,
    VIEWER_STATS_MAX_SAMPLES,
    InputType,
)
from streamer.desktop.inputs import (
    INPUT_MAX_BYTES,
    KEYSYMS,
    Clipboard,
    DropReason,
    Gamepad,
    InputCounters,
    InputError,
    Key,
    Ping,
    PointerButton,
    PointerMove,
    PointerRelative,
    ProbeAck,
    Resize,
    Text,
    ViewerStats,
    Wheel,
    keysym_for_code,
    parse_input,
)

ACCEPTED = [
    ({"t": "pm", "x": 0, "y": 1}, PointerMove(0.0, 1.0)),
    ({"t": "pm", "x": 0.25, "y": 0.5}, PointerMove(0.25, 0.5)),
    ({"t": "pr", "dx": 3, "dy": -7}, PointerRelative(3, -7)),
    (
        {"t": "pr", "dx": -POINTER_MAX_DELTA, "dy": POINTER_MAX_DELTA},
        PointerRelative(-POINTER_MAX_DELTA, POINTER_MAX_DELTA),
    ),
    ({"t": "pr", "dx": 2.0, "dy": 0}, PointerRelative(2, 0)),  # JS numbers: 2.0 is 2
    ({"t": "pb", "b": 1, "d": True}, PointerButton(1, True)),
    ({"t": "pb", "b": 5, "d": False}, PointerButton(5, False)),
    ({"t": "pb", "b": 3.0, "d": False}, PointerButton(3, False)),  # JS numbers: 3.0 is 3
    ({"t": "pw", "dx": 0, "dy": -10}, Wheel(0.0, -10.0)),
    ({"t": "pw", "dx": 10, "dy": 0.25}, Wheel(10.0, 0.25)),
    ({"t": "k", "c": "KeyA", "d": True}, Key("KeyA", 0x61, True)),
    ({"t": "k", "c": "Enter", "d": False}, Key("Enter", 0xFF0D, False)),
    ({"t": "gp", "i": 0, "ax": [], "bt": []}, Gamepad(0, (), ())),
    (
        {"t": "gp", "i": 3, "ax": [-1, 1, 0.5], "bt": [0, 1, 0.5]},
        Gamepad(3, (-1.0, 1.0, 0.5), (0.0, 1.0, 0.5)),
    ),
    ({"t": "cb", "text": ""}, Clipboard("")),
    ({"t": "cb", "text": "héllo 😀"}, Clipboard("héllo 😀")),
    ({"t": "cb", "text": "x" * CLIPBOARD_MAX_CHARS}, Clipboard("x" * CLIPBOARD_MAX_CHARS)),
    ({"t": "tx", "text": "é"}, Text("é")),
    ({"t": "tx", "text": "あいう😀 ß€"}, Text("あいう😀 ß€")),
    ({"t": "tx", "text": "😀" * TEXT_MAX_CHARS}, Text("😀" * TEXT_MAX_CHARS)),  # code points, not UTF-16 units
    ({"t": "rs", "w": 1920, "h": 1080}, Resize(1920, 1080)),
    ({"t": "ping", "id": 7, "ts": 1764700000000.5}, Ping(7, 1764700000000.5)),
    ({"t": "pa", "id": 3, "rx": 1200, "rx_ms": 5123.25}, ProbeAck(3, 1200, 5123.25)),
    ({"t": "pa", "id": 0, "rx": 0, "rx_ms": 0}, ProbeAck(0, 0, 0.0)),
    ({"t": "vs", "g2g": [41.2, 38, -3.5, 90000]}, ViewerStats((41.2, 38.0, -3.5, 90000.0))),  # range: glass.py's
    ({"t": "vs", "g2g": []}, ViewerStats(())),
    ({"t": "vs", "g2g": [1] * VIEWER_STATS_MAX_SAMPLES}, ViewerStats((1.0,) * VIEWER_STATS_MAX_SAMPLES)),
    ({"t": "pm", "x": 0.5, "y": 0.5, "extra": "ignored"}, PointerMove(0.5, 0.5)),
]


@pytest.mark.parametrize(("message", "expected"), ACCEPTED)
def test_accepts(message: dict[str, object], expected: object) -> None:
    assert parse_input(json.dumps(message)) == expected
    assert parse_input(json.dumps(message).encode()) == expected


def test_every_input_type_has_an_accepted_case() -> None:
    covered = {type(expected).TYPE for _, expected in ACCEPTED}  # type: ignore[attr-defined]
    assert covered == set(InputType)


REJECTED = [
    # (raw message, reason)
    ("", DropReason.NOT_JSON),
    ("{", DropReason.NOT_JSON),
    (b"\xff\xfe", DropReason.NOT_JSON),
    ('{"t":"pm","x":NaN,"y":0}', DropReason.NOT_JSON),
    ('{"t":"pm","x":Infinity,"y":0}', DropReason.NOT_JSON),
    ("[1,2]", DropReason.NOT_OBJECT),
    ('"pm"', DropReason.NOT_OBJECT),
    ("null", DropReason.NOT_OBJECT),
    ("{}", DropReason.UNKNOWN_TYPE),
    ('{"t":"nope"}', DropReason.UNKNOWN_TYPE),
    ('{"t":5}', DropReason.UNKNOWN_TYPE),
    ('{"t":"pong","id":1,"ts":1}', DropReason.UNKNOWN_TYPE),  # node -> client only
    ('{"t":"pm","x":0.5}', DropReason.MISSING_FIELD),
    ('{"t":"pm","x":"0.5","y":0}', DropReason.BAD_FIELD_TYPE),
    ('{"t":"pm","x":true,"y":0}', DropReason.BAD_FIELD_TYPE),
    ('{"t":"pm","x":1.01,"y":0}', DropReason.OUT_OF_RANGE),
    ('{"t":"pm","x":0,"y":-0.01}', DropReason.OUT_OF_RANGE),
    ('{"t":"pr","dx":1}', DropReason.MISSING_FIELD),
    ('{"t":"pr","dx":1.5,"dy":0}', DropReason.BAD_FIELD_TYPE),
    ('{"t":"pr","dx":"1","dy":0}', DropReason.BAD_FIELD_TYPE),
    ('{"t":"pr","dx":true,"dy":0}', DropReason.BAD_FIELD_TYPE),
    (f'{{"t":"pr","dx":0,"dy":{POINTER_MAX_DELTA + 1}}}', DropReason.OUT_OF_RANGE),
    (f'{{"t":"pr","dx":{-POINTER_MAX_DELTA - 1},"dy":0}}', DropReason.OUT_OF_RANGE),
    ('{"t":"pb","b":0,"d":true}', DropReason.OUT_OF_RANGE),
    ('{"t":"pb","b":6,"d":true}', DropReason.OUT_OF_RANGE),
    ('{"t":"pb","b":1.5,"d":true}', DropReason.BAD_FIELD_TYPE),
    ('{"t":"pb","b":1,"d":1}', DropReason.BAD_FIELD_TYPE),
    ('{"t":"pb","b":1}', DropReason.MISSING_FIELD),
    ('{"t":"pw","dx":0,"dy":11}', DropReason.OUT_OF_RANGE),
    ('{"t":"pw","dx":-10.5,"dy":0}', DropReason.OUT_OF_RANGE),
    ('{"t":"pw","dx":null,"dy":0}', DropReason.BAD_FIELD_TYPE),
    ('{"t":"k","c":"KeyA"}', DropReason.MISSING_FIELD),
    ('{"t":"k","c":65,"d":true}', DropReason.BAD_FIELD_TYPE),
    ('{"t":"k","c":"NoSuchKey","d":true}', DropReason.UNKNOWN_KEY),
    ('{"t":"k","c":"' + "K" * 33 + '","d":true}', DropReason.OUT_OF_RANGE),
    ('{"t":"gp","i":4,"ax":[],"bt":[]}', DropReason.OUT_OF_RANGE),
    ('{"t":"gp","i":-1,"ax":[],"bt":[]}', DropReason.OUT_OF_RANGE),
    ('{"t":"gp","i":0,"ax":[1.5],"bt":[]}', DropReason.OUT_OF_RANGE),
    ('{"t":"gp","i":0,"ax":[],"bt":[-0.1]}', DropReason.OUT_OF_RANGE),
    ('{"t":"gp","i":0,"ax":["a"],"bt":[]}', DropReason.BAD_FIELD_TYPE),
    ('{"t":"gp","i":0,"ax":{},"bt":[]}', DropReason.BAD_FIELD_TYPE),
    (json.dumps({"t": "gp", "i": 0, "ax": [0] * (GAMEPAD_MAX_AXES + 1), "bt": []}), DropReason.OUT_OF_RANGE),
    (json.dumps({"t": "gp", "i": 0, "ax": [], "bt": [0] * (GAMEPAD_MAX_BUTTONS + 1)}), DropReason.OUT_OF_RANGE),
    ('{"t":"gp","i":0,"ax":[]}', DropReason.MISSING_FIELD),
    ('{"t":"cb","text":5}', DropReason.BAD_FIELD_TYPE),
    (json.dumps({"t": "cb", "text": "x" * (CLIPBOARD_MAX_CHARS + 1)}), DropReason.OUT_OF_RANGE),
    ('{"t":"tx"}', DropReason.MISSING_FIELD),
    ('{"t":"tx","text":["a"]}', DropReason.BAD_FIELD_TYPE),
    ('{"t":"tx","text":""}', DropReason.BAD_TEXT),
    ('{"t":"tx","text":"a\\nb"}', DropReason.BAD_TEXT),  # Enter is a key ("k"), not text
    ('{"t":"tx","text":"\\u001b[A"}', DropReason.BAD_TEXT),
    ('{"t":"tx","text":"\\ud83d"}', DropReason.BAD_TEXT),  # a lone surrogate
    (json.dumps({"t": "tx", "text": "a" * (TEXT_MAX_CHARS + 1)}), DropReason.OUT_OF_RANGE),
    ('{"t":"rs","w":63,"h":600}', DropReason.OUT_OF_RANGE),
    ('{"t":"rs","w":800,"h":5000}', DropReason.OUT_OF_RANGE),
    ('{"t":"rs","w":"800","h":600}', DropReason.BAD_FIELD_TYPE),
    ('{"t":"ping","id":-1,"ts":0}', DropReason.OUT_OF_RANGE),
    ('{"t":"ping","id":1,"ts":"now"}', DropReason.BAD_FIELD_TYPE),
    ('{"t":"ping","ts":1}', DropReason.MISSING_FIELD),
    ('{"t":"ping","id":1,"ts":1e400}', DropReason.OUT_OF_RANGE),  # json reads it as inf
    ('{"t":"ping","id":1e400,"ts":1}', DropReason.BAD_FIELD_TYPE),
    ('{"t":"ping","id":' + "9" * 5000 + ',"ts":1}', DropReason.NOT_JSON),  # past int digit limit
    ('{"t":"pa","id":1,"rx":-1,"rx_ms":0}', DropReason.OUT_OF_RANGE),
    ('{"t":"pa","id":1,"rx":1.5,"rx_ms":0}', DropReason.BAD_FIELD_TYPE),
    ('{"t":"pa","id":1,"rx":2,"rx_ms":-0.5}', DropReason.OUT_OF_RANGE),
    ('{"t":"pa","id":1,"rx":2}', DropReason.MISSING_FIELD),
    ('{"t":"vs"}', DropReason.MISSING_FIELD),
    ('{"t":"vs","g2g":41.2}', DropReason.BAD_FIELD_TYPE),
    ('{"t":"vs","g2g":[41.2,"slow"]}', DropReason.BAD_FIELD_TYPE),
    ('{"t":"vs","g2g":[41.2,true]}', DropReason.BAD_FIELD_TYPE),
    ('{"t":"vs","g2g":[1e400]}', DropReason.OUT_OF_RANGE),  # json reads it as inf
    (json.dumps({"t": "vs", "g2g": [1] * (VIEWER_STATS_MAX_SAMPLES + 1)}), DropReason.OUT_OF_RANGE),
    ('{"t":"pa","rx":2,"rx_ms":1}', DropReason.MISSING_FIELD),
    ('{"t":"probe","id":1}', DropReason.UNKNOWN_TYPE),  # node -> viewer only
    ("x" * (INPUT_MAX_BYTES + 1), DropReason.TOO_LARGE),
    ("[" * 100_000, DropReason.NOT_JSON),  # deep nesting: RecursionError inside json
]


@pytest.mark.parametrize(("raw", "reason"), REJECTED)
def test_rejects(raw: str | bytes, reason: DropReason) -> None:
    result = parse_input(raw)
    assert isinstance(result, InputError), result
    assert result.reason == reason, result.detail
    assert result.detail


def test_largest_escaped_clipboard_fits() -> None:
    # Every character as a JSON surrogate-pair escape: the worst case the size cap allows for.
    raw = '{"t":"cb","text":"' + "\\ud83d\\ude00" * CLIPBOARD_MAX_CHARS + '"}'
    result = parse_input(raw)
    assert isinstance(result, Clipboard)
    assert len(result.text) == CLIPBOARD_MAX_CHARS


def test_counters() -> None:
    counters = InputCounters()
    for raw in ['{"t":"pm","x":0,"y":0}', '{"t":"pm","x":1,"y":1}', '{"t":"k","c":"Nope","d":true}', "{"]:
        counters.record(parse_input(raw))
    assert counters.snapshot() == {
        "accepted": {"pm": 2},
        "dropped": {"not_json": 1, "unknown_key": 1},
    }


REQUIRED_CODES = (
    [f"Key{c}" for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"]
    + [f"Digit{i}" for i in range(10)]
    + [f"F{i}" for i in range(1, 13)]
    + "Enter Space Backspace Tab Escape ArrowLeft ArrowRight ArrowUp ArrowDown ShiftLeft ShiftRight "
    "ControlLeft ControlRight AltLeft AltRight MetaLeft Minus Equal BracketLeft BracketRight Semicolon "
    "Quote Comma Period Slash Backslash Backquote Delete Home End PageUp PageDown Insert".split()
)


def test_keymap_covers_required_codes() -> None:
    missing = [code for code in REQUIRED_CODES if keysym_for_code(code) is None]
    assert missing == []


@pytest.mark.parametrize(
    ("code", "keysym_name"),
    [
        ("KeyA", "a"),
        ("KeyZ", "z"),
        ("Digit0", "0"),
        ("Digit9", "9"),
        ("F1", "F1"),
        ("F12", "F12"),
        ("Enter", "Return"),
        ("Space", "space"),
        ("Backspace", "BackSpace"),
        ("Tab", "Tab"),
        ("Escape", "Escape"),
        ("ArrowLeft", "Left"),
        ("ArrowDown", "Down"),
        ("ShiftLeft", "Shift_L"),
        ("ShiftRight", "Shift_R"),
        ("ControlLeft", "Control_L"),
        ("ControlRight", "Control_R"),
        ("AltLeft", "Alt_L"),
        ("AltRight", "Alt_R"),
        ("MetaLeft", "Super_L"),
        ("Minus", "minus"),
        ("Equal", "equal"),
        ("BracketLeft", "bracketleft"),
        ("BracketRight", "bracketright"),
        ("Semicolon", "semicolon"),
        ("Quote", "apostrophe"),
        ("Comma", "comma"),
        ("Period", "period"),
        ("Slash", "slash"),
        ("Backslash", "backslash"),
        ("Backquote", "grave"),
        ("Delete", "Delete"),
        ("Home", "Home"),
        ("End", "End"),
        ("PageUp", "Prior"),
        ("PageDown", "Next"),
        ("Insert", "Insert"),
    ],
)
def test_keysyms_match_xlib(code: str, keysym_name: str) -> None:
    assert keysym_for_code(code) == XK.string_to_keysym(keysym_name)


def test_every_keysym_is_a_known_x_keysym() -> None:
    known = {value for name, value in vars(XK).items() if name.startswith("XK_")}
    unknown = {code: hex(ks) for code, ks in KEYSYMS.items() if ks not in known}
    assert unknown == {}


def test_keysyms_are_read_only() -> None:
    with pytest.raises(TypeError):
        KEYSYMS["KeyA"] = 0  # type: ignore[index]


def test_events_are_frozen() -> None:
    event = parse_input('{"t":"pm","x":0.5,"y":0.5}')
    assert isinstance(event, PointerMove)
    with pytest.raises(AttributeError):
        event.x = 0.1  # type: ignore[misc]


def test_bad_text_says_which_character() -> None:
    result = parse_input('{"t":"tx","text":"ok\\tno"}')
    assert isinstance(result, InputError)
    assert result.detail == "'text' holds U+0009, not a printable character"
