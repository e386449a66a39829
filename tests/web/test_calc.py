"""Pure JavaScript of the web UI run in Node: web/calc.js (letterboxing, pointer mapping, wheel, sizes, ETA)
and the chart thinning in web/charts.js."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from broker.models import MAX_HEIGHT_PX, MAX_WIDTH_PX, PROFILE_SCHEMA
from broker.protocol import WHEEL_MAX_NOTCHES

WEB = Path(__file__).resolve().parents[2] / "web"
CALC = WEB / "calc.js"


def run(expressions: dict[str, str], module: Path = CALC) -> dict[str, Any]:
    """Evaluate each JavaScript expression with the module's exports in scope as ``c``; JSON results by name."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (needed to run web/calc.js outside a browser)")
    body = ",\n".join(f"{json.dumps(k)}: ({v})" for k, v in expressions.items())
    script = f"import * as c from {json.dumps(module.as_uri())};\nconst out = {{\n{body}\n}};\n" \
             "process.stdout.write(JSON.stringify(out));\n"
    proc = subprocess.run([node, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=20,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def test_letterbox_and_pointer_mapping() -> None:
    r = run({
        # a 16:9 picture in a taller box: bars above and below
        "tall": "c.contentRect({left: 0, top: 0, width: 1280, height: 900}, 1280, 720)",
        # a 16:9 picture in a wider box: bars left and right, picture scaled down
        "wide": "c.contentRect({left: 10, top: 20, width: 2000, height: 720}, 1280, 720)",
        "unknown": "c.contentRect({left: 0, top: 0, width: 100, height: 100}, 0, 0)",
        "centre": "c.relativePoint(c.contentRect({left: 0, top: 0, width: 1280, height: 900}, 1280, 720), 640, 450)",
        "in_bar": "c.relativePoint(c.contentRect({left: 0, top: 0, width: 1280, height: 900}, 1280, 720), 100, 10)",
        "corner": "c.relativePoint({left: 0, top: 0, width: 1280, height: 720}, 1279.9, 719.9)",
    })
    assert r["tall"] == {"left": 0, "top": 90, "width": 1280, "height": 720}
    assert r["wide"] == {"left": 370, "top": 20, "width": 1280, "height": 720}
    assert r["unknown"] is None
    assert r["centre"] == {"x": 0.5, "y": 0.5}
    assert r["in_bar"] == {"x": 0.07813, "y": 0}  # clamped onto the picture's top edge
    assert 0.9999 <= r["corner"]["x"] <= 1 and 0.9998 <= r["corner"]["y"] <= 1


def test_wheel_notches() -> None:
    r = run({
        "one_down": "c.wheelNotches(100, 0)", "one_up": "c.wheelNotches(-100, 0)",
        "trackpad": "c.wheelNotches(33, 0)", "lines": "c.wheelNotches(3, 1)", "page": "c.wheelNotches(1, 2)",
        "huge": "c.wheelNotches(1e6, 0)", "huge_up": "c.wheelNotches(-1e6, 0)",
        "zero": "Object.is(c.wheelNotches(-0.001, 0), 0)",
    })
    assert (r["one_down"], r["one_up"], r["trackpad"], r["lines"], r["page"]) == (1, -1, 0.33, 1, 1)
    assert (r["huge"], r["huge_up"]) == (WHEEL_MAX_NOTCHES, -WHEEL_MAX_NOTCHES)
    assert r["zero"] is True


def test_sizes_are_even_and_within_broker_limits() -> None:
    r = run({
        "odd": "c.evenSize(1001.4, 719, c.PROFILE_LIMITS)",
        "tiny": "c.evenSize(10, 10, c.PROFILE_LIMITS)",
        "huge": "c.evenSize(20000, 9000, c.PROFILE_LIMITS)",
        "resize_tiny": "c.evenSize(10, 10, c.RESIZE_LIMITS)",
        "limits": "c.PROFILE_LIMITS",
    })
    assert r["odd"] == {"width": 1000, "height": 718}
    assert r["tiny"] == {"width": PROFILE_SCHEMA["width"].minimum, "height": PROFILE_SCHEMA["height"].minimum}
    assert r["huge"] == {"width": MAX_WIDTH_PX, "height": MAX_HEIGHT_PX}
    assert r["resize_tiny"] == {"width": 64, "height": 64}
    assert r["limits"] == {"minW": PROFILE_SCHEMA["width"].minimum, "minH": PROFILE_SCHEMA["height"].minimum,
                           "maxW": MAX_WIDTH_PX, "maxH": MAX_HEIGHT_PX}


def test_queue_wait_estimate() -> None:
    r = run({
        "none_yet": "c.estimateWaitS(3, 0, 120)", "rate": "c.estimateWaitS(3, 2, 60)",
        "unknown_pos": "c.estimateWaitS(null, 2, 60)", "no_time": "c.estimateWaitS(1, 1, 0)",
    })
    assert r["none_yet"] is None and r["unknown_pos"] is None and r["no_time"] is None
    assert r["rate"] == 90  # 2 seats in 60 s -> 30 s per place, 3 places ahead


def test_chart_downsampling_keeps_peaks_and_order() -> None:
    # 30 days of one-minute samples with one spike: thinned to about 600 points, spike kept, time order kept
    series = "Array.from({length: 43200}, (_, i) => [i * 60000, (i % 1440 < 720 ? 5 : 1) + (i === 20000 ? 40 : 0)])"
    r = run({
        "n": f"c.downsample({series}, 0, 43200 * 60000, 600).length",
        "peak": f"Math.max(...c.downsample({series}, 0, 43200 * 60000, 600).map((p) => p[1]))",
        "ordered": f"c.downsample({series}, 0, 43200 * 60000, 600).every((p, i, a) => !i || p[0] >= a[i - 1][0])",
        "small": "c.downsample([[0, 1], [1, 2]], 0, 10, 600).length",
    }, WEB / "charts.js")
    assert 300 <= r["n"] <= 600 and r["peak"] == 41 and r["ordered"] is True and r["small"] == 2


def test_frame_stamp_matches_the_game_renderer() -> None:
    """web/stamp.js reads the stamps streamer/desktop/game.py draws (same bits, CRC and layout)."""
    game = pytest.importorskip("streamer.desktop.game")
    frame_no, ts_ms = 123_456, 1_796_238_000_123
    bits = [int(v > 0) for v in game.stamp_bits(frame_no, ts_ms).flatten()]
    flipped = list(bits)
    flipped[50] ^= 1  # one damaged cell inside the timestamp
    scale = 4
    # the same bits painted as RGBA cells (scale x scale pixels each), with a grey fringe like codec ringing
    paint = (f"(() => {{ const b = {json.dumps(bits)}, s = {scale}, w = 40 * s;"
             " const px = new Uint8ClampedArray(w * 3 * s * 4);"
             " for (let y = 0; y < 3 * s; y++) for (let x = 0; x < w; x++) {"
             " const on = b[Math.floor(y / s) * 40 + Math.floor(x / s)];"
             " const edge = x % s === 0 || y % s === 0; const v = edge ? 128 : (on ? 240 : 15);"
             " px.set([v, v, v, 255], (y * w + x) * 4); } return px; })()")
    r = run({
        "ok": f"c.parseStamp({json.dumps(bits)})",
        "damaged": f"c.parseStamp({json.dumps(flipped)})",
        "short": "c.parseStamp([1, 0, 1])",
        "cells": f"c.cellBits({paint}, {scale}).join('') === {json.dumps(''.join(map(str, bits)))}",
        "height": "c.stampHeight(1280)",
        "crc": "c.crc32([0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38, 0x39])",  # "123456789"
        "median": "[c.median([5, 1, 3]), c.median([4, 1, 3, 2]), c.median([])]",
    }, WEB / "stamp.js")
    assert r["ok"] == {"frameNo": frame_no, "tsMs": ts_ms}
    assert r["damaged"] is None and r["short"] is None
    assert r["cells"] is True
    assert r["height"] == game.stamp_height(1280)
    assert r["crc"] == 0xCBF43926  # the CRC-32 check value
    assert r["median"] == [3, 2.5, None]


def test_rtp_offset_pairs_a_glass_to_glass_sample_with_the_frame_its_metadata_describes() -> None:
    # The node's RTP timestamp is its render clock (ms) x 90 plus a random origin, mod 2**32; a sample whose
    # drawn image is a newer frame than its metadata shows up as an offset away from the usual one.
    stamp, origin = 1_764_000_000_123, 4_294_967_000  # near the wrap, to cover it
    rtp = f"(({origin} + {stamp} * 90) % 2 ** 32)"
    r = run({
        "offset_paired": f"c.rtpOffset({rtp}, {stamp})",
        # metadata of frame F (rendered at stamp), image of G rendered 33 ms later
        "shift_newer": f"c.rtpShiftMs(c.rtpOffset({rtp}, {stamp} + 33), c.rtpOffset({rtp}, {stamp}))",
        "shift_paired": f"c.rtpShiftMs(c.rtpOffset({rtp}, {stamp}), c.rtpOffset({rtp}, {stamp}))",
        "no_rtp": f"c.rtpOffset(undefined, {stamp})",
        "no_origin": "c.rtpShiftMs(5, null)",
        "mode": "c.mode([7, 3, 3, 9, 7, 3])", "mode_tie": "c.mode([2, 1, 1, 2])", "mode_empty": "c.mode([])",
    })
    assert r["offset_paired"] == origin
    assert r["shift_newer"] == -33 and r["shift_paired"] == 0
    assert r["no_rtp"] is None and r["no_origin"] == 0
    assert (r["mode"], r["mode_tie"], r["mode_empty"]) == (3, 1, None)


def test_per_minute_is_the_judges_rate_and_a_dash_when_nobody_reported() -> None:
    r = run({"rate": "c.perMinute(30, 20)", "none": "c.perMinute(null, 20)", "zero_min": "c.perMinute(3, 0)",
             "small": "c.perMinute(1, 3)"})
    assert r == {"rate": "1.50", "none": "\u2013", "zero_min": "0.00", "small": "0.33"}


def test_gamepad_message_only_for_standard_mapping_pads() -> None:
    pad = ("{index: 1, mapping: 'standard', axes: [0.12345, -2, 0, 1, 0.5, 0, 0, 0, 0.9],"
           " buttons: Array.from({length: 18}, (_, i) => ({value: i === 0 ? 1 : i === 6 ? 0.4444 : 0}))}")
    r = run({
        "standard": f"c.gamepadMessage({pad})",
        "unmapped": f"c.gamepadMessage({{...{pad}, mapping: ''}})",
        "index_4": f"c.gamepadMessage({{...{pad}, index: 4}})",
        "none": "c.gamepadMessage(null)",
    })
    msg = r["standard"]
    assert msg["t"] == "gp" and msg["i"] == 1
    assert msg["ax"] == [0.123, -1, 0, 1, 0.5, 0, 0, 0]  # rounded, clamped, at most 8
    assert len(msg["bt"]) == 17 and msg["bt"][0] == 1 and msg["bt"][6] == 0.444
    assert r["unmapped"] is None and r["index_4"] is None and r["none"] is None
