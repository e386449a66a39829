"""The send pacer's schedule (pure) and abs-send-time re-stamping."""

from __future__ import annotations

import random

import pytest
from aiortc.rtcrtpparameters import RTCRtpHeaderExtensionParameters, RTCRtpParameters
from aiortc.rtp import HeaderExtensionsMap, RtpPacket

from streamer.media.pacer import (
    BURST_MS,
    CATCHUP_MS,
    MIN_PACING_BPS,
    PacingQueue,
    abs_send_time,
    restamp_abs_send_time,
)

PACKET = 1_200


def drain(q: PacingQueue[int], start_ms: float, step_ms: float = 1.0, until_ms: float = 5_000.0) -> dict[int, float]:
    """Pop every ``step_ms`` from ``start_ms``: when each item left."""
    left: dict[int, float] = {}
    t = start_ms
    while len(q) and t < until_ms:
        for item in q.pop_due(t):
            left[item] = t
        t += step_ms
    return left


def test_a_frame_leaves_spread_over_its_size_at_twice_the_target() -> None:
    # 2 Mbps target -> 4 Mbps pacing: a 20-packet frame (192 kbit) takes 48 ms, not one burst
    q: PacingQueue[int] = PacingQueue(2_000_000, max_delay_ms=1_000)
    assert q.pacing_bps == 4_000_000
    for i in range(20):
        q.push(i, PACKET, 1_000.0)
    left = drain(q, 1_000.0)
    assert list(left) == list(range(20))  # in push order
    at_once = [i for i, t in left.items() if t == 1_000.0]
    assert 1 <= len(at_once) <= 1 + BURST_MS * 4_000 / (PACKET * 8)  # the idle budget, no more
    span = left[19] - left[0]
    assert 48 - 2 * BURST_MS - 1 <= span <= 48 + 1
    # evenly: no 10 ms window carries more than 10 ms at the pacing rate plus one packet and the burst
    for t0 in range(1_000, 1_050):
        in_window = sum(1 for t in left.values() if t0 <= t < t0 + 10)
        assert in_window * PACKET * 8 <= 4_000_000 * (10 + BURST_MS) / 1000 + PACKET * 8


def test_a_queue_over_one_frame_interval_drains_faster_instead_of_waiting() -> None:
    q: PacingQueue[int] = PacingQueue(2_000_000, max_delay_ms=1000 / 30)
    for i in range(40):  # a keyframe: 384 kbit, 96 ms at the pacing rate
        q.push(i, PACKET, 0.0)
    assert q.queue_ms() == pytest.approx(96)
    assert q.rate_bps() > q.pacing_bps
    left = drain(q, 0.0)
    assert max(left.values()) <= 1000 / 30 + 2  # within about one frame interval
    assert q.counters.drained_fast > 0
    assert q.counters.max_wait_ms == max(left.values())
    # once drained, the base rate again
    assert q.rate_bps() == q.pacing_bps


def test_retransmissions_leave_before_waiting_media() -> None:
    q: PacingQueue[str] = PacingQueue(1_000_000, max_delay_ms=1_000)
    for i in range(10):
        q.push(f"m{i}", PACKET, 0.0)
    first = q.pop_due(0.0)
    q.push("rtx", PACKET, 1.0, priority=True)
    order = first + [item for t in range(1, 500) for item in q.pop_due(float(t))]
    assert order.index("rtx") == len(first)  # the next to leave
    assert [o for o in order if o != "rtx"] == [f"m{i}" for i in range(10)]
    assert q.counters.priority_packets == 1


def test_next_due_says_when_the_budget_allows_the_next_packet() -> None:
    q: PacingQueue[int] = PacingQueue(1_000_000, max_delay_ms=1_000)  # 2 Mbps: a packet is 4.8 ms
    assert q.next_due_ms(0.0) is None
    for i in range(5):
        q.push(i, PACKET, 0.0)
    assert q.next_due_ms(0.0) == 0.0
    sent = q.pop_due(0.0)
    due = q.next_due_ms(0.0)
    assert due is not None and due > 0.0
    assert q.pop_due(due - 0.5) == []
    assert q.pop_due(due + 1e-6) == [len(sent)]


def test_a_late_event_loop_catches_up_at_most_catchup_ms() -> None:
    q: PacingQueue[int] = PacingQueue(2_000_000, max_delay_ms=10_000)  # 4 Mbps
    for i in range(100):
        q.push(i, PACKET, 0.0)
    q.pop_due(0.0)
    released = q.pop_due(200.0)  # the loop slept 200 ms
    assert len(released) * PACKET * 8 <= 4_000_000 * CATCHUP_MS / 1000 + PACKET * 8


def test_an_idle_pacer_keeps_only_the_burst_budget() -> None:
    q: PacingQueue[int] = PacingQueue(8_000_000, max_delay_ms=10_000)  # 16 Mbps pacing
    q.pop_due(0.0)
    for i in range(50):
        q.push(i, PACKET, 10_000.0)  # after 10 s idle
    released = q.pop_due(10_000.0)
    assert len(released) * PACKET * 8 <= 16_000_000 * BURST_MS / 1000 + PACKET * 8


def test_what_leaves_never_exceeds_the_accrued_budget() -> None:
    rng = random.Random(7)
    q: PacingQueue[int] = PacingQueue(3_000_000, max_delay_ms=1000 / 30)
    log: list[tuple[float, int, float]] = []  # (time, bytes, rate in force)
    sizes: dict[int, int] = {}
    t, n = 0.0, 0
    while t < 3_000:
        if rng.random() < 0.05:  # a frame now and then, 1-40 packets
            for _ in range(rng.randint(1, 40)):
                sizes[n] = rng.randint(200, PACKET)
                q.push(n, sizes[n], t)
                n += 1
        rate = q.rate_bps()
        log.extend((t, sizes[i], rate) for i in q.pop_due(t))
        t += rng.uniform(0.2, 6.0)
    assert len(log) > 100
    for start in range(0, len(log), 7):
        t0 = log[start][0]
        window = [(tt, size, rate) for tt, size, rate in log if t0 <= tt < t0 + 50]
        sent_bits = sum(size for _, size, _ in window) * 8
        top_rate = max(rate for _, _, rate in window)
        assert sent_bits <= top_rate * (50 + CATCHUP_MS) / 1000 + PACKET * 8


def test_the_pacing_rate_has_a_floor() -> None:
    assert PacingQueue(10_000).pacing_bps == MIN_PACING_BPS
    with pytest.raises(ValueError):
        PacingQueue(1_000_000, factor=0)
    with pytest.raises(ValueError):
        PacingQueue(1_000_000, burst_ms=20, catchup_ms=10)


def serialized(ext_id: int | None, mid_id: int = 1) -> bytes:
    extensions = [RTCRtpHeaderExtensionParameters(id=mid_id, uri="urn:ietf:params:rtp-hdrext:sdes:mid")]
    if ext_id is not None:
        extensions.append(
            RTCRtpHeaderExtensionParameters(id=ext_id, uri="http://www.webrtc.org/experiments/rtp-hdrext/abs-send-time")
        )
    ext_map = HeaderExtensionsMap()
    ext_map.configure(RTCRtpParameters(headerExtensions=extensions))
    packet = RtpPacket(payload_type=96, sequence_number=7, timestamp=1234)
    packet.ssrc = 42
    packet.payload = b"x" * 100
    packet.extensions.mid = "0"
    packet.extensions.abs_send_time = 0x123456
    return packet.serialize(ext_map), ext_map  # type: ignore[return-value]


def test_restamp_rewrites_only_the_abs_send_time_element() -> None:
    data, ext_map = serialized(3)
    out = restamp_abs_send_time(data, 3, 0xABCDEF)
    assert len(out) == len(data)
    parsed = RtpPacket.parse(out, ext_map)
    assert parsed.extensions.abs_send_time == 0xABCDEF
    assert parsed.extensions.mid == "0"
    assert parsed.payload == b"x" * 100 and parsed.sequence_number == 7
    # no such element, another id, or not RTP: unchanged
    plain, _ = serialized(None)
    assert restamp_abs_send_time(plain, 3, 1) == plain
    assert restamp_abs_send_time(data, 9, 1) == data
    assert restamp_abs_send_time(b"\x90\x00", 3, 1) == b"\x90\x00"


def test_abs_send_time_is_6_18_seconds() -> None:
    one_and_a_half_s = (1 << 32) + (1 << 31)  # NTP 32.32
    assert abs_send_time(one_and_a_half_s) == (1 << 18) + (1 << 17)
    assert abs_send_time(64 << 32) == 0  # wraps at 64 s
