"""docs/protocol.md, the client protocol document, agrees with the code it describes.

Checked against ``broker/protocol.py`` (as ``test_protocol_sync.py`` checks web/protocol.js):

- the document states ``Protocol version N`` once, N == ``PROTOCOL_VERSION``, and its change log
  has an entry for every version up to N;
- every enum value, channel label, limit and state set of ``broker.protocol`` appears in the
  document, as an inline code span (```value```), enums in the section that owns them;
- the tables that list a closed set (session states, SSE events, signal types, channel labels,
  input and node messages, end reasons, HTTP problem codes, signaling error codes) list exactly
  that set: a value added to the code without its row, or a row whose value is gone, fails;
- wire examples exist for every message type (``"t":"pm"``, ``"type": "offer"``, ``event: state``);
- the error codes a client meets outside ``broker.protocol`` (``broker.errors`` problem codes, the
  node's and the broker's signaling error codes, warning codes) are documented too; the ones in
  node code are found by reading the sources, and a scan that finds fewer than the known codes
  fails rather than passing vacuously; the signaling error codes found equal
  ``broker.protocol.SignalError``;
- every in-page link points at a heading.

Failures name what is missing, so the fix is to add it to docs/protocol.md (or to correct it).
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path

import pytest

from broker import errors, protocol

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "protocol.md"

# The section (``## title``) that must mention each enum's values; enums not named here must
# appear somewhere in the document.
ENUM_SECTIONS: dict[str, str] = {
    "SessionState": "Sessions over REST",
    "EventType": "Session events (SSE)",
    "SignalType": "Signaling WebSocket",
    "InputType": "Data channels",
    "NodeEventType": "Data channels",
    "EndReason": "Timeouts and end reasons",
}

# Sources that emit signaling error codes and warning codes, with the pattern that finds them.
SIGNAL_ERROR_SOURCES: tuple[tuple[str, str], ...] = (
    ("broker/http/api.py", r'"code":\s*"([a-z_]+)"'),  # the viewers' frame reader (signal_messages)
    ("streamer/media/peer.py", r'OfferError\(\s*"([a-z_]+)"'),
    ("streamer/media/session.py", r'_error\(\s*"([a-z_]+)"'),
    ("encoder/select.py", r'class NoEncoderError\b.*?\bcode = "([a-z_]+)"'),
)
SIGNAL_ERRORS_KNOWN = frozenset({"bad_signal", "not_running", "bad_offer", "no_common_codec", "no_encoder",
                                 "ice_failed", "dtls_failed"})
WARNING_SOURCES: tuple[tuple[str, str], ...] = (
    ("broker/service.py", r'self\.warn\(\s*\w+,\s*"([a-z_]+)"'),
    ("broker/autoscale/scaler.py", r'WARNING_CODE(?::\s*Final)?\s*=\s*"([a-z_]+)"'),
    ("streamer/node/agent.py", r'\.warn\(\s*"([a-z_]+)"'),
)
WARNINGS_KNOWN = frozenset({"ending_soon", "scale_in", "node_restart"})

HEADING_RE = re.compile(r"^(#{1,6}) (.+?)\s*$", re.MULTILINE)
CODE_SPAN_RE = re.compile(r"`([^`\n]+)`")


def doc() -> str:
    return DOC.read_text(encoding="utf-8")


def section(text: str, title: str, level: int = 2) -> str:
    """The text under the heading ``#*level title`` (or starting so), up to the next heading of that level or higher."""
    heads = [(m.start(), len(m.group(1)), m.group(2)) for m in HEADING_RE.finditer(text)]
    for i, (start, lvl, name) in enumerate(heads):
        if lvl == level and name.startswith(title):
            end = next((s for s, l2, _ in heads[i + 1:] if l2 <= level), len(text))
            return text[start:end]
    pytest.fail(f"docs/protocol.md has no {'#' * level} {title!r} section")


def first_table_keys(text: str) -> list[str]:
    """The first code span of each body row of the first Markdown table in ``text``."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    assert start is not None, f"no table in:\n{text[:200]}"
    keys: list[str] = []
    for line in lines[start + 2:]:  # past the header and the |---| line
        if not line.startswith("|"):
            break
        first = CODE_SPAN_RE.search(line.split("|")[1])
        assert first is not None, f"table row without a code span in its first cell: {line}"
        keys.append(first.group(1))
    return keys


def has_span(text: str, value: object) -> bool:
    return f"`{value}`" in text


def enums() -> dict[str, type[StrEnum]]:
    """Every wire enum: those of ``all_constants()`` plus ``Role``."""
    out: dict[str, type[StrEnum]] = {e.__name__: e for e in (getattr(protocol, n) for n in protocol.all_constants())}
    out["Role"] = protocol.Role
    return out


def scalars() -> dict[str, str | int]:
    """UPPER_CASE str/int constants of ``broker.protocol`` (the version is checked on its own)."""
    return {n: v for n in dir(protocol) if n.isupper() and not n.startswith("_")
            and isinstance(v := getattr(protocol, n), str | int) and n != "PROTOCOL_VERSION"}


def state_sets() -> dict[str, frozenset[str]]:
    return {n: frozenset(str(x) for x in v) for n in dir(protocol) if n.isupper()
            and isinstance(v := getattr(protocol, n), frozenset)}


def scan(sources: tuple[tuple[str, str], ...]) -> set[str]:
    found: set[str] = set()
    for rel, pattern in sources:
        text = (ROOT / rel).read_text(encoding="utf-8")
        hits = re.findall(pattern, text, re.DOTALL)
        assert hits, f"{rel}: the pattern {pattern!r} found nothing; update the scan in this test"
        found.update(hits)
    return found


def problem_codes() -> dict[str, int]:
    """Every ``BrokerError`` subclass's code -> HTTP status."""
    out: dict[str, int] = {}
    todo: list[type[errors.BrokerError]] = [errors.BrokerError]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls is not errors.BrokerError:
            out[cls.code] = cls.status
    return out


# ---- version ------------------------------------------------------------------------------------


def test_protocol_version_is_an_int() -> None:
    assert type(protocol.PROTOCOL_VERSION) is int and protocol.PROTOCOL_VERSION >= 1


def test_document_states_the_protocol_version() -> None:
    stated = re.findall(r"^Protocol version (\d+)\s*$", doc(), re.MULTILINE)
    assert len(stated) == 1, f"docs/protocol.md must state 'Protocol version N' once, on its own line; found {stated}"
    assert int(stated[0]) == protocol.PROTOCOL_VERSION, (
        f"docs/protocol.md says protocol version {stated[0]}, broker/protocol.py PROTOCOL_VERSION = "
        f"{protocol.PROTOCOL_VERSION}")


def test_change_log_has_every_version() -> None:
    log = section(doc(), "Change log")
    versions = [int(v) for v in re.findall(r"^### Version (\d+)\b", log, re.MULTILINE)]
    missing = sorted(set(range(1, protocol.PROTOCOL_VERSION + 1)) - set(versions))
    assert not missing, f"docs/protocol.md change log lacks '### Version N' entries for {missing}"
    assert max(versions) == protocol.PROTOCOL_VERSION, f"change log goes past PROTOCOL_VERSION: {versions}"
    assert versions == sorted(versions, reverse=True), f"change log entries must be newest first: {versions}"


# ---- constants of broker.protocol ---------------------------------------------------------------


def test_every_enum_value_is_documented() -> None:
    text = doc()
    missing = []
    for name, enum in enums().items():
        where = section(text, ENUM_SECTIONS[name]) if name in ENUM_SECTIONS else text
        missing += [f"{name}.{m.name} = {m.value!r}" + (f" (in '## {ENUM_SECTIONS[name]}')" if name in ENUM_SECTIONS
                                                      else "") for m in enum if not has_span(where, m.value)]
    assert not missing, f"docs/protocol.md does not mention, as `value`: {missing}"


def test_every_scalar_constant_is_documented_with_its_name() -> None:
    text = doc()
    missing = []
    for name, value in scalars().items():
        n, v = re.escape(f"`{name}`"), re.escape(f"`{value}`")
        if not re.search(rf"{n}[^\n]{{0,24}}?{v}|{v}[^\n]{{0,24}}?{n}", text):
            missing.append(f"{name} = {value!r}")
    assert not missing, f"docs/protocol.md lacks `NAME` next to its `value` for: {missing}"


def test_state_sets_are_documented_exactly() -> None:
    text = doc()
    for name, members in state_sets().items():
        idx = text.find(f"`{name}`")
        assert idx >= 0, f"docs/protocol.md does not name {name}"
        start = max(text.rfind(". ", 0, idx), text.rfind("; ", 0, idx), text.rfind("\n\n", 0, idx))
        listed = set(CODE_SPAN_RE.findall(text[start:idx]))
        assert listed == members, (f"{name}: the sentence before `{name}` lists {sorted(listed)}, "
                                   f"the code has {sorted(members)}")


# ---- closed sets: tables list exactly the code's values -----------------------------------------


def assert_table(title: str, level: int, want: set[str], what: str, parent: str | None = None) -> None:
    text = section(doc(), parent, 2) if parent else doc()
    keys = first_table_keys(section(text, title, level))
    assert len(keys) == len(set(keys)), f"{title}: a row appears twice: {keys}"
    missing, extra = sorted(want - set(keys)), sorted(set(keys) - want)
    assert not missing and not extra, (f"docs/protocol.md '{title}' table vs {what}: missing rows {missing}, "
                                       f"rows the code does not have {extra}")


def test_session_states_table() -> None:
    assert_table("Session states", 3, {s.value for s in protocol.SessionState}, "SessionState")


def test_sse_events_table() -> None:
    assert_table("Session events (SSE)", 2, {e.value for e in protocol.EventType}, "EventType")


def test_signal_types_table() -> None:
    assert_table("Signaling WebSocket", 2, {t.value for t in protocol.SignalType}, "SignalType")


def test_channel_labels_table() -> None:
    labels = {str(v) for n, v in scalars().items() if n.endswith("_CHANNEL_LABEL")}
    assert labels, "broker/protocol.py has no *_CHANNEL_LABEL constants?"
    assert_table("Data channels", 2, labels, "the *_CHANNEL_LABEL constants")


def test_input_messages_table() -> None:
    assert_table("Input messages", 3, {t.value for t in protocol.InputType}, "InputType", parent="Data channels")


def test_node_messages_table() -> None:
    assert_table("Node messages", 3, {t.value for t in protocol.NodeEventType}, "NodeEventType",
                 parent="Data channels")


def test_end_reasons_table() -> None:
    assert_table("End reasons", 3, {r.value for r in protocol.EndReason}, "EndReason",
                 parent="Timeouts and end reasons")


# ---- wire examples ----------------------------------------------------------------------------


def test_every_message_type_has_a_wire_example() -> None:
    text = doc()
    channels, signaling, sse = (section(text, t) for t in ("Data channels", "Signaling WebSocket",
                                                            "Session events (SSE)"))
    missing = [f"InputType {t.value}" for t in protocol.InputType if t != protocol.InputType.PROBE_ACK
               and not re.search(rf'"t":\s*"{t.value}"', section(channels, "Input messages", 3))]
    missing += [f"{t.value} (probe answer)" for t in [protocol.InputType.PROBE_ACK]
                if not re.search(rf'"t":\s*"{t.value}"', section(channels, "Probe channel", 3))]
    missing += [f"NodeEventType {t.value}" for t in protocol.NodeEventType
                if not re.search(rf'"t":\s*"{t.value}"', channels)]
    missing += [f"SignalType {t.value}" for t in protocol.SignalType
                if not re.search(rf'"type":\s*"{t.value}"', signaling)]
    missing += [f"EventType {t.value}" for t in protocol.EventType
                if not re.search(rf"^event: {t.value}$", sse, re.MULTILINE)]
    assert not missing, f"docs/protocol.md has no JSON (or SSE) example for: {missing}"


# ---- codes outside broker.protocol ----------------------------------------------------------------


def test_problem_codes_table() -> None:
    codes = problem_codes()
    assert_table("HTTP problems", 3, set(codes), "broker.errors", parent="Errors")
    table = section(section(doc(), "Errors"), "HTTP problems", 3)
    wrong = [f"{c} ({s})" for c, s in codes.items() if not re.search(rf"^\| `{c}` \| {s} \|", table, re.MULTILINE)]
    assert not wrong, f"docs/protocol.md 'HTTP problems' rows with a missing or wrong status: {wrong}"


def test_signaling_error_codes_table() -> None:
    found = scan(SIGNAL_ERROR_SOURCES)
    assert SIGNAL_ERRORS_KNOWN <= found, f"the source scan missed {sorted(SIGNAL_ERRORS_KNOWN - found)}: update it"
    declared = {c.value for c in protocol.SignalError}
    assert found == declared, (f"signaling error codes in the sources {sorted(found)} != broker.protocol.SignalError "
                               f"{sorted(declared)}: add the new code to SignalError (and web/protocol.js)")
    assert_table("Signaling error codes", 3, found, f"the codes in {[s for s, _ in SIGNAL_ERROR_SOURCES]}",
                 parent="Errors")


def test_warning_codes_are_documented() -> None:
    found = scan(WARNING_SOURCES)
    assert WARNINGS_KNOWN <= found, f"the source scan missed {sorted(WARNINGS_KNOWN - found)}: update it"
    node_messages = section(section(doc(), "Data channels"), "Node messages", 3)
    missing = sorted(c for c in found if not has_span(node_messages, c))
    assert not missing, f"docs/protocol.md 'Node messages' (the warn row) lacks warning codes {missing}"


# ---- the document itself ------------------------------------------------------------------------


def slug(title: str) -> str:
    """GitHub's heading anchor: lowercase, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def test_in_page_links_resolve() -> None:
    text = doc()
    anchors = {slug(m.group(2)) for m in HEADING_RE.finditer(text)}
    broken = sorted(set(re.findall(r"\]\(#([^)]+)\)", text)) - anchors)
    assert not broken, f"docs/protocol.md links to missing headings: {broken}"


def test_the_section_helper_fails_loudly() -> None:
    """A renamed heading must fail the checks, not make them pass over an empty text."""
    with pytest.raises(pytest.fail.Exception):
        section("## Something else\n", "Data channels")
