"""Pure JavaScript of the touch and controls modules run in Node: the on-screen keyboard's characters map
to keys the node knows (US layout), and every control scheme the node can name has a line of text."""

from __future__ import annotations

import json
import string

from broker.protocol import ControlScheme
from streamer.desktop.inputs import KEYSYMS
from tests.web.test_calc import WEB, run

US_SHIFT = dict(zip("`1234567890-=[]\\;',./", "~!@#$%^&*()_+{}|:\"<>?", strict=True))


def test_every_printable_ascii_character_types_with_a_key_the_node_knows() -> None:
    chars = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
    r = run({"keys": f"{json.dumps(chars)}.map((ch) => c.keyForChar(ch))",
             "none": "[c.keyForChar('é'), c.keyForChar('€'), c.keyForChar('')]"}, WEB / "touch.js")
    assert r["none"] == [None, None, None]
    for ch, key in zip(chars, r["keys"], strict=True):
        assert key is not None, repr(ch)
        keysym = KEYSYMS[key["code"]]  # a KeyError here: the node would drop the key
        if ch == "\n":
            assert key == {"code": "Enter", "shift": False}
        elif ch == "\t":
            assert key == {"code": "Tab", "shift": False}
        elif ch in string.ascii_uppercase:
            assert key["shift"] and chr(keysym) == ch.lower()
        elif key["shift"]:
            assert US_SHIFT[chr(keysym)] == ch, (ch, key)
        else:
            assert chr(keysym) == ch, (ch, key)


def test_every_control_scheme_has_a_line_and_unknown_ones_show_nothing() -> None:
    schemes = [s.value for s in ControlScheme]
    r = run({"known": f"{json.dumps(schemes)}.map((s) => c.controlsText(s))",
             "touch": f"{json.dumps(schemes)}.map((s) => c.controlsText(s, true))",
             "unknown": "[c.controlsText(null), c.controlsText(undefined), c.controlsText('nope'),"
                        " c.controlsText('toString'), c.controlsText(3)]"}, WEB / "controls.js")
    assert all(r["known"]) and all(r["touch"]) and r["unknown"] == ["", "", "", "", ""]
    assert r["touch"] != r["known"]
    assert r["known"][schemes.index("builtin_game")].startswith("Arrows/WASD move")
