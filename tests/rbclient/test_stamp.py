"""The SDK's stamp reader against the node's writer: game frames through a real H.264 and VP8 round trip."""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np
import pytest

from rbclient.stamp import parse_word, read_frame, read_luma
from streamer.desktop.game import Game, stamp_word


@pytest.mark.parametrize("codec", ["libx264", "libvpx"])
@pytest.mark.parametrize("size", [(640, 360), (1280, 720), (326, 200)])
def test_reads_the_game_stamp_after_encode_and_decode(codec: str, size: tuple[int, int]) -> None:
    width, height = size
    game = Game(width, height)
    enc = av.CodecContext.create(codec, "w")
    enc.width, enc.height, enc.pix_fmt = width, height, "yuv420p"
    enc.time_base = Fraction(1, 30)
    enc.bit_rate = 1_500_000
    dec = av.CodecContext.create("h264" if codec == "libx264" else "vp8", "r")
    wanted, got = [], []
    for i in range(12):
        ts_ms = 1_796_387_132_614 + i * 33
        bgra = game.render(ts_ms)
        wanted.append((game.frame_no - 1, ts_ms))
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(bgra[..., :3]), format="bgr24").reformat(
            format="yuv420p")
        frame.pts = i
        for packet in enc.encode(frame):
            for decoded in dec.decode(packet):
                stamp = read_frame(decoded)
                assert stamp is not None
                got.append((stamp.frame_no, stamp.ts_ms))
    for packet in [*enc.encode(None), None]:  # flush the encoder, then the decoder
        for decoded in dec.decode(packet):
            stamp = read_frame(decoded)
            assert stamp is not None
            got.append((stamp.frame_no, stamp.ts_ms))
    assert got == wanted


def test_damaged_or_missing_stamps_read_as_none() -> None:
    word = stamp_word(77, 1_796_387_132_614)
    assert parse_word(word) is not None
    assert parse_word(word ^ (1 << 40)) is None  # one flipped bit in the time: the CRC catches it
    assert parse_word(word ^ (1 << 119)) is None  # sync
    assert parse_word(word ^ 1) is None  # tail
    assert read_luma(np.full((360, 640), 128, np.uint8)) is None
    assert read_luma(np.zeros((4, 640), np.uint8)) is None  # shorter than the strip
    assert read_luma(np.zeros((360, 20), np.uint8)) is None  # narrower than the cells


def test_reads_frames_in_other_pixel_formats() -> None:
    game = Game(640, 360)
    bgra = game.render(1_796_387_132_614)
    frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(bgra[..., :3]), format="bgr24")
    stamp = read_frame(frame)  # converted to yuv420p first
    assert stamp is not None and (stamp.frame_no, stamp.ts_ms) == (0, 1_796_387_132_614)
