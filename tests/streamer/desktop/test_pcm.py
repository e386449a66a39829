"""PcmFramer: raw PCM chunks in, 20 ms frames with sample-counted pts out; silence on underrun, bounded backlog."""

from __future__ import annotations

import struct

import pytest

from streamer.desktop.pcm import CHANNELS, FRAME_BYTES, FRAME_SAMPLES, SAMPLE_BYTES, PcmFramer


def samples(start: int, count: int) -> bytes:
    """``count`` stereo samples whose left channel counts up from ``start`` (right = -left)."""
    return b"".join(struct.pack("<hh", (start + i) % 30000, -((start + i) % 30000)) for i in range(count))


def first_left(pcm: bytes) -> int:
    return int(struct.unpack_from("<h", pcm)[0])


def test_frame_constants_are_20_ms_of_s16_stereo_48k() -> None:
    assert FRAME_SAMPLES == 960 and FRAME_BYTES == 960 * CHANNELS * SAMPLE_BYTES == 3840


def test_chunks_of_any_size_become_whole_frames_in_order_with_pts_in_samples() -> None:
    framer = PcmFramer()
    data = samples(0, FRAME_SAMPLES * 3)
    for i in range(0, len(data), 1001):  # odd sizes: chunks end inside samples and frames
        framer.push(data[i : i + 1001])
    frames = [framer.pop() for _ in range(3)]
    assert [f.pts for f in frames] == [0, 960, 1920]
    assert [f.silent for f in frames] == [False, False, False]
    assert b"".join(f.pcm for f in frames) == data
    assert framer.buffered_samples == 0 and framer.underruns == 0


def test_an_underrun_gives_silence_and_keeps_a_partial_frame_for_later() -> None:
    framer = PcmFramer()
    framer.push(samples(100, 500))
    gap = framer.pop()
    assert gap.silent and gap.pcm == bytes(FRAME_BYTES) and gap.pts == 0
    assert framer.underruns == 1 and framer.buffered_samples == 500
    framer.push(samples(600, 460))
    full = framer.pop()
    assert not full.silent and full.pts == 960 and full.pcm == samples(100, 960)


def test_the_backlog_is_bounded_by_dropping_the_oldest_whole_frames() -> None:
    framer = PcmFramer(max_samples=FRAME_SAMPLES * 2)
    framer.push(samples(0, FRAME_SAMPLES * 3 + 10))
    assert framer.buffered_samples <= FRAME_SAMPLES * 2
    assert framer.dropped_samples == FRAME_SAMPLES * 2  # rounded up to whole frames
    assert first_left(framer.pop().pcm) == FRAME_SAMPLES * 2  # the newest sound survives, aligned
    with pytest.raises(ValueError):
        PcmFramer(max_samples=FRAME_SAMPLES - 1)


def test_discard_drops_whole_samples_and_keeps_alignment_and_pts() -> None:
    framer = PcmFramer()
    framer.pop()
    framer.push(samples(0, 700) + b"\x01")  # a sample's first byte arrived
    framer.discard()
    assert framer.buffered_samples == 0
    framer.push(b"\x00\x00\x00" + samples(5, FRAME_SAMPLES))  # the rest of that sample, then more
    frame = framer.pop()
    assert frame.pts == 960 and not frame.silent and frame.pcm[4:] == samples(5, FRAME_SAMPLES - 1)
