"""The Chromium viewer of ``bench/bench_abr.py``: headless Debian Chromium, the product's own browser.

Started as ``python bench/abr_peers.py viewer --browser chromium --advertise IP`` (by bench_abr
through ``Lab.popen("viewer", ...)``, so the Playwright driver and Chromium live in the viewer
namespace too).  Same JSON-lines contract and result keys as the aiortc viewer
(``abr_peers.run_viewer``), plus a few diagnostics (``viewer``, ``inbound``, ``mismatched_frames``...).

How: an aiohttp server on 127.0.0.1 (the namespace's own loopback) serves ``bench/abr_viewer.html``
and ``abr_viewer.js`` and the checkout's ``web/`` under ``/web/`` (the page imports the client's
protocol.js, probe.js and stamp.js); Playwright launches ``/usr/bin/chromium`` headless with
``bench.common.CHROMIUM_ARGS`` (mDNS hiding off: plain IPv4 host candidates, checked here against
``--advertise``) and a fresh profile.  The page is the offerer like web/peer.js; the offer, taken
after ICE gathering, goes to the parent, the relayed answer back into the page.

Measured in the page (abr_viewer.js), turned into the result here:
  * frame delay = the wall time ``requestVideoFrameCallback`` ran for the frame - the frame's
    stamp time (ms): after jitter buffer, decode and Chromium's render scheduling, the page
    gets the frame.  Not the callback's ``presentationTime`` (when Chromium handed the frame to
    the compositor, 4-7 ms earlier: the median gap is kept as ``callback_minus_presentation_ms``):
    frame delays computed from it fell by up to 2.5 ms a second in some runs, below the path's
    own delay and then below zero within 20 s, a cause not pinned down (``performance.now()``
    did not drift against ``Date.now()``, nor the node's clock against its monotonic one; in
    the runs since, the callback-to-presentationTime gap stayed flat).  The callback's own
    ``performance.now()`` is a reading of the real clock.  ``expectedDisplayTime`` is Chromium's estimate
    of when the frame becomes visible (headless has no display; median difference to
    presentationTime kept as ``expected_display_minus_presentation_ms``).  Under
    load the callback's drawn image can be a newer frame than the one its metadata describes;
    the sender's RTP timestamps (its render clock at 90 kHz plus a random origin for
    ``ours``/``fixed``; aiortc's capture clock, a few ms off the render time, for ``stock``)
    pair each sample with its own frame (``pair_frames``).  Unreadable stamps: frame callbacks
    whose drawn stamp strip does not decode (a corrupt picture);
  * goodput: inbound-rtp video ``bytesReceived`` polled every 100 ms (payload bytes), each
    poll's increase put in the bin of the poll's wall time.  Retransmissions (RTX) are in it,
    as in the aiortc viewer's count: ``retransmittedBytesReceived`` is a part of
    ``bytesReceived``, as the spec says (measured: adding it on top made the goodput exceed
    the bytes the bottleneck forwarded, 2.46 Mbps through a 2 Mbps link, where bytesReceived
    alone is the forwarded bytes less 55-75 bytes of headers a packet);
  * pings: ``{"t":"ping"}`` every ``--ping-ms`` on the input channel, answered by the node.

Concurrency model: the viewer child's one asyncio loop runs the parent's signals, the page
server and Playwright's client; the driver and Chromium are Playwright's processes, closed with
the browser context on the way out (also on error), then the profile is deleted.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import logging
import re
import shutil
import statistics
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from bench.common import CHROMIUM, CHROMIUM_ARGS

log = logging.getLogger("abr_chromium")

BENCH_DIR = Path(__file__).resolve().parent
WEB_DIR = BENCH_DIR.parent / "web"
PAGE_FILES = ("abr_viewer.html", "abr_viewer.js")
START_TIMEOUT_MS = 30_000  # page load, offer (ICE gathering), answer applied: each within this
RTP_CLOCK_PER_MS = 90  # video RTP clock, 90 kHz
RTP_WRAP = 1 << 32
MISMATCH_INTERVALS = 0.5  # drawn image this many frame intervals (render time) off the callback's frame: another one
HOST_CANDIDATE = re.compile(r"^a=candidate:\S+ \d+ udp \d+ (\S+) \d+ typ host", re.IGNORECASE | re.MULTILINE)


def host_candidates(sdp: str) -> list[str]:
    """The addresses of the UDP host candidates in an SDP."""
    return HOST_CANDIDATE.findall(sdp)


def check_offer(sdp: str, advertise: str) -> None:
    """Raise unless the offer carries ``advertise`` as a plain host candidate (loopback: not required).

    In a Lab the sender can reach only the viewer namespace's veth address; an mDNS name
    (``*.local``) or a missing candidate would leave ICE without a pair.
    """
    hosts = host_candidates(sdp)
    if advertise in hosts or ipaddress.ip_address(advertise).is_loopback:
        return
    raise RuntimeError(f"Chromium's offer has no host candidate {advertise} (host candidates: {hosts or 'none'})")


def _signed(units: int) -> int:
    """An RTP timestamp difference (mod 2**32) as a signed number."""
    units %= RTP_WRAP
    return units - RTP_WRAP if units >= RTP_WRAP // 2 else units


def pair_frames(samples: Sequence[Sequence[Any]]) -> tuple[list[list[Any]], int]:
    """bench_abr frames ``[wall s, delay ms, frame_no, width, height]`` from the page's samples.

    A sample is ``[presentation wall ms, rtpTimestamp or None, stamp ts_ms, stamp frame_no,
    width, height, ...]``: the time and RTP timestamp describe the callback's frame, the stamp
    the image drawn a little later, sometimes a newer frame.  The sender's RTP timestamp is its
    render time x 90 + an origin, so ``rtp - ts_ms * 90`` is the origin for every sample whose
    image is its own frame (the median: most are); a sample off by half a frame interval (the
    stream's median) or more drew another frame, and its own frame's render time is
    ``ts_ms + offset / 90``; its frame number is the one stamped with that time, else estimated
    from the frame interval.
    Returns (frames, number of samples corrected that way).
    """
    offsets = [None if s[1] is None else (int(s[1]) - int(s[2]) * RTP_CLOCK_PER_MS) % RTP_WRAP for s in samples]
    known = [o for o in offsets if o is not None]
    origin = None
    if known:
        anchor = known[0]
        origin = anchor + statistics.median_low([_signed(o - anchor) for o in known])
    number_at = {int(s[2]): int(s[3]) for s in samples}  # stamp time -> frame number, as drawn
    steps = [(b[2] - a[2]) / (b[3] - a[3]) for a, b in itertools.pairwise(samples) if b[3] > a[3]]
    interval_ms = statistics.median(steps) if steps else 1000 / 30
    frames: list[list[Any]] = []
    corrected = 0
    for s, offset in zip(samples, offsets, strict=True):
        shown_ms, ts_ms, frame_no = float(s[0]), float(s[2]), int(s[3])
        shift_ms = 0.0 if offset is None or origin is None else _signed(offset - origin) / RTP_CLOCK_PER_MS
        if abs(shift_ms) >= MISMATCH_INTERVALS * interval_ms:
            corrected += 1
            ts_ms += shift_ms
            frame_no = number_at.get(round(ts_ms), frame_no + round(shift_ms / interval_ms))
        frames.append([round(shown_ms / 1000, 4), round(shown_ms - ts_ms, 1), frame_no, int(s[4]), int(s[5])])
    frames.sort(key=lambda f: f[0])
    return frames, corrected


def goodput_bins(polls: Sequence[Sequence[Any]], bin_s: float) -> list[list[int]]:
    """Sorted ``[int(t / bin_s), bytes]``: each poll's increase of bytesReceived (retransmissions included).

    A poll is ``[wall s, bytesReceived, retransmittedBytesReceived or None]`` (the last kept
    for reference: it is a part of bytesReceived); the first is the zero baseline taken
    before the stream starts.
    """
    bins: dict[int, int] = {}
    last: int | None = None
    for t, received, _retransmitted in polls:
        total = int(received)
        if last is not None and total > last:
            key = int(float(t) / bin_s)
            bins[key] = bins.get(key, 0) + total - last
        last = total if last is None else max(last, total)
    return [[k, v] for k, v in sorted(bins.items())]


@contextlib.asynccontextmanager
async def page_server() -> AsyncIterator[str]:
    """Serve the viewer page and web/ on 127.0.0.1 (a free port); yields the page's URL."""

    def file_handler(path: Path) -> Callable[[web.Request], Any]:
        async def handler(_request: web.Request) -> web.FileResponse:
            return web.FileResponse(path, headers={"Cache-Control": "no-store"})

        return handler

    app = web.Application()
    for name in PAGE_FILES:
        app.router.add_get(f"/{name}", file_handler(BENCH_DIR / name))
    app.router.add_static("/web/", WEB_DIR)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}/{PAGE_FILES[0]}"
    finally:
        await runner.cleanup()


async def run_chromium_viewer(
    *,
    advertise: str,
    ping_ms: float,
    bin_s: float,
    signals: AsyncIterator[dict[str, Any]],
    emit: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Offer from Chromium, apply the relayed answer, measure until the parent stops; the viewer result."""
    from playwright.async_api import async_playwright  # only this viewer needs Playwright

    profile = Path(tempfile.mkdtemp(prefix="abr-chromium-"))
    try:
        async with contextlib.AsyncExitStack() as stack:
            url = await stack.enter_async_context(page_server())
            pw = await stack.enter_async_context(async_playwright())
            ctx = await pw.chromium.launch_persistent_context(
                str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
            )
            stack.push_async_callback(ctx.close)
            ctx.set_default_timeout(START_TIMEOUT_MS)
            page = ctx.pages[0] if ctx.pages else await ctx.new_page()
            page.on("console", lambda m: log.warning("page console.%s: %s", m.type, m.text)
                    if m.type in ("error", "warning") else None)  # fmt: skip
            page.on("pageerror", lambda exc: log.error("page error: %s", exc))
            first: list[float] = []

            def first_frame(t: float) -> None:
                if not first:
                    first.append(t)
                    emit({"first_frame": round(float(t), 4)})

            await page.expose_function("abrFirstFrame", first_frame)
            await page.goto(url)
            await page.wait_for_function("() => window.abr !== undefined")
            sdp = str(await page.evaluate("(o) => window.abr.start(o)", {"pingMs": ping_ms}))
            check_offer(sdp, advertise)
            hosts = host_candidates(sdp)
            emit({"sig": {"type": "offer", "sdp": sdp}})
            async for sig in signals:
                if sig.get("type") == "answer":
                    await page.evaluate("(sdp) => window.abr.answer(sdp)", sig["sdp"])
                elif sig.get("type") == "error":
                    log.error("sender refused the offer: %s", sig)
            data: dict[str, Any] = await page.evaluate("() => window.abr.finish()")
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    frames, corrected = pair_frames(data["frames"])
    display_gaps = [float(s[6]) for s in data["frames"] if s[6] is not None]
    callback_gaps = [float(s[7]) for s in data["frames"] if len(s) > 7 and s[7] is not None]
    return {
        "frames": frames,
        "unreadable_stamps": int(data["unreadable"]),
        "bins": goodput_bins(data["polls"], bin_s),
        "bin_s": bin_s,
        "pings": data["pings"],
        "pings_unanswered": sorted(data["unanswered"]),
        "viewer": "chromium",
        "display_time": "frame callback",
        "callback_minus_presentation_ms": statistics.median(callback_gaps) if callback_gaps else None,
        "expected_display_minus_presentation_ms": statistics.median(display_gaps) if display_gaps else None,
        "mismatched_frames": corrected,  # samples whose drawn image was another frame, paired by RTP time
        "frame_callbacks": int(data["callbacks"]),
        "host_candidates": hosts,  # of Chromium's offer
        "inbound": data["inbound"],  # Chromium's last inbound-rtp video report (selected keys)
        "clock_offset_ms": data["clockOffsetMs"],  # page: wall clock - (timeOrigin + performance.now())
        "frame_samples": data["frames"],  # the page's raw samples (see abr_viewer.js)
    }
