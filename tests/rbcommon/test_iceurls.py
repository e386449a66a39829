"""STUN/TURN URL checks agree with aiortc's own parser, and refuse what a node or browser could not use."""

from __future__ import annotations

import pytest
from aiortc.rtcicetransport import parse_stun_turn_uri

from rbcommon.iceurls import check_ice_urls, parse_ice_url


@pytest.mark.parametrize("url", [
    "stun:stun.example.test", "stun:10.0.0.1:3479", "stuns:stun.example.test",
    "turn:turn.example.test", "turn:10.0.0.1:3478?transport=udp", "turn:turn.example.test?transport=tcp",
    "turns:turn.example.test", "turns:turn.example.test:443?transport=tcp", "turns:10.231.2.1:5349",
])
def test_accepted_urls_parse_as_aiortc_parses_them(url: str) -> None:
    ours, theirs = parse_ice_url(url), parse_stun_turn_uri(url)
    assert (ours.scheme, ours.host, ours.port) == (theirs["scheme"], theirs["host"], theirs["port"])
    assert ours.transport == theirs.get("transport")
    assert ours.tls == url.startswith(("stuns:", "turns:"))


def test_turns_defaults_to_tls_over_tcp_on_5349() -> None:
    assert parse_ice_url("turns:turn.example.test") == parse_ice_url("turns:turn.example.test:5349?transport=tcp")
    assert parse_ice_url("turns:t.example.test").transport == "tcp"


@pytest.mark.parametrize(("url", "reason"), [
    ("turns:turn.example.test:5349?transport=udp", "TURN over DTLS is not supported"),
    ("turn:turn.example.test?transport=sctp", "transport must be udp or tcp"),
    ("stun:stun.example.test?transport=udp", "takes no transport"),
    ("turn:[2001:db8::1]:3478", "IPv6 literals are not supported"),
    ("turn:turn.example.test:70000", "port must be 1..65535"),
    ("https://turn.example.test", "expected stun:HOST"),
    ("turn:", "expected stun:HOST"),
    ("turn:turn.example.test ", "expected stun:HOST"),
])
def test_refused_urls_say_why(url: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_ice_url(url)


def test_check_names_the_setting_and_the_scheme_it_wants() -> None:
    with pytest.raises(ValueError, match=r"^turn_urls: 'stun:s.example.test': expected a turn or turns URL$"):
        check_ice_urls(["turns:t.example.test", "stun:s.example.test"], "turn_urls", ("turn", "turns"))
    with pytest.raises(ValueError, match=r"^stun_urls: 'stun:a b'"):
        check_ice_urls(["stun:a b"], "stun_urls", ("stun", "stuns"))
    parsed = check_ice_urls(["turn:a", "turns:b"], "turn_urls", ("turn", "turns"))
    assert [u.scheme for u in parsed] == ["turn", "turns"]
