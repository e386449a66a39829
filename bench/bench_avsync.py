"""A/V sync benchmark: when a sound and the picture made at the same instant reach the viewer in Chromium.

Run: ``python bench/bench_avsync.py`` (``--beeps N``, default 30, one a second; ``--quick`` for 6;
``--playout sync low``, the default: one session per mode, one after the other, each reported).
It starts what ``bench/bench_glass.py`` starts (broker with embedded defaults, a ``game`` pool, one
render node with the built-in game and a software encoder, headless Debian Chromium through
Playwright, the page signing in and starting a session like a user), with the node's
``--game-beacon-ms 1000``: the built-in game beeps (1 kHz, 60 ms) at every whole second T of its
render clock, and the frame rendered at or after T carries T' >= T in its stamp.

Measured in the page, both on this machine's clock (ms since the epoch):

- picture: the ``requestVideoFrameCallback`` collector of bench_glass reads every shown frame's
  stamp; the instant T is on screen at the expected display time of the first frame stamped >= T
  (the frame a flash at T would be in). ``video delay = that display time - T``.
- sound: the received audio track goes through an ``AudioWorklet`` that reports the first sample
  over 5 % of full scale after 200 ms of quiet (sample-exact, in the AudioContext's frames; only the
  first onset within 500 ms of a whole second counts: the game's own hit sounds also make onsets);
  ``AudioContext.getOutputTimestamp()`` maps context time to performance time at the output, so
  ``heard = timeOrigin + performanceTime + (onset - contextTime)``, which includes the context's
  output latency (reported beside it). ``audio delay = heard - T``.

``offset = audio delay - video delay`` per beep (positive: the sound comes late). Goal (issue #19):
|offset| p95 <= 45 ms. Prints per-beep rows with ``--verbose``, then p50/p95 of both delays and of the
offset, the output latency the context reported, and how busy the machine was.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # measure this checkout (children run from it too)

from bench.bench_glass import (
    COLLECTOR_JS,
    TAKE_JS,
    _end_session,
    _until,
    frame_shift_ms,
    open_stream,
    run_guarded,
    served,
)
from bench.common import CHROMIUM, machine_busy_cpu_s, print_table
from encoder.stats import percentile

BEACON_MS = 1000
GOAL_MS = 45.0
MODES = ("sync", "low", "browser")  # the page's receive-side buffering (web/playout.js)

# The sound side: an AudioWorklet on the received audio track reports onsets in context frames; the main
# thread pairs each with the context's output timestamp (context time <-> performance time at the output).
AUDIO_JS = """async () => {
  const pc = window.renderBroker.pc;
  const r = pc && pc.getReceivers().find((x) => x.track && x.track.kind === 'audio');
  if (!r) return 'no audio receiver';
  const ctx = new AudioContext({latencyHint: 'interactive', sampleRate: 48000});
  const code = `class Onset extends AudioWorkletProcessor {
    constructor() { super(); this.quiet = sampleRate; }
    process(inputs) {
      const ch = inputs[0] && inputs[0][0];
      if (!ch) return true;
      for (let i = 0; i < ch.length; i++) {
        if (Math.abs(ch[i]) > 0.05) {
          if (this.quiet > sampleRate * 0.2) this.port.postMessage(currentFrame + i);
          this.quiet = 0;
        } else this.quiet += 1;
      }
      return true;
    }
  }
  registerProcessor('onset', Onset);`;
  await ctx.audioWorklet.addModule(URL.createObjectURL(new Blob([code], {type: 'application/javascript'})));
  const onset = new AudioWorkletNode(ctx, 'onset');
  const mute = ctx.createGain();
  mute.gain.value = 0;
  ctx.createMediaStreamSource(new MediaStream([r.track])).connect(onset);
  onset.connect(mute).connect(ctx.destination);  // pulled by the graph, inaudible
  await ctx.resume();
  const st = {heard: [], outputLatency: [], state: () => ctx.state};
  onset.port.onmessage = (e) => {
    const ts = ctx.getOutputTimestamp();
    const at = e.data / ctx.sampleRate;
    st.heard.push(performance.timeOrigin + ts.performanceTime + (at - ts.contextTime) * 1000);
    st.outputLatency.push(((ctx.outputLatency || 0) + (ctx.baseLatency || 0)) * 1000);
  };
  window.__avsync = st;
  return ctx.state;
}"""
TAKE_AUDIO_JS = "() => ({heard: window.__avsync.heard, outputLatency: window.__avsync.outputLatency})"
# Chromium's audio jitter buffer (NetEq), cumulative: seconds held / samples emitted, and its target
AUDIO_STATS_JS = """async () => {
  const pc = window.renderBroker.pc;
  const r = pc.getReceivers().find((x) => x.track && x.track.kind === 'audio');
  let out = {target: r && ('jitterBufferTarget' in r) ? r.jitterBufferTarget : null};
  (await pc.getStats()).forEach((s) => {
    if (s.type === 'inbound-rtp' && s.kind === 'audio') {
      out = {...out, delay: s.jitterBufferDelay, emitted: s.jitterBufferEmittedCount,
             targetDelay: s.jitterBufferTargetDelay, minimumDelay: s.jitterBufferMinimumDelay,
             concealed: s.concealedSamples, received: s.totalSamplesReceived};
    }
  });
  return out;
}"""
# what the page's "sync" control did (web/playout.js): its floor and its last step's readings
PLAYOUT_STATE_JS = "() => window.renderBroker.playout"


@dataclass(frozen=True)
class Beep:
    t_ms: int  # the render-clock instant of the beep and of the flash
    video_ms: float  # expected display time of the first frame stamped >= t, minus t
    audio_ms: float  # when the onset played out of the page's audio context, minus t

    @property
    def offset_ms(self) -> float:
        return self.audio_ms - self.video_ms


def pair(display_ms: list[float], stamps: list[int], heard_ms: list[float], period_ms: int = BEACON_MS,
         max_delay_ms: float = 500.0) -> list[Beep]:
    """Beeps found on both sides: each onset is given the whole period T before it (within ``max_delay_ms``;
    only the first onset of a period: a later one is the game's own sound, a hit), and T's picture is the first
    shown frame stamped at or after T (pure)."""
    shown = sorted(zip(stamps, display_ms, strict=True))
    beeps = []
    seen: set[int] = set()
    for heard in sorted(heard_ms):
        t = int(heard // period_ms) * period_ms
        if heard - t > max_delay_ms or t in seen:
            continue
        seen.add(t)
        first = next(((s, d) for s, d in shown if s >= t), None)
        if first is None or first[0] - t > period_ms / 2:  # no frame near T was shown (or read)
            continue
        beeps.append(Beep(t, first[1] - t, heard - t))
    return beeps


async def measure(opts: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    """One session per ``--playout`` mode on one stack, one after the other: each mode's window."""
    async with served(opts, workdir, ("--game-beacon-ms", str(BEACON_MS))) as up:
        windows: list[dict[str, Any]] = []
        for mode in opts.playout:
            if windows:
                await _until("the previous session's seat freed", up.seat_free, up.procs)
            windows.append(await _window(up, mode, opts))
        return windows


async def _window(up: Any, mode: str, opts: argparse.Namespace) -> dict[str, Any]:
    page = await open_stream(up.ctx, up.base, up.token, mode)
    try:
        await page.evaluate(COLLECTOR_JS)
        state = await page.evaluate(AUDIO_JS)
        if state != "running":
            raise RuntimeError(f"the page's audio context is {state!r}, not running")
        await asyncio.sleep(opts.warmup_s)
        await page.evaluate("() => { window.__glass.clear(); window.__avsync.heard.length = 0; "
                            "window.__avsync.outputLatency.length = 0; }")
        cpu0, t0, load0 = machine_busy_cpu_s(), time.monotonic(), os.getloadavg()[0]
        jb0 = await page.evaluate(AUDIO_STATS_JS)
        await asyncio.sleep(opts.beeps * BEACON_MS / 1000 + 0.5)
        video = await page.evaluate(TAKE_JS)
        audio = await page.evaluate(TAKE_AUDIO_JS)
        jb1 = await page.evaluate(AUDIO_STATS_JS)
        playout = await page.evaluate(PLAYOUT_STATE_JS)
        cpu1, t1, load1 = machine_busy_cpu_s(), time.monotonic(), os.getloadavg()[0]
    finally:
        await _end_session(page)
        await page.close()
    busy = None if cpu0 is None or cpu1 is None else (cpu1 - cpu0) / ((t1 - t0) * (os.cpu_count() or 1))
    stamps = [int(v) for v in video["stamps"]]
    shifts, _ = frame_shift_ms(stamps, [None if v is None else int(v) for v in video["rtp"]])
    display = [float(g) - d + s for g, d, s in zip(video["display"], shifts, stamps, strict=True)]
    return {"mode": mode, "display": display, "stamps": stamps, "heard": [float(v) for v in audio["heard"]],
            "output_latency": [float(v) for v in audio["outputLatency"]], "busy": busy, "load": (load0, load1),
            "jitter_buffer_ms": _per_sample_ms(jb0, jb1, "delay"), "jitter_target_ms": _per_sample_ms(jb0, jb1,
                                                                                                      "targetDelay"),
            "concealed": (jb1.get("concealed") or 0) - (jb0.get("concealed") or 0),
            "receiver_target_ms": jb1.get("target"), "playout": playout}


def _per_sample_ms(before: dict[str, Any], after: dict[str, Any], key: str) -> float | None:
    """A cumulative getStats delay (s) per emitted sample over the window, in ms."""
    n = (after.get("emitted") or 0) - (before.get("emitted") or 0)
    return None if n <= 0 else ((after.get(key) or 0) - (before.get(key) or 0)) / n * 1000


def report(data: dict[str, Any], verbose: bool) -> list[Beep]:
    beeps = pair(data["display"], data["stamps"], data["heard"])
    print(f"\n=== receive-side buffering: {data['mode']}")
    if verbose:
        print_table(["beep T (ms)", "video delay", "audio delay", "offset"],
                    [[str(b.t_ms), f"{b.video_ms:.1f}", f"{b.audio_ms:.1f}", f"{b.offset_ms:+.1f}"] for b in beeps])

    def p(values: list[float]) -> str:
        return f"{percentile(values, 50):.1f} / {percentile(values, 95):.1f}" if values else "n/a"

    offsets = [b.offset_ms for b in beeps]
    abs_p95 = percentile([abs(v) for v in offsets], 95) if offsets else None
    print(f"\nbeeps: {len(data['heard'])} heard, {len(beeps)} paired with the frame shown for their instant "
          f"({len(data['stamps'])} frames read)")
    print(f"video delay ms p50 / p95 (render -> expected display of the first frame at or after the instant): "
          f"{p([b.video_ms for b in beeps])}")
    print(f"audio delay ms p50 / p95 (instant -> onset at the audio context's output):                         "
          f"{p([b.audio_ms for b in beeps])}")
    print(f"offset ms p50 / p95 (audio - video; positive = sound late): {p(offsets)}; |offset| p95 "
          + ("n/a" if abs_p95 is None else f"{abs_p95:.1f} (goal <= {GOAL_MS:g}: "
                                           f"{'met' if abs_p95 <= GOAL_MS else 'NOT met'})"))
    lat = data["output_latency"]
    print(f"audio context output + base latency (included in the audio delay): {p(lat)} ms")
    jb, target = data["jitter_buffer_ms"], data["jitter_target_ms"]
    print(f"Chromium's audio jitter buffer (NetEq) over the window: {'n/a' if jb is None else f'{jb:.1f}'} ms held "
          f"per sample, target {'n/a' if target is None else f'{target:.1f}'} ms, receiver jitterBufferTarget "
          f"{data['receiver_target_ms']}, concealed samples {data['concealed']}")
    pl = data["playout"] or {}
    if pl.get("mode") == "sync":
        last = pl.get("sync") or {}
        print(f"video floor (jitterBufferTarget) at the end: {_ms(pl.get('targetMs'))}; its last step: sound "
              f"{_ms(last.get('soundMs'))} (NetEq + output {_ms(last.get('outputMs'))}), video beyond its floor "
              f"{_ms(last.get('ownMs'))}, wanted {_ms(last.get('wantedMs'))}")
    if data["busy"] is not None:
        print(f"machine: {os.cpu_count()} CPUs, {data['busy']:.0%} busy during the window (node, browser, broker "
              f"and anything else running); load average {data['load'][0]:.2f} -> {data['load'][1]:.2f}")
    return beeps


def _ms(v: Any) -> str:
    return "n/a" if not isinstance(v, int | float) else f"{v:.1f} ms"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--beeps", type=int, default=None, help="beeps measured, one a second (default 30, quick 6)")
    parser.add_argument("--quick", action="store_true", help="6 beeps after a 2 s warm-up")
    parser.add_argument("--warmup-s", type=float, default=None, help="streaming before the window (default 3)")
    parser.add_argument("--encoder", default="auto", help="render node --encoder (auto, libx264, vp8, ...)")
    parser.add_argument("--verbose", action="store_true", help="print every beep")
    parser.add_argument("--playout", nargs="+", choices=MODES, default=["sync", "low"],
                        help="the page's receive-side buffering, one session each in this order: sync (desktops' "
                             "default: the picture waits for the sound), low (games' default: the picture is shown "
                             "as soon as decoded), browser (Chromium's own)")
    opts = parser.parse_args(argv)
    opts.beeps = opts.beeps or (6 if opts.quick else 30)
    opts.warmup_s = opts.warmup_s if opts.warmup_s is not None else (2.0 if opts.quick else 3.0)
    opts.size = (1280, 720)
    if opts.beeps < 1:
        parser.error("--beeps must be >= 1")
    return opts


def run(argv: list[str] | None = None) -> dict[str, list[Beep]]:
    """Parse ``argv``, measure, print the report; each mode's paired beeps (the smoke test calls this)."""
    opts = parse_args(argv)
    if not os.access(CHROMIUM, os.X_OK):
        raise SystemExit(f"{CHROMIUM} is missing: install Debian's chromium package (browsers are never downloaded)")
    workdir = Path(tempfile.mkdtemp(prefix="rb-avsync-"))
    print(f"A/V sync on loopback: the built-in game beeps every {BEACON_MS} ms of its render clock; {opts.beeps} "
          f"beeps measured in headless Chromium per mode ({', '.join(opts.playout)})", flush=True)
    try:
        data = asyncio.run(run_guarded(opts, workdir, measure))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted: everything this benchmark started has been stopped", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {w["mode"]: report(w, opts.verbose) for w in data}


if __name__ == "__main__":
    raise SystemExit(0 if all(run().values()) else 1)
