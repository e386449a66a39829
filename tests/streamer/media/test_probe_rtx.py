"""Delay probes, retransmissions (limiter, their share of the bits) and report loss: pure, no clock."""

from __future__ import annotations

import pytest
from aiortc.rtp import RtcpReceiverInfo

from streamer.desktop.inputs import ProbeAck
from streamer.media.probe import (
    LOOP_SLACK_MS,
    PROBE_FORGET_MS,
    STALL_MIN_PACKETS,
    LoopLateness,
    ProbeSample,
    ProbeTracker,
    RecvWindow,
    SendLog,
)
from streamer.media.rtx import (
    MIN_RETRANSMIT_INTERVAL_MS,
    RTX_BUDGET_PERCENT,
    RTX_BURST_MS,
    RTX_PACKET_BITS,
    RetransmitLimiter,
)
from streamer.media.session import LossWindow, matched_send_bps, media_bps

# --- ProbeTracker ------------------------------------------------------------------------


def test_probes_are_numbered_and_the_period_reports_the_lowest_round_trip() -> None:
    tracker = ProbeTracker()
    sent = [tracker.probe(float(t)) for t in (0, 50, 100, 150)]
    assert sent == [{"t": "probe", "id": i} for i in (1, 2, 3, 4)]
    # answers: 1 after 80 ms, 2 after 40 ms, 4 after 60 ms; 3 is lost (unreliable channel)
    assert tracker.answer(ProbeAck(1, 100, 1_000.0), 80.0)
    assert tracker.answer(ProbeAck(2, 110, 1_050.0), 90.0)
    assert tracker.answer(ProbeAck(4, 130, 1_150.0), 210.0)
    sample = tracker.take(210.0)
    assert sample.rtt_ms == 40.0 and sample.answered == 3
    assert tracker.take(400.0).rtt_ms is None  # a new period: nothing answered in it


def test_the_round_trip_runs_from_when_the_probe_left_and_leaves_the_loops_lateness_out() -> None:
    # probe 1 made at 0 but queued until 30 (a busy loop); its answer handled at 95 by a loop 40 ms late:
    # the path's round trip is 95 - 40 - 30 = 25 ms.  Probe 2 left when made (no ``sent``): 20 ms.
    tracker = ProbeTracker()
    tracker.probe(0.0)
    tracker.sent(1, 30.0)
    tracker.sent(99, 31.0)  # not a probe of ours: ignored
    tracker.probe(50.0)
    assert tracker.answer(ProbeAck(1, 10, 1_000.0), 95.0, late_ms=40.0)
    assert tracker.answer(ProbeAck(2, 20, 1_050.0), 70.0)
    assert tracker.take(100.0).rtt_ms == 20.0
    tracker.probe(200.0)  # a lateness larger than the round trip is never a negative one
    assert tracker.answer(ProbeAck(3, 30, 1_200.0), 205.0, late_ms=50.0)
    assert tracker.take(210.0).rtt_ms == 0.0


def test_loop_lateness_is_the_latest_ticks_delay_beyond_the_timers_slack() -> None:
    lateness = LoopLateness()
    assert lateness.late_ms(0.0) == 0.0
    lateness.tick(10.0, 11.0)  # within the slack
    lateness.tick(20.0, 62.0 + LOOP_SLACK_MS)  # 42 ms late beyond it
    lateness.tick(70.0, 70.5)
    assert lateness.late_ms(70.5) == 42.0 + 0.0  # the 62 ms tick is within the 20 ms window
    assert lateness.late_ms(90.0) == 0.0  # it left the window: only the 70.5 one is in it


def test_send_log_interpolates_packets_sent_between_two_times() -> None:
    log = SendLog(keep_ms=1_000.0)
    for t, n in ((0.0, 0), (100.0, 50), (200.0, 50), (300.0, 150)):
        log.add(t, n)
    assert log.at(50.0) == 25.0 and log.at(250.0) == 100.0 and log.between(50.0, 250.0) == 75.0
    assert log.between(-1.0, 100.0) is None and log.between(0.0, 301.0) is None  # not covered
    log.add(250.0, 200)  # time going back is ignored
    log.add(400.0, 10)  # a count going back: a new stream, the log starts over
    assert log.at(300.0) is None and log.at(400.0) == 10.0


def test_matched_send_rate_is_what_left_one_round_trip_before_the_windows_answers() -> None:
    # the viewer counted its window's packets over answers that arrived at 1_000 and 1_300 (node ms);
    # round trip 40 ms + half a probe interval: the packets left over [947.5, 1_247.5]
    log = SendLog()
    for t in range(0, 1_400, 100):
        log.add(float(t), t // 10)  # 10 packets every 100 ms
    window = RecvWindow(packets=28, span_ms=290.0, first_arrived_ms=1_000.0, last_arrived_ms=1_300.0)
    # 30 packets over 300 ms of the node's clock, 1_000 bytes each: 800 kbps
    assert matched_send_bps(window, log, 1_000.0, 40.0) == 800_000
    assert matched_send_bps(window, log, 1_000.0, None) is None  # no round trip known yet
    assert matched_send_bps(None, log, 1_000.0, 40.0) is None


def test_unknown_repeated_and_forgotten_answers_do_not_count() -> None:
    tracker = ProbeTracker()
    tracker.probe(0.0)
    assert not tracker.answer(ProbeAck(99, 1, 1.0), 10.0)  # never sent
    assert tracker.answer(ProbeAck(1, 1, 1.0), 10.0)
    assert not tracker.answer(ProbeAck(1, 1, 2.0), 20.0)  # already answered
    tracker.probe(100.0)  # id 2
    tracker.probe(100.0 + PROBE_FORGET_MS + 1)  # forgets id 2
    assert not tracker.answer(ProbeAck(2, 5, 3.0), 100.0 + PROBE_FORGET_MS + 2)
    assert tracker.take(5_000.0).answered == 1


def test_receive_rate_over_the_newest_300_ms_of_the_viewers_clock() -> None:
    tracker = ProbeTracker()
    # the viewer's clock starts at 10 s; 100 packets every 100 ms, then 20 every 100 ms
    counts = [0, 100, 200, 300, 320, 340, 360]
    for i, count in enumerate(counts):
        tracker.probe(float(100 * i))
        tracker.answer(ProbeAck(i + 1, count, 10_000.0 + 100 * i), float(100 * i + 5))
    sample = tracker.take(605.0)
    # window: viewer ms 10_300..10_600 (newest 300 ms): 60 packets in 300 ms
    assert sample.recv_pps == pytest.approx(200.0)
    # stale: no answer for over 300 ms -> no rate (the viewer may have stopped answering)
    assert tracker.take(1_000.0).recv_pps is None


def test_receive_rate_needs_150_ms_and_restarts_when_the_count_goes_back() -> None:
    tracker = ProbeTracker()
    for i, (count, rx_ms) in enumerate([(500, 0.0), (520, 100.0)]):
        tracker.probe(float(i))
        tracker.answer(ProbeAck(i + 1, count, rx_ms), float(i))
    assert tracker.take(2.0).recv_pps is None  # only 100 ms of the viewer's clock
    tracker.probe(3.0)
    tracker.answer(ProbeAck(3, 10, 200.0), 3.0)  # a new stream: the count starts over
    tracker.probe(4.0)
    tracker.answer(ProbeAck(4, 40, 400.0), 4.0)
    # 30 packets in 200 ms; no mix with 520
    assert tracker.take(5.0) == ProbeSample(0.0, 2, 150.0, window=RecvWindow(30, 200.0, 3.0, 4.0))


def answer(tracker: ProbeTracker, rx: int, rx_ms: float, fd: int | None, now_ms: float) -> None:
    probe_id = tracker.probe(now_ms)["id"]
    assert tracker.answer(ProbeAck(probe_id, rx, rx_ms, fd), now_ms)


def test_a_frame_count_that_stops_while_packets_arrive_is_a_stall() -> None:
    tracker = ProbeTracker()
    answer(tracker, 100, 1_000.0, 30, 0.0)
    answer(tracker, 110, 1_100.0, 33, 100.0)  # decoding: no stall
    assert tracker.take(100.0).stalled_ms is None
    answer(tracker, 120, 1_200.0, 33, 200.0)  # frames stop at 33 (seen at 1_100 ms, 110 packets)
    answer(tracker, 110 + STALL_MIN_PACKETS - 1, 1_300.0, 33, 300.0)
    assert tracker.take(300.0).stalled_ms is None  # too few packets since: maybe one big frame
    answer(tracker, 110 + STALL_MIN_PACKETS, 1_700.0, 33, 400.0)
    assert tracker.take(400.0).stalled_ms == 600.0
    assert tracker.take(800.0).stalled_ms is None  # no answer for 400 ms: nothing fresh to say
    answer(tracker, 200, 1_900.0, 34, 900.0)  # a frame decoded again
    assert tracker.take(900.0).stalled_ms is None


def test_no_packets_or_no_frame_counts_is_no_stall() -> None:
    idle = ProbeTracker()  # the stream paused: neither count moves
    answer(idle, 100, 0.0, 30, 0.0)
    answer(idle, 100, 2_000.0, 30, 100.0)
    assert idle.take(100.0).stalled_ms is None
    blind = ProbeTracker()  # a viewer that does not report frames
    answer(blind, 100, 0.0, None, 0.0)
    answer(blind, 500, 2_000.0, None, 100.0)
    assert blind.take(100.0).stalled_ms is None


# --- RetransmitLimiter -------------------------------------------------------------------


def test_each_packet_is_retransmitted_once_per_round_trip() -> None:
    limiter = RetransmitLimiter(target_bps=10_000_000, rtt_ms=40.0)
    assert limiter.allow(7, 0.0)
    assert not limiter.allow(7, 49.0)  # a NACK repeated within 1.25 x RTT: ours is on its way
    assert limiter.allow(8, 49.0)
    assert limiter.allow(7, 50.0)
    limiter.rtt_ms = 1.0  # a tiny RTT still waits the minimum interval
    assert not limiter.allow(8, 49.0 + MIN_RETRANSMIT_INTERVAL_MS - 1)
    assert limiter.allow(8, 49.0 + MIN_RETRANSMIT_INTERVAL_MS)
    assert (limiter.counters.sent, limiter.counters.repeated, limiter.counters.over_budget) == (4, 2, 0)


def test_retransmissions_stay_within_the_budget_and_refill_with_time() -> None:
    target = 4_800_000
    per_s = target * RTX_BUDGET_PERCENT / 100 / RTX_PACKET_BITS
    assert per_s == 125  # 25 % of 4.8 Mbps in full-size packets; the bucket holds 200 ms = 25
    limiter = RetransmitLimiter(target_bps=target, rtt_ms=10.0)
    allowed = [limiter.allow(seq, 0.0) for seq in range(100)]
    burst = int(per_s * RTX_BURST_MS / 1000)
    assert burst == 25 and allowed.count(True) == burst
    assert limiter.counters.over_budget == 100 - burst
    # 80 ms later: 10 packets' worth more
    assert [limiter.allow(seq, 80.0) for seq in range(100, 120)].count(True) == 10
    # a lower target lowers the refill rate and the bucket at once: 12.5 packets/s, 2.5 held
    limiter.target_bps = 480_000
    assert [limiter.allow(seq, 160.0) for seq in range(200, 220)].count(True) == 1
    assert [limiter.allow(seq, 2_000.0) for seq in range(300, 320)].count(True) == 2


def test_while_the_loss_is_random_each_retransmission_goes_out_twice_within_the_budget() -> None:
    limiter = RetransmitLimiter(target_bps=4_800_000, rtt_ms=10.0)  # 125 packets/s, 25 in the bucket
    assert limiter.copies(1, 0.0) == 1  # not duplicating: one copy
    limiter.duplicate = True
    assert limiter.copies(2, 0.0) == 2
    assert limiter.copies(2, 1.0) == 0  # the same packet within the round trip: none
    # both copies are paid for: 1 + 2 spent, 22 left -> 11 more doubled packets
    assert [limiter.copies(seq, 0.0) for seq in range(10, 22)] == [2] * 11 + [0]
    assert limiter.copies(30, 8.0) == 1  # 8 ms refills one packet: a single copy
    counters = limiter.counters
    assert (counters.sent, counters.duplicated, counters.over_budget, counters.repeated) == (26, 12, 1, 1)


def test_retransmissions_are_paid_for_out_of_the_encoders_bits_up_to_half() -> None:
    assert media_bps(4_000_000, 0) == 4_000_000
    assert media_bps(4_000_000, 1_000_000) == 3_000_000
    assert media_bps(4_000_000, 3_000_000) == 2_000_000  # never under half


def report(highest: int, lost: int, fraction: int = 128) -> RtcpReceiverInfo:
    return RtcpReceiverInfo(ssrc=1, fraction_lost=fraction, packets_lost=lost, highest_sequence=highest,
                            jitter=0, lsr=0, dlsr=0)  # fmt: skip


def test_receiver_report_loss_is_taken_over_at_least_50_packets_not_each_reports_own_span() -> None:
    window = LossWindow()
    assert window.fraction_lost(None) is None
    assert window.fraction_lost(report(1_000, 10)) is None  # the reference
    # Chromium's report with a NACK: 2 packets since its previous one, 1 lost ("50 %")
    assert window.fraction_lost(report(1_002, 11)) is None  # under 50 packets: no loss sample yet
    assert window.fraction_lost(report(1_100, 12)) == 2 * 256 // 100  # 2 lost in 100: 2 %
    assert window.fraction_lost(report(1_150, 12)) == 0
    assert window.fraction_lost(report(1_200, 100)) == 255  # capped under 256
    assert window.fraction_lost(report(10, 0)) is None  # the sequence went back: a new reference
    assert window.fraction_lost(report(70, 6)) == 6 * 256 // 60


def test_the_viewers_freezes_and_first_decoded_frame_come_from_its_frame_count() -> None:
    tracker = ProbeTracker()
    answer(tracker, 0, 1_000.0, 0, 10.0)
    answer(tracker, 10, 1_400.0, 0, 20.0)  # 400 ms before the first frame: a wait, not a freeze
    assert (tracker.freezes, tracker.first_decoded_ms) == (0, None)
    answer(tracker, 20, 1_450.0, 1, 70.0)  # first decoded frame (node clock 70 ms)
    answer(tracker, 30, 1_550.0, 4, 170.0)
    assert (tracker.freezes, tracker.first_decoded_ms) == (0, 70.0)
    answer(tracker, 40, 1_650.0, 4, 270.0)
    answer(tracker, 50, 1_749.0, 4, 370.0)  # standing still 199 ms: not yet
    assert tracker.freezes == 0
    answer(tracker, 60, 1_750.0, 4, 380.0)  # 200 ms: a freeze, counted while it lasts
    answer(tracker, 70, 2_050.0, 4, 680.0)
    assert tracker.freezes == 1
    answer(tracker, 80, 2_100.0, 9, 730.0)  # it ends: the same freeze
    assert tracker.freezes == 1
    tracker.freeze_threshold_ms = 600.0  # the ladder went to 5 fps: three intervals
    answer(tracker, 90, 2_600.0, 9, 800.0)
    answer(tracker, 100, 2_650.0, 10, 850.0)
    assert tracker.freezes == 1


def test_a_viewer_without_frame_counts_shows_no_freezes() -> None:
    blind = ProbeTracker()
    answer(blind, 100, 0.0, None, 0.0)
    answer(blind, 500, 2_000.0, None, 100.0)
    assert (blind.freezes, blind.first_decoded_ms) == (0, None)
