"""web/protocol.js mirrors broker/protocol.py exactly: every enum, state set and scalar, nothing extra.

protocol.js is written in a deliberately plain form (``export const NAME = <JSON literal>;`` with an
optional ``Object.freeze(...)`` around it) so that this test can read it with a regex and ``json``.
"""

from __future__ import annotations

import json
import re
from enum import Enum
from pathlib import Path
from typing import Any

import pytest

from broker import protocol

PROTOCOL_JS = Path(__file__).resolve().parents[2] / "web" / "protocol.js"
EXPORT_RE = re.compile(r"^export const ([A-Za-z_][A-Za-z0-9_]*) = (.*?);[ \t]*$", re.MULTILINE | re.DOTALL)
FREEZE_RE = re.compile(r"^Object\.freeze\((.*)\)$", re.DOTALL)


def js_exports() -> dict[str, tuple[Any, bool]]:
    """NAME -> (value, frozen) for every ``export const`` in protocol.js."""
    text = PROTOCOL_JS.read_text(encoding="utf-8")
    out: dict[str, tuple[Any, bool]] = {}
    for name, raw in EXPORT_RE.findall(text):
        raw = raw.strip()
        m = FREEZE_RE.match(raw)
        try:
            value = json.loads(m.group(1) if m else raw)
        except json.JSONDecodeError as exc:
            pytest.fail(f"web/protocol.js: {name} is not a JSON literal: {exc}")
        assert name not in out, f"web/protocol.js exports {name} twice"
        out[name] = (value, m is not None)
    # every export line must have been parsed (a malformed one would be skipped silently otherwise)
    assert len(out) == len(re.findall(r"^export ", text, re.MULTILINE)), "an export is not in the parseable form"
    return out


def python_value(value: Any) -> Any:
    """The JSON form a Python protocol constant takes in protocol.js."""
    if isinstance(value, type) and issubclass(value, Enum):
        return {m.name: m.value for m in value}
    if isinstance(value, frozenset | set):
        return sorted(str(v) for v in value)
    return value


def python_constants() -> dict[str, Any]:
    """Every public wire constant of broker.protocol: enums plus UPPER_CASE module constants."""
    out: dict[str, Any] = dict(protocol.all_constants())
    out["Role"] = python_value(protocol.Role)
    for name in dir(protocol):
        if name.isupper() and not name.startswith("_"):
            value = getattr(protocol, name)
            if isinstance(value, str | int | frozenset):
                out[name] = python_value(value)
    return out


def test_enums_equal_all_constants() -> None:
    js = js_exports()
    for name, members in protocol.all_constants().items():
        assert name in js, f"web/protocol.js lacks enum {name}"
        value, frozen = js[name]
        assert value == members, f"{name}: JS {value} != Python {members}"
        assert frozen, f"{name} must be wrapped in Object.freeze"


def test_scalars_and_state_sets_equal() -> None:
    js = js_exports()
    py = python_constants()
    for name, value in py.items():
        assert name in js, f"web/protocol.js lacks {name}"
        assert js[name][0] == value, f"{name}: JS {js[name][0]!r} != Python {value!r}"
        assert type(js[name][0]) is type(value), f"{name}: JS type {type(js[name][0])} != {type(value)}"
    assert js["API_PREFIX"][0] == "/api/v1"
    assert js["INPUT_CHANNEL_LABEL"][0] == protocol.INPUT_CHANNEL_LABEL


def test_no_export_without_python_counterpart() -> None:
    extra = sorted(set(js_exports()) - set(python_constants()))
    assert not extra, f"web/protocol.js exports names broker/protocol.py does not define: {extra}"


def test_viewer_explains_every_end_reason() -> None:
    """client.js has human text for each EndReason (a new reason must get its sentence)."""
    text = (PROTOCOL_JS.parent / "client.js").read_text(encoding="utf-8")
    block = text[text.index("const END_REASON_TEXT"):]
    block = block[:block.index("});")]
    missing = [m.name for m in protocol.EndReason if f"[EndReason.{m.name}]:" not in block]
    assert not missing, f"web/client.js END_REASON_TEXT lacks {missing}"
