"""One viewer's WebRTC connection: video out, input in, feedback back.

Job: build an ``RTCPeerConnection`` with only the configured ICE servers,
answer the viewer's offer with the codec the session encodes, offer exactly
the configured host addresses, hand data-channel messages to the session's
``streamer.desktop.inputsink.InputRouter``, send node events back, and collect the
viewer's RTCP feedback (PLI/FIR, REMB, receiver reports) for the session's
bitrate controller.

The viewer is the offerer: it creates the ``broker.protocol.INPUT_CHANNEL_LABEL``
data channel and a recvonly video transceiver; we answer.  When its offer also has
a receiving audio section with Opus (protocol v3) and the session has sound, the
session's audio track goes out on it (Opus, encoded by aiortc); otherwise that
section is answered inactive and the viewer gets video only.  A viewer may also
open ``PROBE_CHANNEL_LABEL`` (unordered, no retransmissions): the peer then
sends a delay probe every ``streamer.media.probe.PROBE_INTERVAL_MS`` and hands the
period's round-trip times and the viewer's receive rate to the controller
with the RTCP feedback.

aiortc seams used (aiortc 1.16 / aioice 0.13, no vendored copies):
- Feedback: ``RTCDtlsTransport`` hands every RTCP packet addressed to a sender
  to ``sender._handle_rtcp_packet(packet)`` (its router picks senders by SSRC,
  REMB by the SSRCs in its FCI).  With a track that yields ``av.Packet``s,
  aiortc's own handling goes nowhere useful: PLI/FIR set a flag its encoder
  would read, REMB is written into its (unused) encoder's ``target_bitrate``.
  ``FeedbackSender`` subclasses ``RTCRtpSender`` and overrides only that
  method: it lets aiortc do its work (RTT estimate, stats, NACK
  retransmission), then reports PLI/FIR, REMB and receiver reports to a
  ``FeedbackSink``.  ``RTCPeerConnection`` constructs its senders itself (no
  factory seam), so ``FeedbackSender.adopt`` re-classes the sender it made;
  the subclass adds two attributes and no ``__init__`` state.  It also
  overrides ``_retransmit(seq)`` (aiortc calls it for each NACKed sequence
  number) to ask a ``streamer.media.rtx.RetransmitLimiter`` first.
- Retransmission history: aiortc's sender keeps the last ``RTP_HISTORY_SIZE``
  packets (128: 0.18 s at 7 Mbps) to answer NACKs from; a packet lost twice
  (its retransmission too) was gone by the second NACK and the viewer's picture
  froze until a keyframe.  Importing this module raises the sender module's
  constant to ``RETRANSMIT_HISTORY_PACKETS`` (aiortc reads it on every send and
  NACK; its receiver has its own copy, untouched).
- Host candidates: aioice's ``Connection.gather_candidates`` lists interface
  addresses (skipping 127.0.0.1) and passes them to its public
  ``get_component_candidates(component, addresses)``.  ``AdvertisingConnection``
  overrides that method to bind the configured addresses instead;
  ``advertise_host_addresses`` adopts every ICE gatherer of a connection
  before ``setLocalDescription`` gathers.  Reaching the gatherer's connection
  (``RTCIceGatherer._connection``) is the one private attribute we read.  Both
  live in ``rbcommon.ice`` (the Python client SDK, ``rbclient``, uses them too)
  and are re-exported here.
- Probe send times: aiortc's ``RTCSctpTransport`` queues a data-channel message
  and sends it when the event loop gets there (tens of ms on a loaded node);
  ``ProbeTimingSctp.adopt`` re-classes the connection's SCTP transport to
  override ``_send_chunk(chunk)`` (aiortc calls it for every chunk it puts on
  the wire), which reports when each probe actually left, so the probe's round
  trip starts there (``streamer.media.probe``).
- DTLS role: aiortc answers ``a=setup:actpass`` with ``active`` and its DTLS offers
  ECDHE-ECDSA suites only, so a viewer with an RSA certificate (GStreamer's webrtcbin)
  failed as the DTLS server with "no shared cipher".  ``answer_dtls_passive`` answers
  ``passive`` instead (the node is the server with its ECDSA certificate), through the
  public ``setLocalDescription``; a failed ICE or DTLS transport is explained by
  ``ViewerPeer.failure`` from the public transport states.
- Round-trip time, jitter and loss are read through the public
  ``RTCRtpSender.getStats()`` (``remote-inbound-rtp``).
- Playout delay: the viewer's jitter buffer is told to hold nothing (the RTP
  playout-delay header extension, min = max = 0 by default: Chromium then decodes
  and shows each frame as soon as it is complete instead of buffering ~1.5 frames).
  aiortc 1.16 neither negotiates nor writes that extension: its answer keeps the
  offer's extensions that its module list ``aiortc.codecs.HEADER_EXTENSIONS`` names,
  and its sender serializes with a ``aiortc.rtp.HeaderExtensionsMap`` that knows a
  fixed set of fields.  ``enable_playout_delay`` adds the offer's playout-delay
  extension to this connection's transceiver only (``RTCRtpTransceiver._headerExtensions``,
  read by ``createAnswer`` and the sender's ``send`` parameters) and re-classes the
  sender's map (``RTCRtpSender.__rtp_header_extensions_map``, a name-mangled attribute)
  as ``PlayoutDelayExtensions``, which writes the element on every packet after
  aiortc's own ones.  These two private names are the price: aiortc offers no public
  way to add a header extension; a wrong aiortc version makes the function return
  False (logged), never break the connection.

Concurrency model: asyncio, one event loop.  aiortc callbacks (data-channel
messages, state changes, RTCP) run on the loop and never block: the router
parses in microseconds and queues injection off the loop.

Invariants:
- never ``RTCPeerConnection()`` without a configuration: aiortc would add
  Google's public STUN server; only ``spec.ice_servers`` are used;
- with ``advertise_addresses`` set, the answer's host candidates are exactly
  those addresses (plus server-reflexive/relay ones from configured servers);
- RTCP feedback is reported after aiortc has handled the packet itself.

Size: about 1,070 lines on purpose: every seam into aiortc's private API (feedback sender, retransmission
limit, playout-delay extension, probe channel) and every answer-side interop choice (DTLS role, codec
matching, early candidates) is kept in this one module, to be re-read together when aiortc is upgraded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, cast

import aiortc.rtcrtpsender as aiortc_sender
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCDataChannel,
    RTCDtlsTransport,
    RTCIceCandidate,
    RTCIceServer,
    RTCPeerConnection,
    RTCRtpCodecCapability,
    RTCRtpSender,
    RTCSessionDescription,
)
from aiortc.rtcicetransport import connection_kwargs
from aiortc.rtcpeerconnection import find_common_codecs
from aiortc.rtcrtpparameters import (
    RTCRtpCodecParameters,
    RTCRtpHeaderExtensionParameters,
    RTCRtpParameters,
    RTCRtpSendParameters,
)
from aiortc.rtcrtptransceiver import RTCRtpTransceiver
from aiortc.rtcsctptransport import Chunk, DataChunk, RTCSctpTransport
from aiortc.rtp import (
    RTCP_PSFB_APP,
    RTCP_PSFB_FIR,
    RTCP_PSFB_PLI,
    AnyRtcpPacket,
    HeaderExtensions,
    HeaderExtensionsMap,
    RtcpPsfbPacket,
    RtcpReceiverInfo,
    RtcpRrPacket,
    RtcpSrPacket,
    pack_header_extensions,
    unpack_header_extensions,
    unpack_remb_fci,
)
from aiortc.sdp import DTLS_ROLE_SETUP, H264Profile, SessionDescription, candidate_from_sdp, parse_h264_profile_level_id

from broker.protocol import INPUT_CHANNEL_LABEL, PROBE_CHANNEL_LABEL
from rbcommon.ice import advertise_host_addresses
from rbcommon.udpports import NoFreePort, PortRange
from streamer.desktop.inputs import ProbeAck, parse_input
from streamer.media.freezes import freeze_threshold_ms
from streamer.media.pacedtransport import PacedTransport
from streamer.media.pacer import PacerCounters, PacingQueue
from streamer.media.probe import LOOP_TICK_MS, PROBE_INTERVAL_MS, LoopLateness, ProbeSample, ProbeTracker
from streamer.media.rtx import RetransmitCounters, RetransmitLimiter

log = logging.getLogger(__name__)

# Packets kept to answer NACKs from: 1.4 s at 7 Mbps, as libwebrtc keeps about a second.
RETRANSMIT_HISTORY_PACKETS: Final = 1_024
aiortc_sender.RTP_HISTORY_SIZE = max(aiortc_sender.RTP_HISTORY_SIZE, RETRANSMIT_HISTORY_PACKETS)  # type: ignore[attr-defined]

# H.264 packetization-mode=1 profiles aiortc offers, in our order of preference:
# the encoder emits constrained baseline (42e01f), which is also valid baseline (42001f).
H264_PROFILE_PREFERENCE: Final = ("42e01f", "42001f")
VIDEO_RECEIVE_DIRECTIONS: Final = frozenset({"recvonly", "sendrecv"})  # offer directions that can take our video
# candidate messages held from before their offer (a viewer trickling early); more are dropped
EARLY_CANDIDATES_MAX: Final = 64


# What parse_offer accepts (aiortc's codec matching: the H.264 profile and packetization mode must
# equal one aiortc sends; the level is not compared), as no_common_codec states it to the viewer.
ACCEPTED_VIDEO_CODECS: Final = (
    "H264 Constrained Baseline (profile-level-id 42e0xx or 42c0xx) packetization-mode=1",
    "H264 Baseline (profile-level-id 4200xx) packetization-mode=1",
    "VP8",
)
_H264_PROFILE_NAMES: Final = {
    H264Profile.PROFILE_CONSTRAINED_BASELINE: "Constrained Baseline",
    H264Profile.PROFILE_BASELINE: "Baseline",
    H264Profile.PROFILE_MAIN: "Main",
    H264Profile.PROFILE_CONSTRAINED_HIGH: "Constrained High",
    H264Profile.PROFILE_HIGH: "High",
    H264Profile.PROFILE_PREDICTIVE_HIGH_444: "High 4:4:4 Predictive",
}


class OfferError(ValueError):
    """The viewer's offer (or candidate) cannot be used; ``code`` is stable, the message says why.

    ``fields``: extra members of the signaling ``error`` message (e.g. ``offered``/``accepted`` lists).
    """

    def __init__(self, code: str, detail: str, **fields: Any) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.fields = fields


# --- configuration ----------------------------------------------------------------------


def rtc_configuration(ice_servers: Sequence[Mapping[str, Any]]) -> RTCConfiguration:
    """An ``RTCConfiguration`` with exactly ``ice_servers`` (the broker's list; may be empty).

    Each entry: ``{"urls": str | [str, ...], "username": str?, "credential": str?}``.
    An empty list means host candidates only; never aiortc's default public STUN.
    Raises ``ValueError`` for a malformed entry or URL.  aiortc uses the first
    STUN and the first usable TURN server only (logged when more are given).
    """
    servers: list[RTCIceServer] = []
    for entry in ice_servers:
        urls = entry.get("urls")
        if isinstance(urls, str):
            urls = [urls]
        if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
            raise ValueError(f"ICE server needs 'urls' as a string or a list of strings: {entry!r}")
        username, credential = entry.get("username"), entry.get("credential")
        if username is not None and not isinstance(username, str):
            raise ValueError("ICE server 'username' must be a string")
        if credential is not None and not isinstance(credential, str):
            raise ValueError("ICE server 'credential' must be a string")
        servers.append(RTCIceServer(urls=list(urls), username=username, credential=credential))
    used = connection_kwargs(servers)  # aiortc's own parser: a malformed URL raises ValueError here, not later
    turn_urls = [u for s in servers for u in s.urls if isinstance(u, str) and u.startswith("turn")]
    if len(turn_urls) > 1 or (turn_urls and "turn_server" not in used):
        log.info("aiortc uses one TURN server (udp/tcp, password): %s of %s", used.get("turn_server"), turn_urls)
    return RTCConfiguration(iceServers=servers)


# --- codecs --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OfferInfo:
    """What a viewer's offer says about video and input."""

    video_codecs: frozenset[str]  # WebRTC codec names we can send to it (H264, VP8)
    has_input_channel: bool  # an application (SCTP) section is present


def parse_offer(sdp: str) -> OfferInfo:
    """Read the codecs the viewer can receive from an offer; ``OfferError`` if we cannot send it video.

    Uses aiortc's own codec matching (``find_common_codecs``), so what we
    select here is what ``setRemoteDescription`` will accept.
    """
    try:
        description = SessionDescription.parse(sdp)
    except (ValueError, KeyError, IndexError, AssertionError) as exc:
        raise OfferError("bad_sdp", f"offer SDP does not parse: {exc!r}") from exc
    videos = [m for m in description.media if m.kind == "video"]
    if not videos:
        raise OfferError("no_video", "the offer has no video section")
    video = videos[0]
    if video.direction not in VIDEO_RECEIVE_DIRECTIONS:
        raise OfferError("no_video", f"the offer's video section is {video.direction}, it cannot receive")
    local = [_codec_parameters(c) for c in RTCRtpSender.getCapabilities("video").codecs]
    common = find_common_codecs(local, video.rtp.codecs)
    names = frozenset(c.name.upper() for c in common if c.name.lower() != "rtx")
    if not names:
        offered = list(dict.fromkeys(describe_codec(c) for c in video.rtp.codecs if c.name.lower() != "rtx"))
        raise OfferError(
            "no_common_codec",
            f"the offer's video codecs are none the node can send: offered {'; '.join(offered) or 'none'}; "
            f"accepted {'; '.join(ACCEPTED_VIDEO_CODECS)}",
            offered=offered,
            accepted=list(ACCEPTED_VIDEO_CODECS),
        )
    return OfferInfo(video_codecs=names, has_input_channel=any(m.kind == "application" for m in description.media))


def describe_codec(codec: RTCRtpCodecParameters) -> str:
    """An offered codec as a client author reads it: ``H264 High 640c1f packetization-mode=0``, ``VP9``.

    H.264 names the profile aiortc reads from ``profile-level-id`` (absent = ``42e01f``, as aiortc
    assumes) and the packetization mode (absent = 0, RFC 6184).
    """
    if codec.name.lower() != "h264":
        return str(codec.name)
    level_id = str(codec.parameters.get("profile-level-id", "42e01f")).lower()
    try:
        profile = _H264_PROFILE_NAMES[parse_h264_profile_level_id(level_id)[0]]
    except ValueError:
        profile = "unknown profile"
    return f"H264 {profile} {level_id} packetization-mode={codec.parameters.get('packetization-mode', 0)}"


def _codec_parameters(capability: RTCRtpCodecCapability) -> RTCRtpCodecParameters:
    return RTCRtpCodecParameters(
        mimeType=capability.mimeType,
        clockRate=capability.clockRate,
        parameters=dict(capability.parameters),
    )


def codec_preferences(webrtc_codec: str) -> list[RTCRtpCodecCapability]:
    """Transceiver codec preferences that make the answer name ``webrtc_codec`` (H264 or VP8) only.

    H.264: packetization-mode 1, constrained baseline 42e01f first, then
    42001f; VP8 as is; RTX (retransmission on NACK) for the chosen codec.
    """
    codec = webrtc_codec.upper()
    capabilities = RTCRtpSender.getCapabilities("video").codecs
    chosen: list[RTCRtpCodecCapability] = []
    if codec == "H264":
        for profile in H264_PROFILE_PREFERENCE:
            chosen += [
                c
                for c in capabilities
                if c.name.upper() == "H264"
                and str(c.parameters.get("profile-level-id", "")).lower() == profile
                and str(c.parameters.get("packetization-mode", "0")) == "1"
            ]
    else:
        chosen += [c for c in capabilities if c.name.upper() == codec]
    if not chosen:
        raise ValueError(f"aiortc cannot send video codec {webrtc_codec!r}")
    chosen += [c for c in capabilities if c.name.lower() == "rtx"]
    return chosen


def answered_video_codec(sdp: str) -> str | None:
    """The codec name an SDP's first video section sends with (its first payload type), if any."""
    for media in SessionDescription.parse(sdp).media:
        if media.kind == "video" and media.rtp.codecs:
            return str(media.rtp.codecs[0].name)
    return None


def offer_receives_opus(sdp: str) -> bool:
    """True when the offer's first audio section can receive (recvonly/sendrecv) and names Opus.

    Such a viewer gets the session's sound (``ViewerPeer``'s ``audio_track``); an offer without
    one (a native client, an older page) is answered with video only, as before.
    """
    try:
        description = SessionDescription.parse(sdp)
    except (ValueError, KeyError, IndexError, AssertionError):
        return False
    audios = [m for m in description.media if m.kind == "audio"]
    return bool(audios) and audios[0].direction in VIDEO_RECEIVE_DIRECTIONS and any(
        c.name.lower() == "opus" for c in audios[0].rtp.codecs
    )


def opus_preferences() -> list[RTCRtpCodecCapability]:
    """Audio transceiver codec preferences: Opus only (48 kHz stereo, what the session's sink gives)."""
    return [c for c in RTCRtpSender.getCapabilities("audio").codecs if c.name.lower() == "opus"]


def answered_audio_codec(sdp: str) -> str | None:
    """The codec an SDP's first audio section sends with, if it has one that is not inactive/recvonly."""
    for media in SessionDescription.parse(sdp).media:
        if media.kind == "audio" and media.rtp.codecs and media.direction in ("sendonly", "sendrecv"):
            return str(media.rtp.codecs[0].name)
    return None


def candidate_from_signal(msg: Mapping[str, Any]) -> RTCIceCandidate | None:
    """A trickled ``{"type":"candidate",...}`` message as an aiortc ``RTCIceCandidate``; None = end of candidates.

    Raises ``OfferError`` for a malformed candidate.
    """
    text = msg.get("candidate")
    if text is None or text == "":
        return None
    if not isinstance(text, str):
        raise OfferError("bad_candidate", "'candidate' must be a string")
    if text.startswith("candidate:"):
        text = text[len("candidate:") :]
    try:
        candidate = candidate_from_sdp(text)
    except (AssertionError, ValueError, IndexError) as exc:
        raise OfferError("bad_candidate", f"candidate does not parse: {exc!r}") from exc
    mid, index = msg.get("sdpMid"), msg.get("sdpMLineIndex")
    if mid is None and index is None:
        raise OfferError("bad_candidate", "candidate needs sdpMid or sdpMLineIndex")
    candidate.sdpMid = str(mid) if mid is not None else None
    candidate.sdpMLineIndex = int(index) if isinstance(index, int) else None
    return candidate


def candidate_ufrag(msg: Mapping[str, Any]) -> str | None:
    """The ICE username fragment a ``candidate`` message names: its ``usernameFragment`` field
    (``RTCIceCandidate.toJSON()``) or the candidate line's ``ufrag`` attribute; None when neither."""
    ufrag = msg.get("usernameFragment")
    if isinstance(ufrag, str) and ufrag:
        return ufrag
    text = msg.get("candidate")
    if isinstance(text, str):
        tokens = text.split()
        for i, token in enumerate(tokens[:-1]):
            if token == "ufrag" and i >= 7:  # after the 8 fixed fields (foundation .. typ type)
                return tokens[i + 1]
    return None


def offer_ice_ufrag(sdp: str) -> str | None:
    """The ICE username fragment of an SDP's first section that has one."""
    for media in SessionDescription.parse(sdp).media:
        if media.ice is not None and media.ice.usernameFragment:
            return str(media.ice.usernameFragment)
    return None


# --- DTLS roles ---------------------------------------------------------------------------


def answer_dtls_passive(answer_sdp: str, offer_sdp: str) -> str:
    """``answer_sdp`` with ``a=setup:passive`` in each section whose offer said ``a=setup:actpass``.

    Why: aiortc answers ``actpass`` with ``active`` (the node is the DTLS client, the viewer the
    server with its own certificate), and aiortc's DTLS offers ECDHE-ECDSA suites only, so a
    viewer whose certificate is RSA (GStreamer's webrtcbin by default) fails the handshake with
    "no shared cipher".  As the DTLS server the node presents its ECDSA certificate, which every
    WebRTC stack can use (RFC 8827 requires TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256), and the
    viewer's RSA certificate is only a client certificate.  aiortc takes its role from the
    answer given to ``setLocalDescription``, so this is public API; widening the cipher list
    instead would mean overriding aiortc's private ``RTCCertificate._create_ssl_context``.
    Sections offered ``active`` are already answered ``passive``; ``passive`` offers keep ``active``.
    """
    offered = [m.dtls.role if m.dtls is not None else None for m in SessionDescription.parse(offer_sdp).media]
    head, *sections = answer_sdp.split("\r\nm=")
    for i, section in enumerate(sections):
        if i < len(offered) and offered[i] == "auto":
            lines = ["a=setup:passive" if line == "a=setup:active" else line for line in section.split("\r\n")]
            sections[i] = "\r\n".join(lines)
    return "\r\nm=".join([head, *sections])


def offered_dtls_setup(offer_sdp: str) -> str | None:
    """The ``a=setup`` value of an offer's first section that states one (``actpass``, ``active``, ``passive``)."""
    for media in SessionDescription.parse(offer_sdp).media:
        if media.dtls is not None and media.dtls.role is not None:
            return DTLS_ROLE_SETUP[media.dtls.role]
    return None


def answered_dtls_role(answer_sdp: str) -> str | None:
    """The node's DTLS role an answer states (first section): ``server`` (passive) or ``client`` (active)."""
    for media in SessionDescription.parse(answer_sdp).media:
        if media.dtls is not None and media.dtls.role in ("client", "server"):
            return str(media.dtls.role)
    return None


@dataclass(frozen=True, slots=True)
class PeerFailure:
    """Why a viewer connection failed: ``stage`` ``ice`` or ``dtls``; ``detail`` for the viewer."""

    stage: str
    detail: str


def _dtls_transports(pc: RTCPeerConnection) -> list[RTCDtlsTransport]:
    transports: dict[int, RTCDtlsTransport] = {}
    for transceiver in pc.getTransceivers():
        transports[id(transceiver.receiver.transport)] = transceiver.receiver.transport
    if pc.sctp is not None:
        transports[id(pc.sctp.transport)] = pc.sctp.transport
    return list(transports.values())


def path_kind(local_type: str, remote_type: str) -> str:
    """How a nominated ICE pair carries media: ``relay`` when either end is a TURN relay, ``srflx`` when
    either end is a NAT mapping (server- or peer-reflexive), else ``host`` (a direct path)."""
    kinds = {local_type, remote_type}
    if "relay" in kinds:
        return "relay"
    if kinds & {"srflx", "prflx"}:
        return "srflx"
    return "host"


def _count_text(counts: Counter[str]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "none"


# --- playout delay ------------------------------------------------------------------------

# libwebrtc's playout-delay extension: 3 bytes, 12-bit minimum and 12-bit maximum, in 10 ms units.
PLAYOUT_DELAY_URI: Final = "http://www.webrtc.org/experiments/rtp-hdrext/playout-delay"
PLAYOUT_DELAY_UNIT_MS: Final = 10
PLAYOUT_DELAY_LIMIT_MS: Final = 0xFFF * PLAYOUT_DELAY_UNIT_MS


@dataclass(frozen=True, slots=True)
class PlayoutDelay:
    """The playout delay range (ms, multiples of 10) the viewer's jitter buffer is asked to keep.

    min = max = 0 (the default): render each frame as soon as it is decoded.  Chromium then
    skips its jitter-buffer wait (libwebrtc's "zero playout delay"); a viewer that needs a
    buffer on a jittery path raises its own floor (``RTCRtpReceiver.jitterBufferTarget``,
    ``web/playout.js``).
    """

    min_ms: int = 0
    max_ms: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.min_ms <= self.max_ms <= PLAYOUT_DELAY_LIMIT_MS:
            raise ValueError(f"playout delay needs 0 <= min <= max <= {PLAYOUT_DELAY_LIMIT_MS} ms")
        if self.min_ms % PLAYOUT_DELAY_UNIT_MS or self.max_ms % PLAYOUT_DELAY_UNIT_MS:
            raise ValueError(f"playout delay is in {PLAYOUT_DELAY_UNIT_MS} ms units")

    def payload(self) -> bytes:
        """The extension's 3 bytes: min and max, 12 bits each, in 10 ms units."""
        lo, hi = self.min_ms // PLAYOUT_DELAY_UNIT_MS, self.max_ms // PLAYOUT_DELAY_UNIT_MS
        return bytes(((lo >> 4) & 0xFF, ((lo & 0xF) << 4) | (hi >> 8), hi & 0xFF))

    @classmethod
    def parse(cls, payload: bytes) -> PlayoutDelay:
        """The inverse of ``payload``."""
        if len(payload) != 3:
            raise ValueError("a playout-delay element is 3 bytes")
        lo = (payload[0] << 4) | (payload[1] >> 4)
        hi = ((payload[1] & 0xF) << 8) | payload[2]
        return cls(lo * PLAYOUT_DELAY_UNIT_MS, hi * PLAYOUT_DELAY_UNIT_MS)


class PlayoutDelayExtensions(HeaderExtensionsMap):
    """aiortc's header-extension map that also writes the playout-delay element, when negotiated.

    ``configure`` (aiortc calls it from ``RTCRtpSender.send`` with the negotiated parameters)
    notes the extension's id; ``set`` (called for every packet the sender serializes, media and
    retransmissions) appends the element after aiortc's own ones.  Every packet carries it
    (4 bytes): libwebrtc reads the delay from a frame's first packet, and any packet may be lost.
    """

    delay: PlayoutDelay = PlayoutDelay()
    playout_id: int | None = None
    _payload: bytes = PlayoutDelay().payload()

    def configure(self, parameters: RTCRtpParameters) -> None:
        super().configure(parameters)
        self.playout_id = next((e.id for e in parameters.headerExtensions if e.uri == PLAYOUT_DELAY_URI), None)

    def set(self, values: HeaderExtensions) -> tuple[int, bytes]:
        profile, value = super().set(values)
        if self.playout_id is None:
            return profile, value
        elements = unpack_header_extensions(profile, value) if value else []
        return pack_header_extensions([*elements, (self.playout_id, self._payload)])


_SENDER_EXTENSIONS_MAP: Final = "_RTCRtpSender__rtp_header_extensions_map"  # aiortc 1.16's (name-mangled)


def enable_playout_delay(transceiver: RTCRtpTransceiver, offer_sdp: str, delay: PlayoutDelay) -> bool:
    """Answer the offer's playout-delay extension on ``transceiver`` and write ``delay`` on every packet.

    Call after ``setRemoteDescription(offer)`` and before ``createAnswer``/``setLocalDescription``.
    Returns False (nothing changed) when the offer's section for this transceiver does not offer
    the extension, or when aiortc's internals are not as expected (logged: the stream works,
    with the viewer's default buffering).
    """
    media = next(
        (m for m in SessionDescription.parse(offer_sdp).media if m.kind == "video" and m.rtp.muxId == transceiver.mid),
        None,
    )
    offered = next((e for e in media.rtp.headerExtensions if e.uri == PLAYOUT_DELAY_URI), None) if media else None
    if offered is None:
        return False
    negotiated = getattr(transceiver, "_headerExtensions", None)
    extensions_map = getattr(transceiver.sender, _SENDER_EXTENSIONS_MAP, None)
    if not isinstance(negotiated, list) or type(extensions_map) not in (HeaderExtensionsMap, PlayoutDelayExtensions):
        log.warning("aiortc's header-extension internals changed: playout delay not sent (viewer buffers as usual)")
        return False
    if all(e.uri != PLAYOUT_DELAY_URI for e in negotiated):
        negotiated.append(RTCRtpHeaderExtensionParameters(id=offered.id, uri=PLAYOUT_DELAY_URI))
    extensions_map.__class__ = PlayoutDelayExtensions
    adopted = cast(PlayoutDelayExtensions, extensions_map)
    adopted.delay, adopted._payload = delay, delay.payload()
    return True


# --- probe timing --------------------------------------------------------------------------


class ProbeTimingSctp(RTCSctpTransport):
    """``RTCSctpTransport`` that reports when each message of one stream (the probe channel) leaves."""

    _timed_stream: int | None = None
    _on_sent: Callable[[bytes], None] | None = None

    @classmethod
    def adopt(cls, sctp: RTCSctpTransport, stream_id: int, on_sent: Callable[[bytes], None]) -> bool:
        """Report the first transmission of each DATA chunk on ``stream_id`` to ``on_sent(user_data)``.

        False (nothing changed) for an SCTP transport of an unexpected type.
        """
        if type(sctp) is not RTCSctpTransport and not isinstance(sctp, cls):
            return False
        sctp.__class__ = cls
        timed = cast(ProbeTimingSctp, sctp)
        timed._timed_stream, timed._on_sent = stream_id, on_sent
        return True

    async def _send_chunk(self, chunk: Chunk) -> None:
        on_sent = self._on_sent
        if (
            on_sent is not None
            and isinstance(chunk, DataChunk)
            and chunk.stream_id == self._timed_stream
            and getattr(chunk, "_sent_count", 1) <= 1
        ):
            on_sent(chunk.user_data)
        await super()._send_chunk(chunk)


# --- RTCP feedback -----------------------------------------------------------------------


class FeedbackSink(Protocol):
    """Where ``FeedbackSender`` reports; called on the event loop, must not block."""

    def on_keyframe_request(self, kind: str) -> None: ...  # "pli" | "fir"

    def on_remb(self, bitrate_bps: int) -> None: ...

    def on_receiver_report(self, report: RtcpReceiverInfo) -> None: ...


ABS_SEND_TIME_URI: Final = "http://www.webrtc.org/experiments/rtp-hdrext/abs-send-time"


class FeedbackSender(RTCRtpSender):
    """``RTCRtpSender`` that also reports PLI/FIR, REMB and receiver reports (see module docstring)."""

    _feedback_sink: FeedbackSink | None = None
    _retransmit_limiter: RetransmitLimiter | None = None
    _paced: PacedTransport | None = None

    @property
    def transport(self) -> Any:
        """The real transport, or its paced view (``pace``) while that wraps the transport in force."""
        real = super().transport
        paced = self._paced
        return paced if paced is not None and paced.inner is real else real

    def pace(self, queue: PacingQueue[bytes]) -> PacedTransport:
        """Send this sender's RTP through ``queue`` (``streamer.media.pacedtransport``); RTCP unpaced."""
        self._paced = PacedTransport(super().transport, queue)
        return self._paced

    def stop_pacing(self) -> None:
        if self._paced is not None:
            self._paced.close()

    async def send(self, parameters: RTCRtpSendParameters) -> None:
        paced = self._paced
        if paced is not None:
            paced.inner = super().transport  # the bundle's transport, set by setRemoteDescription
            paced.abs_send_time_id = next(
                (e.id for e in parameters.headerExtensions if e.uri == ABS_SEND_TIME_URI), None
            )
        await super().send(parameters)

    @classmethod
    def adopt(
        cls, sender: RTCRtpSender, sink: FeedbackSink, limiter: RetransmitLimiter | None = None
    ) -> FeedbackSender:
        """Turn the sender aiortc created into a ``FeedbackSender`` reporting to ``sink``.

        ``limiter``: which NACKed packets to retransmit (``streamer.media.rtx``); None: all, as aiortc does.
        """
        if type(sender) is not RTCRtpSender and not isinstance(sender, cls):
            raise TypeError(f"unexpected sender type {type(sender).__name__}")
        sender.__class__ = cls
        adopted = cast(FeedbackSender, sender)
        adopted._feedback_sink = sink
        adopted._retransmit_limiter = limiter
        return adopted

    async def _retransmit(self, sequence_number: int) -> None:
        limiter = self._retransmit_limiter
        copies = 1 if limiter is None else limiter.copies(sequence_number, _now_ms())
        paced = self._paced
        for _ in range(copies):
            if paced is None:
                await super()._retransmit(sequence_number)
                continue
            # the paced transport queues the packet before the first suspension: the flag covers it alone
            paced.priority = True
            try:
                await super()._retransmit(sequence_number)
            finally:
                paced.priority = False

    def detach_feedback(self) -> None:
        self._feedback_sink = None

    async def _handle_rtcp_packet(self, packet: AnyRtcpPacket) -> None:
        await super()._handle_rtcp_packet(packet)  # aiortc: RTT, stats, NACK retransmission
        sink = self._feedback_sink
        if sink is None:
            return
        if isinstance(packet, RtcpRrPacket | RtcpSrPacket):
            for report in packet.reports:
                if report.ssrc == self._ssrc:
                    sink.on_receiver_report(report)
        elif isinstance(packet, RtcpPsfbPacket):
            if packet.fmt == RTCP_PSFB_PLI:
                sink.on_keyframe_request("pli")
            elif packet.fmt == RTCP_PSFB_FIR:
                sink.on_keyframe_request("fir")
            elif packet.fmt == RTCP_PSFB_APP:
                try:
                    bitrate_bps, ssrcs = unpack_remb_fci(packet.fci)
                except ValueError:
                    return  # an APP message that is not REMB
                if self._ssrc in ssrcs:
                    sink.on_remb(bitrate_bps)


@dataclass(frozen=True, slots=True)
class RemoteFeedback:
    """Feedback gathered since the previous ``ViewerPeer.poll_feedback``.

    ``report`` and ``rtt_ms`` are set only when a new receiver report arrived
    (so a controller never counts one report twice); ``remb_bps`` only when a
    new REMB arrived.  ``bytes_sent`` is cumulative RTP payload bytes,
    ``packets_sent`` cumulative RTP packets.  ``probe``: the period's delay
    probes (``streamer.media.probe``); all None when the viewer opened no probe channel.
    """

    remb_bps: int | None
    report: RtcpReceiverInfo | None  # fraction_lost 0-255, packets_lost cumulative, jitter in 90 kHz units
    rtt_ms: float | None
    bytes_sent: int
    keyframe_requests: int  # PLI + FIR since the connection started
    packets_sent: int = 0
    probe: ProbeSample = ProbeSample(None, 0, None)


class _FeedbackCollector:
    """Collects ``FeedbackSender`` reports between polls (one loop: no lock)."""

    def __init__(self, on_keyframe_request: Callable[[], None]) -> None:
        self._on_keyframe_request = on_keyframe_request
        self.remb_bps: int | None = None
        self.report: RtcpReceiverInfo | None = None
        self.keyframe_requests = 0

    def on_keyframe_request(self, kind: str) -> None:
        self.keyframe_requests += 1
        log.debug("viewer asked for a keyframe (%s)", kind)
        self._on_keyframe_request()

    def on_remb(self, bitrate_bps: int) -> None:
        self.remb_bps = bitrate_bps

    def on_receiver_report(self, report: RtcpReceiverInfo) -> None:
        self.report = report

    def take(self) -> tuple[int | None, RtcpReceiverInfo | None]:
        remb, report = self.remb_bps, self.report
        self.remb_bps = self.report = None
        return remb, report


# --- the connection --------------------------------------------------------------------------


class InputHandler(Protocol):
    """Where a viewer's input-channel messages go: the session's ``InputRouter``, or a view-only viewer's
    handler (``streamer.media.viewers.ViewOnlyInput``)."""

    def handle(self, raw: str | bytes, reply: Callable[[dict[str, Any]], object]) -> None: ...

    def release_all(self) -> None: ...


@dataclass(frozen=True, slots=True)
class PeerSettings:
    """ICE settings for a viewer connection."""

    ice_servers: tuple[Mapping[str, Any], ...] = ()
    advertise_addresses: tuple[str, ...] = ()
    udp_ports: PortRange | None = None  # host candidates on ports of this range; None: any port
    # send the playout-delay extension (starting at min = max = 0) to viewers whose offer has it (Chromium's does)
    playout_delay: bool = True
    # pace the video sender's RTP at a multiple of the target (``streamer.media.pacer``); off: aiortc's bursts
    pacing: bool = True


class ViewerPeer:
    """One viewer: an answering ``RTCPeerConnection`` sending ``track`` (and ``audio_track`` to an offer
    that can receive Opus) and reading the input channel.

    Callbacks run on the event loop: ``on_state(peer, connectionState)``,
    ``on_channel_open(peer)`` once the input channel is usable,
    ``on_keyframe_request()`` on every PLI/FIR.
    """

    def __init__(
        self,
        settings: PeerSettings,
        track: MediaStreamTrack,
        router: InputHandler,
        *,
        target_bps: int,
        on_state: Callable[[ViewerPeer, str], None],
        on_channel_open: Callable[[ViewerPeer], None],
        on_keyframe_request: Callable[[], None],
        audio_track: MediaStreamTrack | None = None,
    ) -> None:
        self._settings = settings
        self._track = track
        self._audio_track = audio_track  # the session's sound; sent when the offer can receive Opus
        self.audio_codec: str | None = None  # the audio codec the answer sends ("opus"), None: no sound
        self._router = router
        self._on_state = on_state
        self._on_channel_open = on_channel_open
        self._feedback = _FeedbackCollector(on_keyframe_request)
        self._sender: FeedbackSender | None = None
        self._channel: RTCDataChannel | None = None
        self._probe_channel: RTCDataChannel | None = None
        self._probes = ProbeTracker()
        self._loop_lateness = LoopLateness()
        self._loop_watch: asyncio.Task[None] | None = None
        self._retransmits = RetransmitLimiter(target_bps)
        self._pacer: PacingQueue[bytes] | None = PacingQueue(target_bps) if settings.pacing else None
        self._probe_task: asyncio.Task[None] | None = None
        self._close_task: asyncio.Future[None] | None = None
        self.codec: str | None = None  # codec name the answer selected
        self.dtls_role: str | None = None  # the node's DTLS role once answered: "server" (passive) or "client"
        self.remote_ufrag: str | None = None  # the offer's ICE username fragment
        self.offered_setup: str | None = None  # the offer's a=setup value (first section)
        self.early_candidates = 0  # candidates from before the offer that were added
        self._connected_at: float | None = None  # monotonic s when the connection first reached connected
        self.playout_delay = False  # the answer has the playout-delay extension: set_playout_delay works
        self.pc = RTCPeerConnection(rtc_configuration(settings.ice_servers))
        self.pc.on("connectionstatechange", self._state_changed)
        self.pc.on("datachannel", self._datachannel)

    @property
    def connection_state(self) -> str:
        return str(self.pc.connectionState)

    @property
    def channel_open(self) -> bool:
        return self._channel is not None and self._channel.readyState == "open"

    async def answer(
        self, offer_sdp: str, webrtc_codec: str, early_candidates: Sequence[Mapping[str, Any]] = ()
    ) -> str:
        """Apply the viewer's offer and return our answer SDP (candidates included).

        ``early_candidates``: ``candidate`` messages the viewer trickled before this offer; they are
        added once the offer is applied (those naming another ICE ufrag are skipped, malformed ones
        dropped; both logged).  The answer makes the node the DTLS server where the offer lets it
        choose (``answer_dtls_passive``).
        """
        transceiver = self.pc.addTransceiver(self._track, direction="sendonly")
        transceiver.setCodecPreferences(codec_preferences(webrtc_codec))
        self._sender = FeedbackSender.adopt(transceiver.sender, self._feedback, self._retransmits)
        if self._pacer is not None:
            self._sender.pace(self._pacer)
        if self._audio_track is not None and offer_receives_opus(offer_sdp):
            # matched to the offer's audio section by kind in setRemoteDescription, like the video one
            self.pc.addTransceiver(self._audio_track, direction="sendonly").setCodecPreferences(opus_preferences())
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        if transceiver.mid is None:
            raise OfferError("no_video", "the offer's video section did not match our sending transceiver")
        self.remote_ufrag = offer_ice_ufrag(offer_sdp)
        self.offered_setup = offered_dtls_setup(offer_sdp)
        for msg in early_candidates:
            await self.add_candidate(msg, early=True)
        if self._settings.playout_delay:
            self.playout_delay = enable_playout_delay(transceiver, offer_sdp, PlayoutDelay())
        advertise_host_addresses(self.pc, self._settings.advertise_addresses, self._settings.udp_ports)
        answer = await self.pc.createAnswer()
        answer_sdp = answer_dtls_passive(answer.sdp, offer_sdp)
        try:
            await self.pc.setLocalDescription(RTCSessionDescription(sdp=answer_sdp, type="answer"))
        except NoFreePort as exc:  # gathering: every port of the node's udp_ports range is taken
            raise OfferError("no_udp_port", f"{exc.strerror}: the node has no free port for this viewer's media; "
                             "try again when a session ends") from exc
        answer_sdp = str(self.pc.localDescription.sdp)
        self.dtls_role = answered_dtls_role(answer_sdp)
        self.codec = answered_video_codec(answer_sdp)
        self.audio_codec = answered_audio_codec(answer_sdp)
        return answer_sdp

    async def add_candidate(self, msg: Mapping[str, Any], *, early: bool = False) -> bool:
        """Add a trickled remote candidate; False when it names another ICE ufrag than the offer's.

        Raises ``OfferError`` if malformed, unless ``early`` (a candidate held from before the
        offer: logged and dropped, as there is nobody to answer any more).
        """
        ufrag = candidate_ufrag(msg)
        if ufrag is not None and self.remote_ufrag is not None and ufrag != self.remote_ufrag:
            log.info("candidate for ICE ufrag %r, the offer's is %r: not added", ufrag, self.remote_ufrag)
            return False
        try:
            await self.pc.addIceCandidate(candidate_from_signal(msg))
        except (OfferError, ValueError) as exc:
            if not early:
                raise
            log.info("a candidate sent before the offer does not apply: %r", exc)
            return False
        if early:
            self.early_candidates += 1
        return True

    @property
    def viewer_freezes(self) -> int:
        """Freezes the viewer's decoded-frame count showed (probe answers with ``fd``; 0 without them)."""
        return self._probes.freezes

    @property
    def first_decoded_ms(self) -> float | None:
        """When (node monotonic ms) the viewer first reported a decoded frame; None: not (yet) reported."""
        return self._probes.first_decoded_ms

    def set_frame_rate(self, fps: float) -> None:
        """The frame rate sent now: a viewer freeze is a standstill of ``freeze_threshold_ms(fps)``."""
        self._probes.freeze_threshold_ms = freeze_threshold_ms(fps)

    def candidate_type(self) -> str | None:
        """The path the media takes (`path_kind` of the nominated pair), or None before ICE nominates one.

        Reads aioice's nominated pair through the gatherer's connection (the private attribute this
        module already depends on, see the module docstring).
        """
        for dtls in _dtls_transports(self.pc):
            connection = getattr(dtls.transport.iceGatherer, "_connection", None)
            nominated = getattr(connection, "_nominated", None) or {}
            for pair in nominated.values():
                return path_kind(pair.local_candidate.type, pair.remote_candidate.type)
        return None

    def failure(self) -> PeerFailure | None:
        """Why the connection failed (ICE or DTLS, with what a viewer can act on); None if nothing failed.

        Read from aiortc's public transport states (``RTCIceTransport.state``,
        ``RTCDtlsTransport.state``); ICE first, as a DTLS transport over a failed ICE fails too.
        """
        dtls = _dtls_transports(self.pc)
        ice = [t.transport for t in dtls]
        if any(t.state == "failed" for t in ice):
            local = Counter(c.type for t in ice for c in t.iceGatherer.getLocalCandidates())
            remote = Counter(c.type for t in ice for c in t.getRemoteCandidates())
            when = (
                f"after {time.monotonic() - self._connected_at:.1f} s connected (consent lost: the viewer went away)"
                if self._connected_at is not None
                else "before connecting: no candidate pair answered"
            )
            return PeerFailure(
                "ice",
                f"ICE failed {when}; node candidates {_count_text(local)}, viewer candidates "
                f"{_count_text(remote)}. Use the session's ICE servers as given (a TURN relay when "
                "the node is not reachable directly) and send every candidate, in the offer or trickled",
            )
        if any(t.state == "failed" for t in dtls):
            if self.dtls_role == "client":
                detail = (
                    f"DTLS handshake failed after ICE connected. The node was the DTLS client (the offer said "
                    f"a=setup:{self.offered_setup}); it offers only ECDHE-ECDSA cipher suites with its ECDSA "
                    "P-256 certificate, so a viewer whose certificate is RSA fails with 'no shared cipher'. "
                    "Offer a=setup:actpass (the node then is the DTLS server) or use an ECDSA certificate"
                )
            else:
                detail = (
                    "DTLS handshake failed after ICE connected. The node was the DTLS server (ECDSA P-256 "
                    "certificate, ECDHE-ECDSA cipher suites, DTLS-SRTP AEAD_AES_256_GCM, AEAD_AES_128_GCM or "
                    "AES128_CM_SHA1_80): the viewer needs TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 (RFC 8827), "
                    "one of those SRTP profiles, and an a=fingerprint that matches its certificate"
                )
            return PeerFailure("dtls", detail)
        return None

    def send_event(self, payload: Mapping[str, Any]) -> bool:
        """Send a node event (``NodeEventType``) on the input channel; False if it is not open."""
        channel = self._channel
        if channel is None or channel.readyState != "open":
            return False
        try:
            channel.send(json.dumps(payload, separators=(",", ":")))
        except Exception as exc:  # the SCTP association is closing under us
            log.debug("send on the input channel failed: %r", exc)
            return False
        return True

    async def poll_feedback(self) -> RemoteFeedback:
        """Feedback since the previous poll (see ``RemoteFeedback``)."""
        remb, report = self._feedback.take()
        rtt_ms: float | None = None
        bytes_sent = packets_sent = 0
        if self._sender is not None:
            for stats in (await self._sender.getStats()).values():
                if stats.type == "remote-inbound-rtp" and report is not None:
                    rtt_s = getattr(stats, "roundTripTime", None)
                    rtt_ms = rtt_s * 1000.0 if rtt_s is not None else None
                elif stats.type == "outbound-rtp":
                    bytes_sent = int(stats.bytesSent)
                    packets_sent = int(stats.packetsSent)
        probe = self._probes.take(_now_ms())
        rtt_now = probe.rtt_ms if probe.rtt_ms is not None else rtt_ms
        if rtt_now is not None:
            self._retransmits.rtt_ms = rtt_now
        return RemoteFeedback(remb, report, rtt_ms, bytes_sent, self._feedback.keyframe_requests, packets_sent, probe)

    def set_playout_delay(self, delay: PlayoutDelay) -> bool:
        """Write ``delay`` on the packets from now on; False when this viewer gets no playout-delay extension."""
        sender = self._sender
        extensions_map = getattr(sender, _SENDER_EXTENSIONS_MAP, None) if self.playout_delay else None
        if not isinstance(extensions_map, PlayoutDelayExtensions):
            return False
        extensions_map.delay, extensions_map._payload = delay, delay.payload()
        return True

    def set_target(
        self, target_bps: int, duplicate_retransmissions: bool = False, frame_interval_ms: float | None = None
    ) -> None:
        """The video target in force: the retransmission budget is a share of it, the pacing rate a multiple.

        ``duplicate_retransmissions``: send each retransmission twice (the loss is random, not a
        queue's: see ``streamer.media.rtx.RetransmitLimiter.duplicate``).  ``frame_interval_ms``: the
        pacer's queue bound (``streamer.media.pacer``), one frame interval.
        """
        self._retransmits.target_bps = target_bps
        self._retransmits.duplicate = duplicate_retransmissions
        if self._pacer is not None:
            self._pacer.target_bps = float(target_bps)
            if frame_interval_ms is not None:
                self._pacer.max_delay_ms = frame_interval_ms

    @property
    def pacer(self) -> PacerCounters | None:
        """What the send pacer has released (None: not pacing)."""
        return self._pacer.counters if self._pacer is not None else None

    @property
    def retransmits(self) -> RetransmitCounters:
        return self._retransmits.counters

    async def close(self) -> None:
        """Close the connection (stops the sender and its track).  Idempotent.

        Shielded: a caller cancelled meanwhile does not leave aiortc half
        closed (its ``close`` cannot be resumed by a second call).
        """
        if self._close_task is None:
            if self._probe_task is not None:
                self._probe_task.cancel()
            if self._loop_watch is not None:
                self._loop_watch.cancel()
            if self._sender is not None:
                self._sender.detach_feedback()
                self._sender.stop_pacing()
            self._router.release_all()
            self._close_task = asyncio.ensure_future(self.pc.close())
        await asyncio.shield(self._close_task)

    # -- aiortc callbacks ------------------------------------------------------------------

    def _state_changed(self) -> None:
        if self.connection_state == "connected" and self._connected_at is None:
            self._connected_at = time.monotonic()
        self._on_state(self, self.connection_state)

    def _datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label == PROBE_CHANNEL_LABEL and self._probe_channel is None:
            self._probe_channel = channel
            channel.on("message", self._probe_answer)
            if self._probe_task is None and self._close_task is None:
                self._probe_task = asyncio.ensure_future(self._send_probes(channel))
                self._loop_watch = asyncio.ensure_future(self._watch_loop())
            return
        if channel.label != INPUT_CHANNEL_LABEL:
            log.info("ignoring data channel %r (only %r carries input)", channel.label, INPUT_CHANNEL_LABEL)
            return
        self._channel = channel
        channel.on("message", self._message)
        if channel.readyState == "open":
            self._on_channel_open(self)
        else:
            channel.on("open", lambda: self._on_channel_open(self))

    def _message(self, raw: str | bytes) -> None:
        self._router.handle(raw, self.send_event)

    def _probe_answer(self, raw: str | bytes) -> None:
        ack = parse_input(raw)
        if isinstance(ack, ProbeAck):
            now_ms = _now_ms()
            self._probes.answer(ack, now_ms, self._loop_lateness.late_ms(now_ms))
        else:
            log.debug("ignoring %r on the probe channel", raw[:80])

    def _probe_left(self, user_data: bytes) -> None:
        """A probe message went on the wire now (``ProbeTimingSctp``): its round trip starts here."""
        try:
            probe_id = json.loads(user_data)["id"]
        except (ValueError, KeyError, TypeError):
            return
        if isinstance(probe_id, int):
            self._probes.sent(probe_id, _now_ms())

    async def _watch_loop(self) -> None:
        """Tick every ``LOOP_TICK_MS`` and note how late each tick ran (the loop's lateness)."""
        while True:
            due_ms = _now_ms() + LOOP_TICK_MS
            await asyncio.sleep(LOOP_TICK_MS / 1000.0)
            self._loop_lateness.tick(due_ms, _now_ms())

    async def _send_probes(self, channel: RTCDataChannel) -> None:
        """A probe every ``PROBE_INTERVAL_MS`` while the probe channel is open (ends with it)."""
        timed = False
        try:
            while channel.readyState in ("connecting", "open"):
                if not timed and channel.readyState == "open" and channel.id is not None and self.pc.sctp is not None:
                    timed = ProbeTimingSctp.adopt(self.pc.sctp, channel.id, self._probe_left)
                    if not timed:
                        log.warning("aiortc's SCTP transport changed: probe round trips start when queued")
                        timed = True  # do not try again
                if channel.readyState == "open":
                    channel.send(json.dumps(self._probes.probe(_now_ms()), separators=(",", ":")))
                await asyncio.sleep(PROBE_INTERVAL_MS / 1000.0)
        except Exception as exc:  # the SCTP association is closing under us
            log.debug("probe channel ended: %r", exc)


def _now_ms() -> float:
    return time.monotonic() * 1000.0
