"""Encoder benchmark: speed, bitrate accuracy and keyframe size vs cap.

Run: ``python bench/bench_encoder.py`` (``--quick`` for fewer frames). Prints
three tables for every backend the probe finds available on this machine:

1. ms/frame (p50/p95) for encode and colour conversion, measured separately,
   and the frame rate one encoder sustains (conversion + encode, back to
   back, with ``thr`` codec/swscale threads) at 720p30 and 1080p60 settings,
   from numpy BGRA input (what mss gives; x11grab's bgr0 costs the same);
2. bitrate accuracy: output rate / target for a few targets, and for x264 a
   live change sequence on one open encoder;
3. keyframe size vs the cap (KEYFRAME_CAP_FRAMES x bitrate / fps / 8 bytes).

Content: "desktop" is the moving test pattern (gradients, a sliding
checkerboard window, text-like stripes); "detail" adds random texture over a
third of the rows (a busy game scene) -- at low bitrates it is beyond what
VP8/AV1 reach at their maximum quantizer.
One encoder runs at a time, frames back to back (no pacing): the numbers are
per-frame cost on an otherwise idle machine, not latency under load.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # measure this checkout's encoder

import numpy as np

from bench.common import machine_busy_cpu_s, own_cpu_s, print_table
from encoder.backends import Backend, backend_by_name
from encoder.pattern import moving_pattern
from encoder.probe import probe_all
from encoder.ratecontrol import KEYFRAME_CAP_FRAMES, keyframe_cap_bytes
from encoder.stats import percentile
from encoder.video import EncoderConfig, VideoEncoder

DISTINCT_FRAMES = 16  # source frames generated up front and cycled (1080p BGRA = 8 MB each)
FRAME_BUDGET_60FPS_MS = 1000.0 / 60.0


@dataclass(frozen=True)
class SpeedRow:
    backend: str
    content: str
    convert: str
    size: str
    fps: int
    threads: int
    encode_p50: float
    encode_p95: float
    convert_p50: float
    convert_p95: float
    total_p50: float
    total_p95: float
    sustained_fps: float


def _sources(width: int, height: int, detail: bool = True) -> list[np.ndarray]:
    return [moving_pattern(width, height, i, detail=detail) for i in range(DISTINCT_FRAMES)]


def bench_speed(
    backend: Backend,
    width: int,
    height: int,
    fps: int,
    threads: int,
    frames: int,
    detail: bool = True,
    fast_convert: bool = False,
) -> SpeedRow:
    sources = _sources(width, height, detail)
    config = EncoderConfig(
        width,
        height,
        fps,
        bitrate_bps=_default_bitrate(width, height, fps),
        threads=threads,
        fast_convert=fast_convert,
    )
    with VideoEncoder(backend, config) as enc:
        for i in range(5):  # warm-up: first keyframe, allocations
            enc.encode(sources[i % DISTINCT_FRAMES])
        encode_ms, convert_ms, total_ms = [], [], []
        start = time.perf_counter()
        for i in range(frames):
            enc.encode(sources[i % DISTINCT_FRAMES])
            last = enc.stats.last
            assert last is not None
            encode_ms.append(last.encode_ms)
            convert_ms.append(last.convert_ms)
            total_ms.append(last.total_ms)
        wall = time.perf_counter() - start
    return SpeedRow(
        backend.name,
        "detail" if detail else "desktop",
        "point" if fast_convert else "bilinear",
        f"{width}x{height}",
        fps,
        threads,
        percentile(encode_ms, 50),
        percentile(encode_ms, 95),
        percentile(convert_ms, 50),
        percentile(convert_ms, 95),
        percentile(total_ms, 50),
        percentile(total_ms, 95),
        frames / wall,
    )


def _default_bitrate(width: int, height: int, fps: int) -> int:
    """A realistic target: about 0.07 bits per pixel per frame (8 Mbit/s at 1080p60)."""
    return int(width * height * fps * 0.065)


def bench_rate(
    backend: Backend, targets: list[int], frames: int, detail: bool
) -> list[tuple[int, float, float, float]]:
    """(target bps, output/target, max keyframe bytes / cap, max P-frame / frame budget) per target."""
    width, height, fps = 1280, 720, 30
    sources = _sources(width, height, detail)
    rows = []
    for target in targets:
        with VideoEncoder(backend, EncoderConfig(width, height, fps, target)) as enc:
            sizes, keys = [], []
            for i in range(frames):
                if i in (frames // 3, 2 * frames // 3):
                    enc.request_keyframe()
                packets = enc.encode(sources[i % DISTINCT_FRAMES])
                sizes.append(sum(p.size for p in packets))
                keys.append(any(p.is_keyframe for p in packets))
        skip = 30  # let rate control settle after the first keyframe
        rate = sum(sizes[skip:]) * 8 * fps / (frames - skip)
        cap = keyframe_cap_bytes(target, fps)
        budget = target / fps / 8
        max_key = max(s for s, k in zip(sizes, keys, strict=True) if k)
        max_p = max(s for s, k in zip(sizes, keys, strict=True) if not k)
        rows.append((target, rate / target, max_key / cap, max_p / budget))
    return rows


def bench_live_changes(backend: Backend, frames_per_step: int) -> list[tuple[int, float, int]]:
    """One open encoder, a sequence of targets: (target, output/target, keyframes in step)."""
    width, height, fps = 1280, 720, 30
    sources = _sources(width, height)
    steps = [2_500_000, 1_250_000, 4_000_000, 800_000, 2_500_000]
    rows = []
    with VideoEncoder(backend, EncoderConfig(width, height, fps, steps[0])) as enc:
        i = 0
        for target in steps:
            enc.set_bitrate(target)
            sizes, keys = [], 0
            for _ in range(frames_per_step):
                packets = enc.encode(sources[i % DISTINCT_FRAMES])
                i += 1
                sizes.append(sum(p.size for p in packets))
                keys += any(p.is_keyframe for p in packets)
            settle = frames_per_step // 4
            rate = sum(sizes[settle:]) * 8 * fps / (frames_per_step - settle)
            rows.append((target, rate / target, keys))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer frames (noisier numbers)")
    args = parser.parse_args(argv)
    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1: errors only on stderr
    frames = 60 if args.quick else 240

    cpu_before, own_before = machine_busy_cpu_s(), own_cpu_s()
    wall_before = time.perf_counter()
    probes = probe_all()
    available = [backend_by_name(p.name) for p in probes if p.ok]
    print(f"machine: {os.cpu_count()} CPUs; available: {', '.join(b.name for b in available)}")
    for p in probes:
        if not p.ok:
            print(f"  unavailable: {p.name}: {p.reason}")

    print("\n1. Speed, numpy BGRA input, one encoder, frames back to back (ms per frame)")
    speed_rows = []
    for backend in available:
        contents = (True, False) if backend.name == "libx264" else (True,)
        runs = [
            (size, detail, threads, False)
            for size in ((1280, 720, 30), (1920, 1080, 60))
            for detail in contents
            for threads in (1, 2)
        ]
        if backend.name == "libx264":  # the 1080p60 target, with the cheaper chroma subsampling
            runs += [((1920, 1080, 60), detail, 2, True) for detail in contents]
        for (width, height, fps), detail, threads, fast in runs:
            row = bench_speed(backend, width, height, fps, threads, frames, detail, fast)
            speed_rows.append(row)
            print(f"  .. {backend.name} {row.size} {row.content} threads={threads} {row.convert}", file=sys.stderr)
    print_table(
        [
            "backend",
            "content",
            "convert",
            "size",
            "thr",
            "enc p50",
            "enc p95",
            "conv p50",
            "conv p95",
            "total p50",
            "total p95",
            "fps",
            "60fps?",
        ],
        [
            [
                r.backend,
                r.content,
                r.convert,
                r.size,
                str(r.threads),
                f"{r.encode_p50:.2f}",
                f"{r.encode_p95:.2f}",
                f"{r.convert_p50:.2f}",
                f"{r.convert_p95:.2f}",
                f"{r.total_p50:.2f}",
                f"{r.total_p95:.2f}",
                f"{r.sustained_fps:.0f}",
                "yes" if r.total_p95 < FRAME_BUDGET_60FPS_MS else "no",
            ]
            for r in speed_rows
        ],
    )
    print(
        f"  (60fps? = total p95 under {FRAME_BUDGET_60FPS_MS:.1f} ms; fps = frames / wall time, "
        "encode and conversion back to back)"
    )

    print(
        f"\n2/3. Bitrate accuracy and keyframe size vs cap at 1280x720@30 "
        f"(cap = {KEYFRAME_CAP_FRAMES:g} frames = {KEYFRAME_CAP_FRAMES:g} x bitrate / fps / 8 bytes)"
    )
    rate_rows = []
    for backend in available:
        for detail in (False, True):
            for target, accuracy, key_vs_cap, p_vs_budget in bench_rate(
                backend, [1_000_000, 2_500_000, 6_000_000], frames=max(90, frames // 2), detail=detail
            ):
                rate_rows.append(
                    [
                        backend.name,
                        "detail" if detail else "desktop",
                        f"{target / 1e6:g}",
                        f"{accuracy:.2f}",
                        f"{key_vs_cap:.2f}",
                        f"{p_vs_budget:.2f}",
                        "ok" if key_vs_cap <= 1.0 else "OVER",
                    ]
                )
    print_table(["backend", "content", "target Mbps", "out/target", "max key/cap", "max P/frame", "cap"], rate_rows)

    x264 = next((b for b in available if b.name == "libx264"), None)
    if x264 is not None:
        print("\n   libx264 live changes on one open encoder (1280x720@30)")
        rows = bench_live_changes(x264, frames_per_step=max(60, frames // 3))
        print_table(
            ["target Mbps", "out/target", "keyframes"],
            [[f"{t / 1e6:g}", f"{acc:.2f}", str(k)] for t, acc, k in rows],
        )
    cpu_after, own_after = machine_busy_cpu_s(), own_cpu_s()
    if cpu_before is not None and cpu_after is not None:
        wall = time.perf_counter() - wall_before
        others = (cpu_after - cpu_before) - (own_after - own_before)
        share = max(0.0, others) / (wall * (os.cpu_count() or 1))
        print(
            f"\nother processes used {share:.0%} of this machine's CPU during the {wall:.0f} s run "
            "(they compete with the encoder and skew the timings)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
