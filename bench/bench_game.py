"""Game renderer benchmark: the numpy renderer and the OpenGL (EGL) renderer side by side.

Run: ``python bench/bench_game.py [--frames 300] [--sizes 1280x720,1920x1080]
[--device N] [--json PATH] [--require-gl]``.  For each size it steps one
``Game`` through ``--frames`` scenes (16 ms apart, a key held so the player
moves), then draws that same list of scenes with each renderer, frames back
to back (no pacing), and prints per renderer:

- ms/frame p50 / p95 (wall time of one ``render`` call, readback included),
- fps: frames / wall time of the loop (what one thread sustains),
- cpu ms/frame: this process's CPU time (``time.process_time``, every thread:
  llvmpipe's worker threads count, a GPU's work does not) / frames,
- for GL, ``gl-draw`` too: the draw alone with ``glFinish``, no readback (the
  cost a device-memory encoder would see),
- and how the GL frames compare with the numpy frames of the same scenes
  (mean / max absolute difference per channel, stamps read back equal).

Renderers: ``cpu`` = ``streamer.desktop.game.CpuGameRenderer``; ``gl`` =
``streamer.desktop.glgame.GlGameRenderer`` on EGL device ``--device`` (None:
the first), whose ``GL_RENDERER`` is printed ("llvmpipe ..." is Mesa on the
CPU).  Imports only numpy, moderngl and this checkout (no PyAV), so it runs on
a GPU machine that has just those.  ``--require-gl`` exits 2 when GL cannot
start (otherwise the numpy rows are printed with the reason); ``--list-devices
N`` first prints what GL answers on EGL devices 0..N-1 (glvnd lists each
vendor's devices in turn: on an NVIDIA host with Mesa installed too, the GPUs
and then Mesa's llvmpipe).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # measure this checkout's game

import numpy as np

from bench.common import machine_busy_cpu_s, own_cpu_s, print_table
from streamer.desktop.game import CpuGameRenderer, Game, Scene, read_stamp
from streamer.desktop.glgame import GlGameRenderer, GlUnavailableError, probe_gl
from streamer.desktop.inputs import InputEvent, Key, parse_input

DEFAULT_SIZES = "1280x720,1920x1080"
FRAME_STEP_MS = 16  # between consecutive scenes: a 60 fps game clock
WARMUP_FRAMES = 10  # per renderer and size, not timed (shader compile, first allocations)
T0_MS = 1_764_700_000_000


@dataclass(frozen=True, slots=True)
class Row:
    size: str
    renderer: str  # cpu | gl | gl-draw
    frames: int
    p50_ms: float
    p95_ms: float
    fps: float
    cpu_ms_per_frame: float


@dataclass(frozen=True, slots=True)
class Agreement:
    size: str
    mean_abs_diff: float  # per channel, 0..255, over every compared frame
    max_abs_diff: int
    stamps_equal: bool  # every GL frame's stamp read back as its scene's
    frames_compared: int


def _key_down(code: str) -> InputEvent:
    event = parse_input(json.dumps({"t": "k", "c": code, "d": True}))
    assert isinstance(event, Key), event
    return event


def scenes(width: int, height: int, count: int) -> list[Scene]:
    """``count`` consecutive scenes of one game, the player moving right then down."""
    game = Game(width, height)
    game.apply(_key_down("ArrowRight"))
    out = []
    for i in range(count):
        if i == count // 2:
            game.apply(_key_down("ArrowDown"))
        out.append(game.scene(T0_MS + i * FRAME_STEP_MS))
    return out


def time_renderer(size: str, name: str, draw: Callable[[Scene], object], warm: list[Scene], work: list[Scene]) -> Row:
    """Draw ``warm`` untimed, then every scene of ``work`` back to back: wall time per call, process CPU time."""
    for scene in warm:
        draw(scene)
    times = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for scene in work:
        t = time.perf_counter()
        draw(scene)
        times.append(time.perf_counter() - t)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    ms = np.array(times) * 1000.0
    return Row(
        size=size,
        renderer=name,
        frames=len(work),
        p50_ms=float(np.percentile(ms, 50)),
        p95_ms=float(np.percentile(ms, 95)),
        fps=len(work) / wall,
        cpu_ms_per_frame=cpu * 1000.0 / len(work),
    )


def compare(size: str, cpu: CpuGameRenderer, gl: GlGameRenderer, work: list[Scene], every: int) -> Agreement:
    """GL vs numpy on every ``every``-th scene: pixel difference and stamps."""
    total, count, worst, stamps_ok = 0.0, 0, 0, True
    for scene in work[::every]:
        a = cpu.render(scene).astype(np.int16)
        b = gl.render(scene)
        diff = np.abs(a - b)
        total += float(diff.mean())
        worst = max(worst, int(diff.max()))
        stamp = read_stamp(b)
        stamps_ok &= stamp is not None and (stamp.frame_no, stamp.ts_ms) == (scene.frame_no, scene.ts_ms)
        count += 1
    return Agreement(size, total / max(count, 1), worst, stamps_ok, count)


def list_devices(count: int) -> list[dict[str, object]]:
    """``probe_gl`` on EGL devices 0..count-1: which GL answers on each index (the order glvnd gives)."""
    found: list[dict[str, object]] = []
    for index in range(count):
        ok, info = probe_gl(index)
        found.append({"index": index, "ok": ok, "info": info})
        print(f"EGL device {index}: {'ok' if ok else 'no'}: {info}")
    return found


def parse_sizes(text: str) -> list[tuple[int, int]]:
    sizes = []
    for item in text.split(","):
        w, _, h = item.strip().partition("x")
        sizes.append((int(w), int(h)))
    return sizes


def run(frames: int, sizes: list[tuple[int, int]], device: int | None) -> dict[str, object]:
    """Benchmark every size with both renderers; the figures as a JSON-ready dict."""
    rows: list[Row] = []
    agreements: list[Agreement] = []
    gl_info: dict[str, object] = {"device_index": device, "available": False, "renderer": None, "reason": None}
    cpu_before, own_before, wall_before = machine_busy_cpu_s(), own_cpu_s(), time.perf_counter()
    load_before = os.getloadavg()
    for width, height in sizes:
        size = f"{width}x{height}"
        every = scenes(width, height, WARMUP_FRAMES + frames)
        warm, work = every[:WARMUP_FRAMES], every[WARMUP_FRAMES:]
        cpu = CpuGameRenderer(width, height)
        rows.append(time_renderer(size, "cpu", cpu.render, warm, work))
        try:
            t = time.perf_counter()
            gl = GlGameRenderer(width, height, device_index=device)
            gl_info["init_ms"] = round((time.perf_counter() - t) * 1000.0, 1)
        except GlUnavailableError as exc:
            gl_info["reason"] = exc.reason
            print(f"  .. {size}: GL unavailable: {exc.reason}", file=sys.stderr)
            continue
        gl_info.update(available=True, renderer=gl.renderer_string)
        try:
            rows.append(time_renderer(size, "gl", gl.render, warm, work))
            rows.append(time_renderer(size, "gl-draw", gl.draw, warm, work))
            agreements.append(compare(size, cpu, gl, work, every=max(1, len(work) // 10)))
        finally:
            gl.close()
        print(f"  .. {size} done", file=sys.stderr)
    cpu_after, own_after = machine_busy_cpu_s(), own_cpu_s()
    wall = time.perf_counter() - wall_before
    others_share = None
    if cpu_before is not None and cpu_after is not None:
        others = (cpu_after - cpu_before) - (own_after - own_before)
        others_share = round(max(0.0, others) / (wall * (os.cpu_count() or 1)), 3)
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_before": [round(v, 2) for v in load_before],
            "loadavg_after": [round(v, 2) for v in os.getloadavg()],
            "others_cpu_share": others_share,  # other processes' share of all cores during the run
        },
        "frames": frames,
        "gl": gl_info,
        "rows": [asdict(r) for r in rows],
        "agreement": [asdict(a) for a in agreements],
    }


def print_report(result: dict[str, object]) -> None:
    gl = result["gl"]
    machine = result["machine"]
    assert isinstance(gl, dict) and isinstance(machine, dict)
    print(f"machine: {machine['cpus']} CPUs, load average before {machine['loadavg_before']}")
    device = "0 (default)" if gl["device_index"] is None else gl["device_index"]
    if gl["available"]:
        print(f"GL: EGL device {device}: {gl['renderer']} (context + setup {gl.get('init_ms')} ms)")
    else:
        print(f"GL: unavailable on EGL device {device}: {gl['reason']}")
    rows = result["rows"]
    assert isinstance(rows, list)
    print(f"\nms per frame, {result['frames']} frames back to back per renderer and size")
    print_table(
        ["size", "renderer", "p50 ms", "p95 ms", "fps", "cpu ms/frame"],
        [
            [r["size"], r["renderer"], f"{r['p50_ms']:.2f}", f"{r['p95_ms']:.2f}", f"{r['fps']:.0f}",
             f"{r['cpu_ms_per_frame']:.2f}"]
            for r in rows
        ],
    )  # fmt: skip
    agreement = result["agreement"]
    assert isinstance(agreement, list)
    if agreement:
        print("\nGL frames vs numpy frames of the same scenes")
        print_table(
            ["size", "frames", "mean |diff|", "max |diff|", "stamps"],
            [
                [a["size"], str(a["frames_compared"]), f"{a['mean_abs_diff']:.3f}", str(a["max_abs_diff"]),
                 "equal" if a["stamps_equal"] else "DIFFER"]
                for a in agreement
            ],
        )  # fmt: skip
    print(
        f"\nload average after {machine['loadavg_after']}; other processes used "
        f"{machine['others_cpu_share']} of all cores during the run (they skew the timings)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=300, help="timed frames per renderer and size")
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="comma-separated WxH list")
    parser.add_argument("--device", type=int, default=None, help="EGL device index for GL (default: the first)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    parser.add_argument("--require-gl", action="store_true", help="exit 2 if the GL renderer cannot start")
    parser.add_argument(
        "--list-devices", type=int, default=0, metavar="N", help="first probe EGL devices 0..N-1 and print each one"
    )
    args = parser.parse_args(argv)
    if args.frames < 1:
        parser.error("--frames must be at least 1")
    devices = list_devices(args.list_devices)
    result = run(args.frames, parse_sizes(args.sizes), args.device)
    result["devices"] = devices
    print_report(result)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    gl = result["gl"]
    assert isinstance(gl, dict)
    return 2 if args.require_gl and not gl["available"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
