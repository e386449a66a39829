"""Pure JavaScript of web/keys.js run in Node: which key presses go as physical keys ("k") and which as
text ("tx") to a remote US layout, and how text is cut into "tx" payloads."""

from __future__ import annotations

import json

from broker.protocol import TEXT_MAX_CHARS
from streamer.desktop.inputs import KEYSYMS, Text, parse_input
from tests.web.test_calc import WEB, run

# (what a browser reports for one keydown, where it must go)
CASES = [
    ({"key": "a", "code": "KeyA"}, {"kind": "code", "code": "KeyA"}),  # US: a real key press (games)
    ({"key": "A", "code": "KeyA", "shiftKey": True}, {"kind": "code", "code": "KeyA"}),
    ({"key": "A", "code": "KeyA"}, {"kind": "code", "code": "KeyA"}),  # CapsLock: the remote's follows it
    ({"key": "!", "code": "Digit1", "shiftKey": True}, {"kind": "code", "code": "Digit1"}),
    ({"key": "ArrowLeft", "code": "ArrowLeft"}, {"kind": "code", "code": "ArrowLeft"}),
    ({"key": "F5", "code": "F5"}, {"kind": "code", "code": "F5"}),
    ({"key": "Shift", "code": "ShiftLeft", "shiftKey": True}, {"kind": "code", "code": "ShiftLeft"}),
    ({"key": "AltGraph", "code": "AltRight", "altGraph": True}, {"kind": "code", "code": "AltRight"}),
    ({"key": "é", "code": "Digit2"}, {"kind": "text", "text": "é"}),  # AZERTY
    ({"key": "1", "code": "Digit1", "shiftKey": True}, {"kind": "text", "text": "1"}),  # AZERTY digits need Shift
    ({"key": "a", "code": "KeyQ"}, {"kind": "text", "text": "a"}),  # AZERTY's A sits on US Q
    ({"key": "z", "code": "KeyY"}, {"kind": "text", "text": "z"}),  # QWERTZ
    ({"key": "ß", "code": "Minus"}, {"kind": "text", "text": "ß"}),  # QWERTZ
    ({"key": "€", "code": "KeyE", "ctrlKey": True, "altKey": True, "altGraph": True},  # AltGr on Windows
     {"kind": "text", "text": "€"}),
    ({"key": "z", "code": "KeyY", "ctrlKey": True}, {"kind": "code", "code": "KeyZ"}),  # QWERTZ Ctrl+Z: undo
    ({"key": "q", "code": "KeyA", "ctrlKey": True}, {"kind": "code", "code": "KeyQ"}),  # AZERTY Ctrl+Q
    ({"key": "é", "code": "Digit2", "ctrlKey": True}, {"kind": "code", "code": "Digit2"}),  # shortcut, no letter
    ({"key": "+", "code": "NumpadAdd"}, {"kind": "text", "text": "+"}),  # a code the node has no keysym for
    ({"key": "Dead", "code": "BracketLeft"}, {"kind": "none"}),  # the composed character comes as text
    ({"key": "Process", "code": "KeyA"}, {"kind": "none"}),  # an IME composing
]


def test_keys_go_as_codes_or_as_text() -> None:
    r = run({"routes": f"{json.dumps([case for case, _ in CASES])}.map((e) => c.routeKey(e))"}, WEB / "keys.js")
    for (event, expected), got in zip(CASES, r["routes"], strict=True):
        assert got == expected, event
        if got["kind"] == "code":
            assert got["code"] in KEYSYMS, got  # a key the node knows


def test_text_is_cut_into_payloads_the_node_accepts() -> None:
    text = "é\n" + "😀" * TEXT_MAX_CHARS + "\u0007ß"
    r = run({"chunks": f"c.textChunks({json.dumps(text)})", "empty": "c.textChunks('\\n')"}, WEB / "keys.js")
    assert r["empty"] == []
    chunks = r["chunks"]
    assert "".join(chunks) == "é" + "😀" * TEXT_MAX_CHARS + "ß"  # controls removed, nothing else lost
    assert [len(chunk) for chunk in chunks] == [TEXT_MAX_CHARS, 2]  # code points, not UTF-16 units
    for chunk in chunks:
        assert parse_input(json.dumps({"t": "tx", "text": chunk})) == Text(chunk)
