"""Interop with WebRTC stacks other than browsers, against a real node runtime and aiortc viewers.

What a native client meets (docs/protocol.md, "DTLS roles and certificates", "Order"):

- a viewer whose DTLS certificate is RSA (GStreamer 1.22's webrtcbin by default) offering the usual
  ``a=setup:actpass``: the node answers ``passive`` and is the DTLS server with its ECDSA
  certificate, so the handshake completes (before, it answered ``active``, the viewer was the server
  and aiortc's ECDHE-ECDSA-only suites met an RSA certificate: "no shared cipher");
- a failed DTLS or ICE state change sends the viewer a signaling ``error`` (``dtls_failed``,
  ``ice_failed``) through the runtime's ``signal`` event, and the node logs it at WARNING; before any
  viewer of the session connected, the event names it the session's ``start_failure`` (once);
- candidates trickled before the offer are held and added once the offer is applied.

The RSA viewer is an aiortc viewer given an RSA-2048 certificate and OpenSSL's broad cipher list
(the one GStreamer's dtls elements set), which reproduces webrtcbin's failure without GStreamer.
"""

from __future__ import annotations

import datetime
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import aioice.stun
import pytest
from aiortc import RTCSessionDescription
from aiortc.rtcdtlstransport import RTCCertificate, SRTPProtectionProfile
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import rsa
from OpenSSL import SSL

from broker.protocol import SignalError
from streamer.media.session import RuntimeConfig, SessionRuntime, SessionSpec
from tests.streamer.viewer import Viewer, until

pytestmark = pytest.mark.timeout(60)

CONFIG = RuntimeConfig(advertise_addresses=("127.0.0.1",), stats_interval_ms=100)
GSTREAMER_CIPHERS = b"ALL:!ADH:!LOW:!EXP:!MD5:@STRENGTH"  # gst-plugins-bad ext/dtls/gstdtlsagent.c


class RsaCertificate(RTCCertificate):
    """An RSA-2048 DTLS certificate with OpenSSL's broad cipher list: a webrtcbin-like DTLS endpoint."""

    @classmethod
    def generate(cls) -> RsaCertificate:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "webrtcbin-like")])
        now = datetime.datetime.now(tz=datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .sign(key, hashes.SHA256())
        )
        return cls(key=key, cert=cert)  # type: ignore[arg-type]  # aiortc annotates EC keys only

    def _create_ssl_context(self, srtp_profiles: list[SRTPProtectionProfile]) -> SSL.Context:
        ctx = super()._create_ssl_context(srtp_profiles)
        ctx.set_cipher_list(GSTREAMER_CIPHERS)
        return ctx


def rsa_viewer(monkeypatch: pytest.MonkeyPatch) -> Viewer:
    """A ``Viewer`` whose peer connection holds an RSA certificate (aiortc makes its own in the constructor)."""
    with monkeypatch.context() as patch:
        patch.setattr(RTCCertificate, "generateCertificate", classmethod(lambda cls: RsaCertificate.generate()))
        viewer = Viewer()
    return viewer


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, name: str, info: dict[str, Any]) -> None:
        self.seen.append((name, info))

    def signals(self) -> list[dict[str, Any]]:
        return [info["msg"] for name, info in self.seen if name == "signal"]

    def start_failures(self) -> list[str | None]:
        return [info.get("start_failure") for name, info in self.seen if name == "signal"]


@pytest.fixture
async def game() -> AsyncIterator[tuple[SessionRuntime, Events]]:
    events = Events()
    runtime = SessionRuntime(SessionSpec(id="interop", kind="game", width=320, height=240, fps=30), CONFIG,
                             on_event=events)  # fmt: skip
    await runtime.start()
    yield runtime, events
    await runtime.stop()


def setup_lines(sdp: str) -> list[str]:
    return re.findall(r"^a=setup:(\w+)", sdp, re.MULTILINE)


async def send_offer(runtime: SessionRuntime, viewer: Viewer, offer: dict[str, Any]) -> str:
    """Send ``offer`` (the viewer's, perhaps edited) and apply the node's answer; the answer's SDP."""
    replies = await runtime.handle_signal(offer)
    assert [r["type"] for r in replies] == ["answer"], replies
    await viewer.pc.setRemoteDescription(RTCSessionDescription(sdp=replies[0]["sdp"], type="answer"))
    return str(replies[0]["sdp"])


async def test_an_rsa_certificate_viewer_offering_actpass_connects(
    game: tuple[SessionRuntime, Events], monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime, events = game
    viewer = rsa_viewer(monkeypatch)
    try:
        offer = await viewer.offer()
        assert set(setup_lines(offer["sdp"])) == {"actpass"}
        assert re.search(r"a=fingerprint:sha-256", offer["sdp"])
        answer = await send_offer(runtime, viewer, offer)
        assert set(setup_lines(answer)) == {"passive"}  # the node is the DTLS server
        frames = await viewer.wait_frames(5)
        assert frames[0].key_frame and {(f.width, f.height) for f in frames} == {(320, 240)}
        await until(lambda: [n for n, _ in events.seen] == ["connected"], "no connected event")
        assert events.signals() == []
    finally:
        await viewer.close()


async def test_an_ecdsa_viewer_offering_active_still_gets_passive(game: tuple[SessionRuntime, Events]) -> None:
    runtime, _events = game
    viewer = Viewer()
    try:
        offer = await viewer.offer()
        offer["sdp"] = offer["sdp"].replace("a=setup:actpass", "a=setup:active")  # the old client-side workaround
        assert set(setup_lines(await send_offer(runtime, viewer, offer))) == {"passive"}
        await viewer.wait_frames(3)
    finally:
        await viewer.close()


async def test_a_failed_dtls_handshake_is_sent_to_the_viewer_and_logged(
    game: tuple[SessionRuntime, Events], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # An RSA viewer that insists on being the DTLS server (a=setup:passive): the node must be the
    # client, its ECDHE-ECDSA suites meet an RSA certificate and the handshake fails after ICE.
    runtime, events = game
    viewer = rsa_viewer(monkeypatch)
    caplog.set_level(logging.WARNING, logger="streamer.media.session")
    try:
        offer = await viewer.offer()
        offer["sdp"] = offer["sdp"].replace("a=setup:actpass", "a=setup:passive")
        replies = await runtime.handle_signal(offer)
        assert [r["type"] for r in replies] == ["answer"] and set(setup_lines(replies[0]["sdp"])) == {"active"}
        await viewer.pc.setRemoteDescription(RTCSessionDescription(sdp=replies[0]["sdp"], type="answer"))
        await until(lambda: events.signals() != [], "no signaling error after the DTLS failure")
        (error,) = events.signals()
        assert error["type"] == "error" and error["code"] == SignalError.DTLS_FAILED.value
        assert "a=setup:passive" in error["detail"] and "RSA" in error["detail"]
        assert any(r.levelno == logging.WARNING and "dtls_failed" in r.getMessage() for r in caplog.records)
        assert "connected" not in [n for n, _ in events.seen]
        assert events.start_failures() == ["dtls_failed"]  # no viewer had connected: the start failed
        await until(lambda: runtime.stats()["connected"] is False and runtime.state == "running", "session hurt")
    finally:
        await viewer.close()


async def test_a_failed_ice_check_is_sent_to_the_viewer(
    game: tuple[SessionRuntime, Events], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The offer's only candidate is a port nobody listens on, and the viewer never applies the answer
    # (so it sends no checks the node could learn a peer-reflexive candidate from).  aioice gives up
    # on a pair after RETRY_MAX retransmissions (63 s by default): two keep the test short.
    monkeypatch.setattr(aioice.stun, "RETRY_MAX", 2)
    runtime, events = game
    viewer = Viewer()
    try:
        offer = await viewer.offer()
        offer["sdp"] = re.sub(r"(a=candidate:\S+ \d+ udp \d+ 127\.0\.0\.1) \d+", r"\1 9", offer["sdp"])
        assert "a=end-of-candidates" in offer["sdp"]
        assert [r["type"] for r in await runtime.handle_signal(offer)] == ["answer"]
        await until(lambda: events.signals() != [], "no signaling error after the ICE failure")
        (error,) = events.signals()
        assert error["code"] == SignalError.ICE_FAILED.value
        assert "before connecting" in error["detail"] and "viewer candidates 1 host" in error["detail"]
        assert events.start_failures() == ["ice_failed"]
    finally:
        await viewer.close()


async def test_a_failed_connection_after_a_viewer_connected_is_no_start_failure(
    game: tuple[SessionRuntime, Events], monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime, events = game
    first = Viewer()
    try:
        await send_offer(runtime, first, await first.offer())
        await first.wait_frames(1)
    finally:
        await first.close()
    await until(lambda: [n for n, _ in events.seen] == ["connected", "disconnected"], "first viewer not gone")
    viewer = rsa_viewer(monkeypatch)  # the next viewer's DTLS fails, as in the test above
    try:
        offer = await viewer.offer()
        offer["sdp"] = offer["sdp"].replace("a=setup:actpass", "a=setup:passive")
        await send_offer(runtime, viewer, offer)
        await until(lambda: events.signals() != [], "no signaling error after the DTLS failure")
        assert [m["code"] for m in events.signals()] == ["dtls_failed"] and events.start_failures() == [None]
    finally:
        await viewer.close()


def split_candidates(sdp: str) -> tuple[str, list[dict[str, Any]]]:
    """An offer without its candidates (as a trickling stack sends it) and those candidates as messages."""
    messages: list[dict[str, Any]] = []
    kept: list[str] = []
    mid: str | None = None
    for line in sdp.split("\r\n"):
        if line.startswith("a=mid:"):
            mid = line[len("a=mid:"):]
        if line.startswith("a=candidate:"):
            messages.append({"type": "candidate", "candidate": line[2:], "sdpMid": mid, "sdpMLineIndex": 0})
        elif line != "a=end-of-candidates":
            kept.append(line)
    return "\r\n".join(kept), messages


def node_remote_candidates(runtime: SessionRuntime) -> list[str]:
    """The viewer candidates the node's connection knows (aiortc's public RTCIceTransport API)."""
    peer = runtime._peer  # test-only: the current viewer connection
    assert peer is not None
    transceiver = peer.pc.getTransceivers()[0]
    return [f"{c.ip}:{c.port}" for c in transceiver.receiver.transport.transport.getRemoteCandidates()]


@pytest.mark.parametrize("when", ["before", "after"])
async def test_trickled_candidates_are_used_before_and_after_the_offer(
    game: tuple[SessionRuntime, Events], when: str
) -> None:
    runtime, _events = game
    viewer = Viewer()
    try:
        offer = await viewer.offer()
        bare, candidates = split_candidates(offer["sdp"])
        assert candidates and "a=candidate:" not in bare
        offer["sdp"] = bare
        trickle = [*candidates, {"type": "candidate", "candidate": "", "sdpMid": candidates[0]["sdpMid"]}]
        if when == "before":
            for msg in trickle:
                assert await runtime.handle_signal(msg) == []
        replies = await runtime.handle_signal(offer)
        assert [r["type"] for r in replies] == ["answer"]
        if when == "after":
            for msg in trickle:
                assert await runtime.handle_signal(msg) == []
        expected = [m["candidate"].split()[4] + ":" + m["candidate"].split()[5] for m in candidates]
        assert node_remote_candidates(runtime) == expected
        await viewer.pc.setRemoteDescription(RTCSessionDescription(sdp=replies[0]["sdp"], type="answer"))
        await viewer.wait_frames(3)
    finally:
        await viewer.close()


async def test_a_candidate_for_the_next_offer_waits_for_it(game: tuple[SessionRuntime, Events]) -> None:
    # While a viewer connection exists, a candidate naming another ICE ufrag belongs to the viewer's
    # next offer (a new peer connection): it is held, not added to the current connection.
    runtime, _events = game
    first = Viewer()
    second = Viewer()
    try:
        await first.connect(runtime.handle_signal)
        offer = await second.offer()
        bare, candidates = split_candidates(offer["sdp"])
        ufrag = re.search(r"a=ice-ufrag:(\S+)", bare)
        assert ufrag is not None
        for msg in candidates:
            msg["usernameFragment"] = ufrag.group(1)
            assert await runtime.handle_signal(msg) == []
        assert node_remote_candidates(runtime) == [
            f"{c.ip}:{c.port}"
            for c in first.pc.getTransceivers()[0].receiver.transport.transport.iceGatherer.getLocalCandidates()
        ]
        replies = await runtime.handle_signal({"type": "offer", "sdp": bare})
        assert len(node_remote_candidates(runtime)) == len(candidates)
        await second.pc.setRemoteDescription(RTCSessionDescription(sdp=replies[0]["sdp"], type="answer"))
        await second.wait_frames(3)
    finally:
        await first.close()
        await second.close()


async def test_a_high_profile_only_offer_names_what_was_offered_and_what_is_accepted(
    game: tuple[SessionRuntime, Events],
) -> None:
    runtime, _events = game
    viewer = Viewer(codecs=("H264",))
    try:
        offer = await viewer.offer()
        sdp = re.sub(r"profile-level-id=42[0-9a-f]{4}", "profile-level-id=640c1f", offer["sdp"])
        (error,) = await runtime.handle_signal({"type": "offer", "sdp": sdp})
        assert error["type"] == "error" and error["code"] == SignalError.NO_COMMON_CODEC.value
        assert error["offered"] == ["H264 Constrained High 640c1f packetization-mode=1"]
        assert any("42e0xx" in a and "packetization-mode=1" in a for a in error["accepted"])
        assert "640c1f" in error["detail"] and "42e0xx" in error["detail"] and "VP8" in error["detail"]
    finally:
        await viewer.close()
