"""The Chromium viewer of the adaptive-bitrate benchmark (``bench/abr_chromium.py``).

Pure parts first (frame pairing by RTP time, goodput bins, the offer's host candidate), then a
smoke run: one 8 Mbps phase in a ``tests.netem.lab.Lab``, the ``ours`` sender, headless Chromium
as the viewer, driven by ``bench/bench_abr.py``'s own ``run_one``.  It asserts that the result
has the aiortc viewer's keys and sane figures: frame delays of tens of ms, goodput matching
the bytes the router forwarded (less headers), pings answered.  Skips with the reason where
there is no Lab (not root...), no /usr/bin/chromium or no Playwright.
"""

from __future__ import annotations

import statistics

import pytest

from bench.abr_chromium import check_offer, goodput_bins, host_candidates, pair_frames
from bench.common import chromium_unavailable
from tests.netem.lab import Link, unavailable_reason
from tests.streamer.benchload import load_bench_abr

AIORTC_KEYS = {"frames", "unreadable_stamps", "bins", "bin_s", "pings", "pings_unanswered"}
RATE_BPS = 8_000_000


def test_pair_frames_gives_a_mismatched_sample_its_own_frame() -> None:
    origin = 123_456  # the sender's random RTP origin
    # render times 1000, 1033, 1067 ms (frames 10, 11, 12); the second callback drew frame 12
    samples = [
        [1080.0, origin + 1000 * 90, 1000, 10, 960, 540, 0.0],
        [1113.0, origin + 1033 * 90, 1067, 12, 960, 540, 0.0],
        [1147.0, origin + 1067 * 90, 1067, 12, 960, 540, 0.0],
    ]
    frames, corrected = pair_frames(samples)
    assert corrected == 1
    assert frames == [[1.08, 80.0, 10, 960, 540], [1.113, 80.0, 11, 960, 540], [1.147, 80.0, 12, 960, 540]]


def test_pair_frames_handles_rtp_wrap_and_missing_rtp() -> None:
    origin = (1 << 32) - 45_000  # wraps within the samples
    samples: list[list[float | None]] = [
        [2000.0 + 33 * i, (origin + (1000 + 33 * i) * 90) % (1 << 32), 1000 + 33 * i, i, 640, 360] for i in range(5)
    ]
    samples.append([2200.0, None, 1170, 5, 640, 360])
    frames, corrected = pair_frames(samples)
    assert corrected == 0
    assert [f[1] for f in frames] == [1000.0] * 5 + [1030.0]


def test_goodput_bins_put_each_poll_increase_in_its_bin_retransmissions_counted_once() -> None:
    # retransmittedBytesReceived is a part of bytesReceived: not added again
    polls: list[list[float | None]] = [
        [10.00, 0, None], [10.05, 1000, None], [10.15, 3000, 100], [10.25, 3000, 100], [10.31, 4000, 300]
    ]  # fmt: skip
    assert goodput_bins(polls, 0.1) == [[100, 1000], [101, 2000], [103, 1000]]


def test_check_offer_wants_the_namespace_address_as_a_host_candidate() -> None:
    sdp = ("v=0\r\na=candidate:1 1 udp 2113937151 10.231.2.2 40000 typ host generation 0\r\n"
           "a=candidate:2 1 udp 2113939711 4a3c9b8e.local 40001 typ host generation 0\r\n")  # fmt: skip
    assert host_candidates(sdp) == ["10.231.2.2", "4a3c9b8e.local"]
    check_offer(sdp, "10.231.2.2")
    check_offer(sdp, "127.0.0.1")  # loopback (no Lab): Chromium offers the machine's own addresses
    with pytest.raises(RuntimeError, match=r"no host candidate 10\.231\.2\.9 "):
        check_offer(sdp, "10.231.2.9")


@pytest.mark.timeout(90)
def test_chromium_viewer_measures_frames_goodput_and_pings_in_a_lab() -> None:
    if (reason := unavailable_reason()) is not None:
        pytest.skip(f"network lab: {reason}")
    if (reason := chromium_unavailable()) is not None:
        pytest.skip(reason)
    bench = load_bench_abr()
    phase = bench.Phase(8.0, Link(rate_bps=RATE_BPS, delay_ms=10.0), Link(delay_ms=10.0))
    run = bench.run_one(bench.Scenario("smoke", "8 Mbps", (phase,)), "ours", use_lab=True, viewer="chromium")
    assert run.shaped
    viewer = run.viewer
    assert viewer["viewer"] == "chromium" and AIORTC_KEYS <= set(viewer)
    start, end = run.phases[0]["start"], run.phases[0]["end"]

    # Frames: about 30 fps, readable stamps, frame numbers in order, delays of tens of ms.
    frames = [f for f in viewer["frames"] if start <= f[0] <= end]
    assert len(frames) >= 120, f"only {len(frames)} frames shown in 8 s"
    assert viewer["unreadable_stamps"] <= len(frames) // 20
    assert [f[2] for f in frames] == sorted(f[2] for f in frames)
    assert all(f[3:] == [960, 540] for f in frames)
    delay_p50 = statistics.median(f[1] for f in frames)
    assert 10.0 < delay_p50 < 300.0, delay_p50

    # Goodput: RTP payload is the IP bytes the router forwarded less headers (a few %).
    bins = dict(viewer["bins"])
    first, last = run.link[0], run.link[-1]
    payload = sum(v for k, v in bins.items() if first[0] <= k * viewer["bin_s"] < last[0])
    ratio = payload / (last[1] - first[1])
    assert 0.85 < ratio < 1.0, ratio

    # Input pings: answered, well under a second.
    pings = [p for p in viewer["pings"] if start <= p[0] <= end]
    unanswered = [t for t in viewer["pings_unanswered"] if start <= t <= end - 2.0]
    assert len(pings) >= 100 and not unanswered
    assert statistics.median(p[1] for p in pings) < 200.0
