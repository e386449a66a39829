"""The viewer connection's seams: ICE configuration, advertised addresses, offers, codecs, RTCP feedback."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCRtpSender, RTCSessionDescription, VideoStreamTrack
from aiortc.rtp import (
    RTCP_PSFB_APP,
    RTCP_PSFB_FIR,
    RTCP_PSFB_PLI,
    RtcpPsfbPacket,
    RtcpReceiverInfo,
    RtcpRrPacket,
    RtpPacket,
    is_rtcp,
    pack_remb_fci,
    unpack_header_extensions,
)

from broker.protocol import INPUT_CHANNEL_LABEL
from rbcommon.ice import AdvertisingConnection
from streamer.media.peer import (
    PLAYOUT_DELAY_URI,
    FeedbackSender,
    OfferError,
    PlayoutDelay,
    advertise_host_addresses,
    answer_dtls_passive,
    answered_audio_codec,
    answered_dtls_role,
    answered_video_codec,
    candidate_from_signal,
    candidate_ufrag,
    codec_preferences,
    enable_playout_delay,
    offer_receives_opus,
    opus_preferences,
    parse_offer,
    path_kind,
    rtc_configuration,
)
from streamer.media.rtx import RetransmitLimiter

pytestmark = pytest.mark.timeout(60)


async def viewer_offer(codecs: tuple[str, ...] | None = None, direction: str = "recvonly") -> str:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        transceiver = pc.addTransceiver("video", direction=direction)
        if codecs is not None:
            caps = RTCRtpSender.getCapabilities("video").codecs
            transceiver.setCodecPreferences([c for c in caps if c.name in codecs])
        pc.createDataChannel(INPUT_CHANNEL_LABEL)
        offer = await pc.createOffer()
        advertise_host_addresses(pc, ["127.0.0.1"])
        await pc.setLocalDescription(offer)
        return str(pc.localDescription.sdp)
    finally:
        await pc.close()


def host_candidates(sdp: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"a=candidate:\S+ \d+ udp \d+ (\S+) \d+ typ host", sdp)}


def test_configuration_has_only_the_given_servers() -> None:
    assert rtc_configuration([]).iceServers == []  # never aiortc's default Google STUN
    config = rtc_configuration([{"urls": "turn:10.0.0.1:3478", "username": "u", "credential": "p"}])
    assert config.iceServers is not None and len(config.iceServers) == 1
    assert config.iceServers[0].urls == ["turn:10.0.0.1:3478"]
    assert config.iceServers[0].username == "u"
    for bad in ({}, {"urls": []}, {"urls": [1]}, {"urls": "stun:x", "username": 5}):
        with pytest.raises(ValueError):
            rtc_configuration([bad])


async def test_advertised_addresses_are_the_only_host_candidates() -> None:
    sdp = await viewer_offer()
    assert host_candidates(sdp) == {"127.0.0.1"}  # aioice alone would skip 127.0.0.1


async def test_advertise_after_gathering_is_refused_and_empty_keeps_the_default() -> None:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        pc.addTransceiver("video", direction="recvonly")
        assert advertise_host_addresses(pc, []) == 0
        await pc.setLocalDescription(await pc.createOffer())
        assert "127.0.0.1" not in host_candidates(pc.localDescription.sdp)
        with pytest.raises(RuntimeError):
            advertise_host_addresses(pc, ["127.0.0.1"])
    finally:
        await pc.close()


async def test_advertising_connection_binds_only_its_addresses() -> None:
    connection = AdvertisingConnection(ice_controlling=True, use_ipv6=False)
    connection.advertise_addresses = ("127.0.0.1",)
    try:
        await connection.gather_candidates()
        assert [(c.host, c.type) for c in connection.local_candidates] == [("127.0.0.1", "host")]
    finally:
        await connection.close()


async def test_parse_offer_reads_receivable_codecs() -> None:
    info = parse_offer(await viewer_offer())
    assert info.video_codecs == frozenset({"H264", "VP8"}) and info.has_input_channel
    assert parse_offer(await viewer_offer(("VP8",))).video_codecs == frozenset({"VP8"})
    with pytest.raises(OfferError) as cannot_receive:
        parse_offer(await viewer_offer(direction="sendonly"))
    assert cannot_receive.value.code == "no_video"
    with pytest.raises(OfferError) as garbage:
        parse_offer("this is not SDP")
    assert garbage.value.code in ("bad_sdp", "no_video")


def test_codec_preferences_put_constrained_baseline_first() -> None:
    h264 = codec_preferences("H264")
    assert h264[0].name == "H264" and h264[0].parameters["profile-level-id"] == "42e01f"
    assert all(c.name in ("H264", "rtx") for c in h264)
    assert all(c.parameters.get("packetization-mode") == "1" for c in h264 if c.name == "H264")
    assert [c.name for c in codec_preferences("vp8")] == ["VP8", "rtx"]
    with pytest.raises(ValueError):
        codec_preferences("AV1")


def test_candidate_from_signal() -> None:
    line = "candidate:1 1 udp 2130706431 127.0.0.1 50000 typ host"
    candidate = candidate_from_signal({"type": "candidate", "candidate": line, "sdpMid": "0", "sdpMLineIndex": 0})
    assert candidate is not None and (candidate.ip, candidate.port, candidate.sdpMid) == ("127.0.0.1", 50000, "0")
    assert candidate_from_signal({"type": "candidate", "candidate": ""}) is None  # end of candidates
    for bad in ({"candidate": "candidate:garbage"}, {"candidate": line}, {"candidate": 5}):
        with pytest.raises(OfferError):
            candidate_from_signal(bad)


def test_candidate_ufrag_from_the_field_or_the_line() -> None:
    line = "candidate:1 1 udp 2130706431 127.0.0.1 50000 typ host generation 0 ufrag AbCd network-id 1"
    assert candidate_ufrag({"candidate": line}) == "AbCd"
    assert candidate_ufrag({"candidate": line, "usernameFragment": "Zz"}) == "Zz"
    assert candidate_ufrag({"candidate": "candidate:1 1 udp 2130706431 127.0.0.1 50000 typ host"}) is None
    assert candidate_ufrag({"candidate": ""}) is None


async def test_no_common_codec_names_the_offered_profiles_and_what_is_accepted() -> None:
    sdp = await viewer_offer(("H264",))
    high = re.sub(r"profile-level-id=42[0-9a-f]{4}", "profile-level-id=64001f", sdp)
    mode0 = sdp.replace("packetization-mode=1", "packetization-mode=0")
    for offer, named in ((high, "H264 High 64001f packetization-mode=1"),
                         (mode0, "H264 Constrained Baseline 42e01f packetization-mode=0")):
        with pytest.raises(OfferError) as refused:
            parse_offer(offer)
        assert refused.value.code == "no_common_codec"
        assert named in refused.value.fields["offered"] and named in refused.value.detail
        assert refused.value.fields["accepted"][-1] == "VP8" and "4200xx" in refused.value.detail
    assert parse_offer(sdp.replace("profile-level-id=42e01f", "profile-level-id=42e034")).video_codecs == {"H264"}


async def test_an_actpass_offer_is_answered_passive_and_aiortc_takes_the_server_role() -> None:
    offer = await viewer_offer()
    node = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        node.addTransceiver(VideoStreamTrack(), direction="sendonly")
        await node.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
        answer = await node.createAnswer()
        assert "a=setup:active" in answer.sdp  # aiortc's own choice
        passive = answer_dtls_passive(answer.sdp, offer)
        assert "a=setup:active" not in passive and passive.count("a=setup:passive") == answer.sdp.count("a=setup:")
        assert passive.replace("a=setup:passive", "a=setup:active") == answer.sdp  # nothing else changed
        await node.setLocalDescription(RTCSessionDescription(sdp=passive, type="answer"))
        assert answered_dtls_role(node.localDescription.sdp) == "server"
        assert {t.receiver.transport._role for t in node.getTransceivers()} == {"server"}
        # an offer that wants to be the DTLS server (passive) keeps its active answer
        pinned = offer.replace("a=setup:actpass", "a=setup:passive")
        assert answer_dtls_passive(answer.sdp, pinned) == answer.sdp
    finally:
        await node.close()


def test_answered_video_codec() -> None:
    sdp = (
        "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n"
        "m=video 9 UDP/TLS/RTP/SAVPF 97\r\nc=IN IP4 0.0.0.0\r\na=mid:0\r\na=sendonly\r\n"
        "a=rtpmap:97 VP8/90000\r\n"
    )
    assert answered_video_codec(sdp) == "VP8"


class Sink:
    def __init__(self) -> None:
        self.keyframes: list[str] = []
        self.rembs: list[int] = []
        self.reports: list[RtcpReceiverInfo] = []

    def on_keyframe_request(self, kind: str) -> None:
        self.keyframes.append(kind)

    def on_remb(self, bitrate_bps: int) -> None:
        self.rembs.append(bitrate_bps)

    def on_receiver_report(self, report: RtcpReceiverInfo) -> None:
        self.reports.append(report)


async def test_feedback_sender_reports_pli_fir_remb_and_receiver_reports() -> None:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        sender = pc.addTransceiver("video", direction="sendonly").sender
        sink = Sink()
        adopted = FeedbackSender.adopt(sender, sink)
        assert adopted is sender and isinstance(sender, RTCRtpSender)
        ssrc = sender._ssrc
        other = ssrc ^ 1
        report = RtcpReceiverInfo(
            ssrc=ssrc, fraction_lost=26, packets_lost=3, highest_sequence=10, jitter=900, lsr=0, dlsr=0
        )
        packets: list[Any] = [
            RtcpPsfbPacket(fmt=RTCP_PSFB_PLI, ssrc=1, media_ssrc=ssrc),
            RtcpPsfbPacket(fmt=RTCP_PSFB_FIR, ssrc=1, media_ssrc=ssrc),
            RtcpPsfbPacket(fmt=RTCP_PSFB_APP, ssrc=1, media_ssrc=0, fci=pack_remb_fci(1_500_000, [ssrc])),
            RtcpPsfbPacket(fmt=RTCP_PSFB_APP, ssrc=1, media_ssrc=0, fci=pack_remb_fci(9_000_000, [other])),
            RtcpPsfbPacket(fmt=RTCP_PSFB_APP, ssrc=1, media_ssrc=0, fci=b"not remb"),
            RtcpRrPacket(ssrc=1, reports=[report]),
        ]
        for packet in packets:
            await sender._handle_rtcp_packet(packet)
        assert sink.keyframes == ["pli", "fir"]
        assert sink.rembs == [1_500_000]
        assert sink.reports == [report]
        stats = [s for s in (await sender.getStats()).values() if s.type == "remote-inbound-rtp"]
        assert stats and stats[0].jitter == 900  # aiortc's own handling still ran
        adopted.detach_feedback()
        await sender._handle_rtcp_packet(packets[0])
        assert sink.keyframes == ["pli", "fir"]
    finally:
        await pc.close()


async def test_adopt_refuses_a_foreign_sender_type() -> None:
    class Other(RTCRtpSender):
        pass

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        sender = pc.addTransceiver("video", direction="sendonly").sender
        sender.__class__ = Other
        with pytest.raises(TypeError):
            FeedbackSender.adopt(sender, Sink())
    finally:
        await pc.close()
        await asyncio.sleep(0)


def test_the_sender_keeps_a_second_of_packets_to_answer_nacks_from() -> None:
    # The seam (streamer.media.peer's docstring): aiortc's sender reads RTP_HISTORY_SIZE from its
    # module on every send and NACK; the receiver's copy stays as it was.
    import aiortc.rtcrtpreceiver
    import aiortc.rtcrtpsender
    import aiortc.rtp

    from streamer.media.peer import RETRANSMIT_HISTORY_PACKETS

    assert aiortc.rtcrtpsender.RTP_HISTORY_SIZE == RETRANSMIT_HISTORY_PACKETS
    assert aiortc.rtcrtpreceiver.RTP_HISTORY_SIZE == aiortc.rtp.RTP_HISTORY_SIZE == 128
    for method in (RTCRtpSender._retransmit, RTCRtpSender._run_rtp):
        assert "RTP_HISTORY_SIZE" in method.__code__.co_names, method


@pytest.mark.parametrize(("duplicate", "copies"), [(True, 2), (False, 1)])
async def test_a_nacked_packet_crosses_the_wire_twice_while_retransmissions_are_doubled(
    duplicate: bool, copies: int
) -> None:
    # Two aiortc peers on loopback: the viewer NACKs one packet it did get, over RTCP; the
    # node's FeedbackSender answers through its RetransmitLimiter, and the viewer counts the RTX
    # packets that arrive carrying that sequence number (RFC 4588: the original one leads the payload).
    node = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    viewer = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        viewer.addTransceiver("video", direction="recvonly")
        offer = await viewer.createOffer()
        advertise_host_addresses(viewer, ["127.0.0.1"])
        await viewer.setLocalDescription(offer)
        await node.setRemoteDescription(viewer.localDescription)
        sender = node.addTrack(VideoStreamTrack())
        limiter = RetransmitLimiter(2_000_000)
        limiter.duplicate = duplicate
        FeedbackSender.adopt(sender, Sink(), limiter)
        answer = await node.createAnswer()
        advertise_host_addresses(node, ["127.0.0.1"])
        await node.setLocalDescription(answer)
        await viewer.setRemoteDescription(node.localDescription)

        receiver = viewer.getTransceivers()[0].receiver
        handle = receiver._handle_rtp_packet
        media: list[int] = []  # sequence numbers of media packets the viewer got
        rtx: list[int] = []  # original sequence numbers carried by the RTX packets it got
        enough_media = asyncio.Event()
        nacked = -1
        all_arrived = asyncio.Event()

        async def spy(packet: Any, arrival_time_ms: int) -> None:
            if packet.ssrc == sender._ssrc:
                media.append(packet.sequence_number)
                if len(media) >= 5:
                    enough_media.set()
            elif packet.ssrc == sender._rtx_ssrc:
                rtx.append(int.from_bytes(packet.payload[:2], "big"))
                if rtx.count(nacked) >= copies:
                    all_arrived.set()
            await handle(packet, arrival_time_ms)

        receiver._handle_rtp_packet = spy  # type: ignore[method-assign]
        await asyncio.wait_for(enough_media.wait(), 10)
        nacked = media[-1]

        # what the node puts on the wire for that NACK, and when it has finished answering it
        transport = sender.transport
        send_rtp = transport._send_rtp
        sent: list[int] = []  # original sequence numbers of the RTX packets the node sent
        answered = asyncio.Event()

        async def count_sent(data: bytes) -> None:
            if not is_rtcp(data):  # the transport sends RTCP through here too
                packet = RtpPacket.parse(data)
                if packet.ssrc == sender._rtx_ssrc:
                    sent.append(int.from_bytes(packet.payload[:2], "big"))
            await send_rtp(data)

        retransmit = sender._retransmit

        async def retransmit_then_mark(sequence_number: int) -> None:
            await retransmit(sequence_number)
            if sequence_number == nacked:
                answered.set()

        transport._send_rtp = count_sent  # type: ignore[method-assign]
        sender._retransmit = retransmit_then_mark  # type: ignore[method-assign]
        await receiver._send_rtcp_nack(sender._ssrc, [nacked])
        await asyncio.wait_for(answered.wait(), 10)
        # (counted per sequence number: a packet lost on loopback under load would be NACKed too)
        assert sent.count(nacked) == copies
        await asyncio.wait_for(all_arrived.wait(), 10)
        assert rtx.count(nacked) == copies
        assert limiter.counters.duplicated == len(sent) - len(set(sent))
    finally:
        await viewer.close()
        await node.close()


def test_playout_delay_payload_is_12_bit_min_and_max_in_10_ms_units() -> None:
    assert PlayoutDelay().payload() == b"\x00\x00\x00"
    assert PlayoutDelay(100, 400).payload() == bytes((0x00, 0xA0, 0x28))  # 10 and 40 units
    assert PlayoutDelay(40_950, 40_950).payload() == b"\xff\xff\xff"
    assert PlayoutDelay.parse(bytes((0x00, 0xA0, 0x28))) == PlayoutDelay(100, 400)
    for lo, hi in ((10, 0), (-10, 0), (0, 40_960), (5, 10)):
        with pytest.raises(ValueError):
            PlayoutDelay(lo, hi)


def with_playout_delay(offer_sdp: str, ext_id: int) -> str:
    """An aiortc offer as Chromium's would read: the playout-delay extension offered on the video section."""
    lines = offer_sdp.split("\r\n")
    video = next(i for i, line in enumerate(lines) if line.startswith("m=video"))
    last_extmap = max(i for i, line in enumerate(lines) if line.startswith("a=extmap:") and i > video)
    lines.insert(last_extmap + 1, f"a=extmap:{ext_id} {PLAYOUT_DELAY_URI}")
    return "\r\n".join(lines)


def rtp_extensions(data: bytes) -> dict[int, bytes]:
    """The header extension elements of a serialized RTP packet, by id."""
    if not data[0] & 0x10:
        return {}
    pos = 12 + 4 * (data[0] & 0x0F)
    profile, words = int.from_bytes(data[pos : pos + 2], "big"), int.from_bytes(data[pos + 2 : pos + 4], "big")
    return dict(unpack_header_extensions(profile, data[pos + 4 : pos + 4 + 4 * words]))


@pytest.mark.parametrize("offered", [True, False])
async def test_the_answer_carries_playout_delay_on_every_packet_when_the_viewer_offers_it(offered: bool) -> None:
    # Two aiortc peers on loopback; the node's copy of the offer names the extension (id 5, as
    # Chromium numbers it).  The node answers it and every RTP packet it sends carries min = max = 0,
    # next to aiortc's own mid and abs-send-time; a viewer that did not offer it gets neither.
    node = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    viewer = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        viewer.addTransceiver("video", direction="recvonly")
        offer = await viewer.createOffer()
        advertise_host_addresses(viewer, ["127.0.0.1"])
        await viewer.setLocalDescription(offer)
        offer_sdp = with_playout_delay(viewer.localDescription.sdp, 5) if offered else viewer.localDescription.sdp
        transceiver = node.addTransceiver(VideoStreamTrack(), direction="sendonly")
        await node.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        assert enable_playout_delay(transceiver, offer_sdp, PlayoutDelay()) is offered
        answer = await node.createAnswer()
        advertise_host_addresses(node, ["127.0.0.1"])
        await node.setLocalDescription(answer)
        assert (f"a=extmap:5 {PLAYOUT_DELAY_URI}" in node.localDescription.sdp) is offered

        sender = transceiver.sender
        sent: list[dict[int, bytes]] = []
        enough = asyncio.Event()
        send_rtp = sender.transport._send_rtp

        async def spy(data: bytes) -> None:
            if not is_rtcp(data) and RtpPacket.parse(data).ssrc == sender._ssrc:
                sent.append(rtp_extensions(data))
                if len(sent) >= 10:
                    enough.set()
            await send_rtp(data)

        sender.transport._send_rtp = spy  # type: ignore[method-assign]
        await viewer.setRemoteDescription(node.localDescription)
        await asyncio.wait_for(enough.wait(), 20)
        mid_id = next(e.id for e in transceiver._headerExtensions if e.uri.endswith("sdes:mid"))
        assert all(e[mid_id] == transceiver.mid.encode() for e in sent)  # aiortc's own elements are kept
        if offered:
            assert all(e.get(5) == b"\x00\x00\x00" for e in sent), sent[:3]
        else:
            assert all(5 not in e for e in sent)
    finally:
        await viewer.close()
        await node.close()


async def test_only_an_offer_that_can_receive_opus_gets_the_sessions_sound() -> None:
    async def offer_with_audio(direction: str | None) -> str:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        try:
            pc.addTransceiver("video", direction="recvonly")
            if direction is not None:
                pc.addTransceiver("audio", direction=direction)
            await pc.setLocalDescription(await pc.createOffer())
            return str(pc.localDescription.sdp)
        finally:
            await pc.close()

    recvonly = await offer_with_audio("recvonly")
    assert offer_receives_opus(recvonly) and offer_receives_opus(await offer_with_audio("sendrecv"))
    assert not offer_receives_opus(await offer_with_audio("sendonly"))  # a microphone only: nothing to receive
    assert not offer_receives_opus(await offer_with_audio(None))  # video only: a native client, an older page
    no_opus = re.sub(r"(?m)^a=rtpmap:\d+ opus/48000/2\r?\n", "", recvonly).replace("opus", "PCMU")
    assert not offer_receives_opus(no_opus)
    assert not offer_receives_opus("this is not SDP")
    assert [c.name for c in opus_preferences()] == ["opus"]
    assert answered_audio_codec(recvonly) is None  # a recvonly section sends nothing
    assert answered_audio_codec(recvonly.replace("a=recvonly", "a=sendonly")) == "opus"


@pytest.mark.parametrize(("local", "remote", "kind"), [
    ("host", "host", "host"), ("host", "srflx", "srflx"), ("prflx", "host", "srflx"),
    ("relay", "host", "relay"), ("srflx", "relay", "relay"), ("relay", "relay", "relay"),
])
def test_the_path_kind_of_a_nominated_pair(local: str, remote: str, kind: str) -> None:
    assert path_kind(local, remote) == kind
