"""Adaptive-bitrate benchmark: three senders side by side on an emulated network (issue #6).

Run: ``sudo .venv/bin/python bench/bench_abr.py`` as root (``--quick`` shortens every phase
to a third; ``--scenarios a c`` and ``--senders ours stock`` narrow a run; ``--viewer aiortc``
or ``chromium`` picks the receiving peer, by default Chromium where it can run, else aiortc
(the reason printed); ``--no-lab`` runs on 127.0.0.1 without shaping; ``--json FILE`` keeps
the raw per-run data, for ours every controller decision; ``--verbose`` has the peers log at
INFO into the child logs).  The full run takes about 5 minutes on a 2-core machine (3 scenarios
x 3 senders, one after the other, each with a fresh Lab).

Network: each run gets a fresh ``tests.netem.lab.Lab`` (node and viewer namespaces joined
through a router namespace: htb rate with a 100 ms drop-tail queue, nftables random loss,
a user-space NFQUEUE delay/jitter emulator), conditions changed live at scripted times.
Where no Lab can be made (``unavailable_reason()``: not root, no namespaces...) the reason is
printed and every run falls back to 127.0.0.1 without shaping: utilization, settle and
reclaim are then "n/a (unshaped)" -- never a made-up capacity.

Scenarios (capacity = downlink rate; uplink unshaped):
  (a) steps: 8 Mbps for 15 s -> 2 Mbps for 15 s -> 8 Mbps for 15 s, 10 ms each way;
  (b) jitter: 5 Mbps, 30 ms +- 15 ms each way (uniform, no reordering), 20 s;
  (c) loss: 8 Mbps, 2 % random loss on the downlink, 10 ms each way, 20 s.
Senders (``bench/abr_peers.py``; same picture: the built-in game at 960x540@30 with a
moving block of fresh noise, stamped with frame number and render time; H.264):
  ours  = the node's ``SessionRuntime`` with its controller and ladder (game profile);
  fixed = the same runtime pinned at ``--fixed-bps`` (6 Mbps);
  stock = aiortc encoding raw frames itself, its encoder following REMB (0.5-3 Mbps).
Viewers (``--viewer``; in the viewer namespace; the header line names the one used):
  aiortc   = an aiortc peer (``abr_peers.py viewer``) decoding in Python; a frame is "shown"
             when aiortc's receiver hands it out decoded (it holds each frame until the next
             starts, ~33 ms).  Its jitter buffer recovers slowly from loss (stalls of
             seconds), which weighs on the freeze and settle figures;
  chromium = headless Debian Chromium, the product's browser (``abr_peers.py viewer --browser
             chromium``: ``bench/abr_chromium.py`` drives ``bench/abr_viewer.js`` through
             Playwright), connecting like web/peer.js, probe answers included.  A frame is
             "shown" when requestVideoFrameCallback runs for it (after jitter buffer, decode
             and render scheduling; not its ``presentationTime``: delays read from it drifted
             below zero in some runs, see abr_chromium.py); its stamp is read from the drawn
             video (web/stamp.js) and paired with the callback's own frame by RTP timestamp.
             Goodput: inbound-rtp ``bytesReceived`` (retransmissions are a part of it) every 100 ms.

Measures, per scenario x sender (definitions; t = wall time, phase = a constant-capacity
span of the script, the first phase starting when the viewer decodes its first frame):
  * goodput: video RTP payload bytes the viewer received (retransmissions included),
    in 100 ms bins; "1 s goodput" is the sum over the 10 bins up to t;
  * utilization = goodput bits / (capacity x seconds) over each phase's steady window,
    its second half; "overall" pools the steady windows of all phases.  RTP payload
    excludes IP/UDP/SRTP/RTP headers (about 4 % at 1,200-byte packets), so 100 % is out
    of reach by those 4 %;
  * frame delay = the wall time the viewer shows the frame (see Viewers) - the frame's stamp
    (render) time, over every decoded frame of the run: render + encode + pacing + path +
    jitter buffer + decode (aiortc: plus its hold of ~33 ms);
  * freezes: gaps > 200 ms between consecutive decoded frames with a readable stamp (also
    a gap from the last frame to the end of the run; a frame whose stamp does not read
    back is a corrupt picture -- decoded without a lost reference -- and counted apart);
    "after settling" counts those starting after their phase's settle point, or every
    freeze of a phase that never settled;
  * settle time of a phase: the earliest s (0, or the end of a bad event) such that for the
    ``MIN_SETTLED_S`` (2 s) from phase start + s
    (a) the bottleneck drops no packet from its queue (read from the router's counters
    every ``LINK_SAMPLE_S``; an interval with a drop is unsettled up to its end): a
    sender above the capacity fills the 100 ms queue, and the queue overflows -- the
    link's own verdict, the same for every sender and counting retransmissions, (b)
    every frame decoded has delay <= bound, bound = downlink one-way delay + jitter +
    150 ms (frame interval, encode/decode, one aiortc hold, part of the 100 ms queue),
    and (c) no freeze is in progress; "never" if no such 2 s fit in the phase.  The target
    (< 1 s) applies to phases entered by a capacity drop.  What happens later is counted,
    not hidden: freezes after settling (target 0) and queue overflows after settling (a
    sender probing for more capacity overshoots now and then; reported);
  * reclaim time of a phase entered by a capacity rise: from its start until the 1 s
    goodput first reaches 85 % of the capacity ("never" if it does not in the phase);
  * input RTT: a ping on the input data channel every 50 ms, echoed at once by the
    sender's ``InputRouter``; p95 over pings sent during the run, unanswered ones counted
    as infinitely late; "above path" = input p95 - the path's own RTT p95, measured with
    40 UDP echo probes across the Lab under the first phase's conditions before the
    peers start (idle path: no queue).
Targets (issue #6): utilization >= 85 %, settle < 1 s after a drop, no freezes after
settling, input RTT p95 < path RTT + 100 ms.  Each row says ok / MISS per sender; a number
that could not be measured says why.  Figures on a loaded 2-core machine are noisy: the
sender, the viewer's decoder and the delay emulator share the two cores.

Matrix mode (issue #22; ``--matrix``, or ``--cells PATTERN...`` for a subset): capacity 2/4/8 Mbps x
bottleneck queue 30/60/100 ms x path RTT 20/60/120 ms, each cell warming up at twice its capacity and
then measured at it (a settle after a drop in every cell), plus ``burst`` (loss bursts) and ``step``
(10 -> 3 -> 10 Mbps); see ``cells()``.  The fixed sender runs at ``FIXED_SHARE`` of the cell's lowest
capacity.  Per cell and sender: freezes after settling per minute, settle after the drop, frame delay
p95, utilization, input RTT p95 over the path's, overflows after settling, with the issue's goals
(``GOAL_*``: <= 1 freeze/min, settle < 1 s, p95 within 15 ms of the best sender, >= 80 %, path + 50 ms).

Size: about 900 lines in one script on purpose: it is run as root on its own (namespaces),
and its scenario table, the three senders' set-up and the figures' printing belong together;
the peers live in ``bench/abr_peers.py`` and the Chromium viewer in ``bench/abr_chromium.py``.
"""

from __future__ import annotations

import argparse
import fnmatch
import itertools
import json
import math
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import PEERS_LOG_LEVEL_ENV, chromium_unavailable  # noqa: E402
from tests.netem.lab import Lab, Link, unavailable_reason  # noqa: E402

PEERS = ROOT / "bench" / "abr_peers.py"
SENDERS = ("ours", "fixed", "stock")
VIEWERS = {  # --viewer: the viewer child's extra arguments (abr_peers.py viewer) and what the header says
    "chromium": (["--browser", "chromium"], "headless Chromium (/usr/bin/chromium via Playwright)"),
    "aiortc": ([], "aiortc peer (abr_peers.py run_viewer)"),
}
FREEZE_MS = 200.0  # a gap between decoded frames longer than this is a freeze
DELAY_MARGIN_MS = 150.0  # settle bound = one-way delay + jitter + this
LINK_SAMPLE_S = 0.25  # the bottleneck's counters are read this often
MIN_SETTLED_S = 2.0  # a phase counts as settled only if it stays settled this long
RECLAIM_FRACTION = 0.85  # reclaim: 1 s goodput >= this x capacity
TARGET_UTILIZATION = 0.85
TARGET_SETTLE_S = 1.0
TARGET_INPUT_OVER_PATH_MS = 100.0
STARTUP_TIMEOUT_S = 40.0  # sender ready + first decoded frame
RESULT_TIMEOUT_S = 30.0
ECHO_PORT = 9977
BURST_TICK_S = 0.02  # a phase with loss bursts checks its burst clock this often
LOG_DIR = Path(tempfile.gettempdir()) / "bench_abr_logs"


@dataclass(frozen=True)
class Phase:
    duration_s: float
    down: Link
    up: Link = Link()
    # bursty loss: every ``period_s`` (first at period_s / 2), ``length_s`` of ``loss_percent``
    # random loss on the downlink, then back to ``down.loss_percent`` (set live on the Lab)
    bursts: tuple[float, float, float] | None = None

    def burst_loss(self, elapsed_s: float) -> float:
        """The downlink loss (percent) in force ``elapsed_s`` into the phase."""
        if self.bursts is None:
            return self.down.loss_percent
        period_s, length_s, loss = self.bursts
        into = (elapsed_s - period_s / 2) % period_s
        return loss if elapsed_s >= period_s / 2 and into < length_s else self.down.loss_percent


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    phases: tuple[Phase, ...]


def scenarios(scale: float) -> dict[str, Scenario]:
    """The three scenarios of issue #6; ``scale`` multiplies every phase duration."""
    base = Link(delay_ms=10.0)

    def s(seconds: float) -> float:
        return round(seconds * scale, 1)

    def down(rate_bps: int, **kw: Any) -> Link:
        return Link(rate_bps=rate_bps, **{"delay_ms": 10.0, **kw})

    return {
        "a": Scenario(
            "a",
            f"(a) steps 8 -> 2 -> 8 Mbps, {s(15):g} s each, 10 ms each way",
            tuple(Phase(s(15), down(rate), base) for rate in (8_000_000, 2_000_000, 8_000_000)),
        ),
        "b": Scenario(
            "b",
            f"(b) 5 Mbps, 30 ms +- 15 ms jitter each way, {s(20):g} s",
            (Phase(s(20), down(5_000_000, delay_ms=30.0, jitter_ms=15.0), Link(delay_ms=30.0, jitter_ms=15.0)),),
        ),
        "c": Scenario(
            "c",
            f"(c) 8 Mbps, 2 % random loss on the downlink, 10 ms each way, {s(20):g} s",
            (Phase(s(20), down(8_000_000, loss_percent=2.0), base),),
        ),
    }


# --- running one scenario x sender -------------------------------------------------------------------


class Child:
    """A child program with a JSON-lines stdout read by a thread; stderr to a log file."""

    def __init__(self, name: str, popen: Callable[..., subprocess.Popen[Any]], argv: Sequence[str]) -> None:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.log_path = LOG_DIR / f"{name}.log"
        self._log: IO[bytes] = open(self.log_path, "wb")  # closed in close()
        self.proc = popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log)
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, name=f"read-{name}", daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                self.lines.put(json.loads(raw))
            except json.JSONDecodeError:
                self.lines.put({"junk": raw[:200].decode(errors="replace")})
        self.lines.put(None)

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def stderr_tail(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-1500:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self._log.close()


class Relay:
    """Drains both children's lines, relays ``sig`` messages between them, keeps the rest."""

    def __init__(self, sender: Child, viewer: Child) -> None:
        self.sender, self.viewer = sender, viewer
        self.events: list[tuple[str, dict[str, Any]]] = []

    def pump(self, until: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not until():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}; sender log:\n{self.sender.stderr_tail()}\n"
                                   f"viewer log:\n{self.viewer.stderr_tail()}")  # fmt: skip
            moved = False
            for child, other in ((self.sender, self.viewer), (self.viewer, self.sender)):
                try:
                    msg = child.lines.get_nowait()
                except queue.Empty:
                    continue
                moved = True
                if msg is None:
                    if self.has(child.name, "result") is not None:
                        continue  # it exited after its result (the other may still be closing down)
                    raise RuntimeError(f"{child.name} exited ({child.proc.wait()}):\n{child.stderr_tail()}")
                if "sig" in msg:
                    other.send(msg)
                else:
                    self.events.append((child.name, msg))
            if not moved:
                time.sleep(0.01)

    def has(self, name: str, key: str) -> dict[str, Any] | None:
        return next((m for n, m in self.events if n == name and key in m), None)


@dataclass
class RunData:
    """Raw data of one scenario x sender run (all times wall clock, seconds)."""

    scenario: str
    sender: str
    shaped: bool
    phases: list[dict[str, Any]]  # start, end, capacity_bps, delay_ms, jitter_ms, loss_percent
    path_rtt_ms: list[float]
    viewer: dict[str, Any]
    sender_result: dict[str, Any]
    link: list[list[Any]] = field(default_factory=list)  # [t, downlink forwarded bytes, queue drops, loss drops]
    error: str | None = None


def run_one(
    scenario: Scenario, sender: str, *, use_lab: bool, fixed_bps: int = 6_000_000, viewer: str = "aiortc"
) -> RunData:
    """Run ``sender`` through ``scenario`` (a fresh Lab, or loopback) to ``viewer`` and return the raw data."""
    py = sys.executable
    first = scenario.phases[0]
    lab = Lab(first.down, first.up) if use_lab else None
    try:
        if lab is not None:
            node_ip, viewer_ip = lab.node_ip, lab.viewer_ip

            def popen_node(argv: Sequence[str], **kw: Any) -> subprocess.Popen[Any]:
                return lab.popen("node", argv, **kw)

            def popen_viewer(argv: Sequence[str], **kw: Any) -> subprocess.Popen[Any]:
                return lab.popen("viewer", argv, **kw)

            path_rtt = measure_path_rtt(popen_node, popen_viewer, node_ip)
        else:
            node_ip = viewer_ip = "127.0.0.1"
            popen_node = popen_viewer = _popen_local
            path_rtt = []
        tag = f"{scenario.key}-{sender}"
        sender_argv = [py, str(PEERS), "sender", "--mode", sender, "--advertise", node_ip,
                       "--fixed-bps", str(fixed_bps)]  # fmt: skip
        s_child = Child(f"{tag}-sender", popen_node, sender_argv)
        v_child: Child | None = None
        try:
            relay_ready = Relay(s_child, s_child)
            relay_ready.pump(lambda: relay_ready.has(s_child.name, "ready") is not None, STARTUP_TIMEOUT_S,
                             "the sender to start")  # fmt: skip
            viewer_argv = [py, str(PEERS), "viewer", "--advertise", viewer_ip, *VIEWERS[viewer][0]]
            v_child = Child(f"{tag}-viewer", popen_viewer, viewer_argv)
            relay = Relay(s_child, v_child)
            relay.pump(lambda: relay.has(v_child.name, "first_frame") is not None, STARTUP_TIMEOUT_S,
                       "the first decoded frame")  # fmt: skip
            phases: list[dict[str, Any]] = []
            link_samples: list[list[Any]] = []
            start = time.time()
            for i, phase in enumerate(scenario.phases):
                if i > 0 and lab is not None:
                    lab.set_downlink(phase.down)
                    lab.set_uplink(phase.up)
                phase_start = time.time() if i > 0 else start
                end = phase_start + phase.duration_s
                phases.append({"start": phase_start, "end": end, "capacity_bps": phase.down.rate_bps if lab else None,
                               "delay_ms": phase.down.delay_ms, "jitter_ms": phase.down.jitter_ms,
                               "loss_percent": phase.down.loss_percent, "queue_ms": phase.down.queue_ms,
                               "bursts": []})  # fmt: skip
                loss_now = phase.down.loss_percent
                next_sample = 0.0
                while time.time() < end:
                    loss = phase.burst_loss(time.time() - phase_start)
                    if lab is not None and loss != loss_now:  # a loss burst starts or ends
                        lab.set_downlink(replace(phase.down, loss_percent=loss))
                        phases[-1]["bursts"].append([time.time(), loss])
                        loss_now = loss
                    if lab is not None and time.time() >= next_sample:
                        c = lab.counters()["downlink"]
                        link_samples.append([time.time(), c["forwarded_bytes"], c["queue_dropped_packets"],
                                             c["loss_dropped_packets"]])  # fmt: skip
                        next_sample = time.time() + LINK_SAMPLE_S
                    stop_at = min(end, time.time() + (BURST_TICK_S if phase.bursts else LINK_SAMPLE_S))
                    relay.pump(lambda: time.time() >= stop_at, 5.0, "the phase")  # noqa: B023 (called at once)
            v_child.send({"cmd": "stop"})
            s_child.send({"cmd": "stop"})
            relay.pump(
                lambda: relay.has(v_child.name, "result") is not None and relay.has(s_child.name, "result") is not None,
                RESULT_TIMEOUT_S,
                "results",
            )
            viewer_result = relay.has(v_child.name, "result")
            sender_result = relay.has(s_child.name, "result")
            assert viewer_result is not None and sender_result is not None
            return RunData(scenario.key, sender, lab is not None, phases, path_rtt, viewer_result["result"],
                           sender_result["result"], link_samples)  # fmt: skip
        finally:
            if v_child is not None:
                v_child.close()
            s_child.close()
    finally:
        if lab is not None:
            lab.close()


def _popen_local(argv: Sequence[str], **kw: Any) -> subprocess.Popen[Any]:
    return subprocess.Popen(list(argv), start_new_session=True, **kw)


def measure_path_rtt(
    popen_node: Callable[..., subprocess.Popen[Any]], popen_viewer: Callable[..., subprocess.Popen[Any]], node_ip: str
) -> list[float]:
    """Round trips (ms) of 40 UDP probes viewer -> node echo -> viewer across the idle Lab path."""
    py = sys.executable
    echo = popen_node([py, str(PEERS), "echo", "--port", str(ECHO_PORT)], stdin=subprocess.PIPE,
                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        assert echo.stdout is not None
        echo.stdout.readline()  # {"ready": true}
        probe = popen_viewer([py, str(PEERS), "rttprobe", "--dst", node_ip, "--port", str(ECHO_PORT)],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
        out, _ = probe.communicate(timeout=60)
        lines = [json.loads(line) for line in out.splitlines() if line.strip()]
        return list(lines[-1]["result"]["rtts_ms"]) if lines else []
    finally:
        if echo.stdin is not None:
            echo.stdin.close()
        try:
            echo.wait(timeout=5)
        except subprocess.TimeoutExpired:
            echo.kill()


# --- analysis -------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values.

    Not ``encoder.stats.percentile``: unanswered pings count as ``inf``, and interpolating
    between two of them gives nan; a nearest rank is a sample, so it stays ``inf``.
    """
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class Metrics:
    """What the table prints for one scenario x sender (None: not measurable, see ``notes``)."""

    utilization: float | None
    phase_utilization: list[float | None]
    goodput_mbps: list[float]  # steady-window goodput per phase
    delay_p50_ms: float | None
    delay_p95_ms: float | None
    freezes: int
    freezes_after_settle: int
    overflows_after_settle: int | None  # bottleneck-queue overflows (per link sample) after settling
    settle_s: list[float | None]  # per phase
    drop_phases: list[int]
    reclaim_s: list[float | None]  # per phase (rise phases only, else None)
    rise_phases: list[int]
    input_p95_ms: float | None
    path_rtt_p95_ms: float | None
    pings: int
    unanswered: int
    send_mbps: list[float | None]  # mean sender send rate per steady window
    target_mbps: list[float | None]  # mean sender target per steady window
    frames: int
    unreadable: int  # decoded frames whose stamp did not read back (corrupt picture: a lost reference)
    notes: list[str] = field(default_factory=list)


def analyse(run: RunData) -> Metrics:
    """Turn one run's raw data into the table's figures (definitions: module docstring)."""
    phases = run.phases
    t0, t_end = phases[0]["start"], phases[-1]["end"]
    bin_s = float(run.viewer["bin_s"])
    bins = {int(k): int(v) for k, v in run.viewer["bins"]}
    frames = [f for f in run.viewer["frames"] if t0 <= f[0] <= t_end]
    samples = run.sender_result["samples"]

    def goodput_bps(a: float, b: float) -> float:
        """Goodput between wall times a and b (whole bins inside)."""
        lo, hi = math.ceil(a / bin_s), math.floor(b / bin_s)
        if hi <= lo:
            return 0.0
        return sum(bins.get(k, 0) for k in range(lo, hi)) * 8 / ((hi - lo) * bin_s)

    # utilization and per-phase steady figures
    phase_util: list[float | None] = []
    goodputs, sends, targets = [], [], []
    pooled_bits = pooled_capacity = 0.0
    for p in phases:
        a, b = (p["start"] + p["end"]) / 2, p["end"]
        g = goodput_bps(a, b)
        goodputs.append(g / 1e6)
        in_window = [s for s in samples if a <= s[0] <= b]
        send_vals = [s[2] for s in in_window if s[2] is not None]
        target_vals = [s[1] for s in in_window if s[1] is not None]
        sends.append(sum(send_vals) / len(send_vals) / 1e6 if send_vals else None)
        targets.append(sum(target_vals) / len(target_vals) / 1e6 if target_vals else None)
        cap = p["capacity_bps"]
        if cap:
            phase_util.append(g / cap)
            pooled_bits += g * (b - a)
            pooled_capacity += cap * (b - a)
        else:
            phase_util.append(None)
    utilization = pooled_bits / pooled_capacity if pooled_capacity else None

    delays = [f[1] for f in frames]

    # freezes: gaps between decoded frames (from the run start, up to the run end)
    arrivals = [t0, *[f[0] for f in frames], t_end]
    gaps = [(a, b) for a, b in itertools.pairwise(arrivals) if (b - a) * 1000 > FREEZE_MS]

    # settle per phase: the first moment from which a clean stretch of MIN_SETTLED_S follows
    overflows = [(a[0], b[0]) for a, b in itertools.pairwise(run.link) if b[2] > a[2]]  # queue drops in (a, b]
    settle: list[float | None] = []
    overflows_after = 0
    for p in phases:
        bound = p["delay_ms"] + p["jitter_ms"] + DELAY_MARGIN_MS
        bad = [(a, b) for a, b in gaps if a < p["end"] and b > p["start"]]  # nothing arrives: not settled
        bad += [(f[0], f[0]) for f in frames if p["start"] <= f[0] <= p["end"] and f[1] > bound]
        if p["capacity_bps"]:  # the bottleneck queue overflowed: the sender was above the capacity
            bad += [(a, b) for a, b in overflows if p["start"] < b <= p["end"]]
        settled_at: float | None = None
        for t in sorted({p["start"], *(b for _, b in bad)}):
            if t + MIN_SETTLED_S > p["end"]:
                break
            if not any(a <= t + MIN_SETTLED_S and b > t for a, b in bad):
                settled_at = t
                break
        settle.append(settled_at - p["start"] if settled_at is not None else None)
        if p["capacity_bps"]:
            late = [a for a, b in overflows if p["start"] < b <= p["end"] and (settled_at is None or a >= settled_at)]
            overflows_after += len(late)

    after = 0
    for a, _b in gaps:
        for p, st in zip(phases, settle, strict=True):
            if p["start"] <= a < p["end"] and (st is None or a >= p["start"] + st):
                after += 1
                break

    # drops and rises
    drop_phases = [i for i in range(1, len(phases))
                   if (phases[i]["capacity_bps"] or 0) < (phases[i - 1]["capacity_bps"] or 0)]  # fmt: skip
    rise_phases = [i for i in range(1, len(phases))
                   if (phases[i]["capacity_bps"] or 0) > (phases[i - 1]["capacity_bps"] or 0)]  # fmt: skip
    reclaim: list[float | None] = [None] * len(phases)
    for i in rise_phases:
        p = phases[i]
        need = RECLAIM_FRACTION * p["capacity_bps"]
        t = p["start"] + 1.0
        while t <= p["end"]:
            if goodput_bps(t - 1.0, t) >= need:
                reclaim[i] = t - p["start"]
                break
            t += bin_s

    # input round trips
    pings = [pg for pg in run.viewer["pings"] if t0 <= pg[0] <= t_end]
    unanswered = [t for t in run.viewer["pings_unanswered"] if t0 <= t <= t_end - 2.0]  # the last 2 s may be in flight
    rtts = [pg[1] for pg in pings] + [math.inf] * len(unanswered)
    notes = []
    if not run.shaped:
        notes.append("unshaped loopback: no capacity, utilization/settle/reclaim n/a")
    return Metrics(
        utilization=utilization,
        phase_utilization=phase_util,
        goodput_mbps=goodputs,
        delay_p50_ms=percentile(delays, 50),
        delay_p95_ms=percentile(delays, 95),
        freezes=len(gaps),
        freezes_after_settle=after,
        overflows_after_settle=overflows_after if run.shaped else None,
        settle_s=settle,
        drop_phases=drop_phases,
        reclaim_s=reclaim,
        rise_phases=rise_phases,
        input_p95_ms=percentile(rtts, 95),
        path_rtt_p95_ms=percentile(run.path_rtt_ms, 95),
        pings=len(pings) + len(unanswered),
        unanswered=len(unanswered),
        send_mbps=sends,
        target_mbps=targets,
        frames=len(frames),
        unreadable=int(run.viewer["unreadable_stamps"]),
        notes=notes,
    )


# --- the table --------------------------------------------------------------------------------------------


def _f(value: float | None, fmt: str, none: str = "n/a") -> str:
    if value is None:
        return none
    if math.isinf(value):
        return "inf"
    return format(value, fmt)


def _verdict(ok: bool | None) -> str:
    return "" if ok is None else (" ok" if ok else " MISS")


def table(scenario: Scenario, metrics: dict[str, Metrics], shaped: bool) -> str:
    """One scenario's table: a row per measure, a column per sender, the target last."""
    names = list(metrics)
    rows: list[tuple[str, list[str], str]] = []
    caps = [p.down.rate_bps for p in scenario.phases]

    def row(label: str, cells: Callable[[Metrics], str], target: str = "") -> None:
        rows.append((label, [cells(metrics[n]) for n in names], target))

    def util(m: Metrics) -> str:
        if m.utilization is None:
            return "n/a (unshaped)"
        return f"{m.utilization * 100:.0f} %{_verdict(m.utilization >= TARGET_UTILIZATION)}"

    row("utilization (steady windows)", util, ">= 85 %")
    if len(caps) > 1:
        label = "  per phase " + "/".join(f"{(c or 0) / 1e6:g}" for c in caps) + " Mbps"
        row(label, lambda m: "/".join(_f(None if u is None else u * 100, ".0f") for u in m.phase_utilization) + " %")
    row("goodput Mbps (steady, per phase)", lambda m: "/".join(f"{g:.2f}" for g in m.goodput_mbps))
    row("sender target Mbps (steady)", lambda m: "/".join(_f(t, ".2f") for t in m.target_mbps))
    row("sender send rate Mbps (steady)", lambda m: "/".join(_f(s, ".2f") for s in m.send_mbps))
    row("frame delay p50 / p95 ms", lambda m: f"{_f(m.delay_p50_ms, '.0f')} / {_f(m.delay_p95_ms, '.0f')}")
    row("frames decoded / unreadable stamp", lambda m: f"{m.frames} / {m.unreadable}")
    row("freezes > 200 ms (total)", lambda m: str(m.freezes))

    def after(m: Metrics) -> str:
        if not shaped:
            return f"{m.freezes_after_settle}"
        unsettled = [i for i, s in enumerate(m.settle_s) if s is None]
        text = f"{m.freezes_after_settle}{_verdict(m.freezes_after_settle == 0 and not unsettled)}"
        return text + (f" (phase {','.join(str(i + 1) for i in unsettled)} never settled)" if unsettled else "")

    row("freezes after settling", after, "0")
    row("queue overflows after settling", lambda m: _f(m.overflows_after_settle, "d", "n/a"), "(reported)")
    row("settle per phase s", lambda m: "/".join(_f(s, ".1f", "never") for s in m.settle_s))
    if any(metrics[n].drop_phases for n in names):

        def settle_drop(m: Metrics) -> str:
            vals = [m.settle_s[i] for i in m.drop_phases]
            ok = all(v is not None and v < TARGET_SETTLE_S for v in vals)
            return "/".join(_f(v, ".1f", "never") for v in vals) + _verdict(ok if shaped else None)

        row("settle after the drop s", settle_drop, "< 1 s")
    if any(metrics[n].rise_phases for n in names):
        row("reclaim after the rise s", lambda m: "/".join(_f(m.reclaim_s[i], ".1f", "never") for i in m.rise_phases),
            "(reported)")  # fmt: skip

    def rtt(m: Metrics) -> str:
        if m.input_p95_ms is None:
            return "n/a"
        base = m.path_rtt_p95_ms if m.path_rtt_p95_ms is not None else 0.0
        over = m.input_p95_ms - base
        return f"{_f(m.input_p95_ms, '.0f')} (+{_f(over, '.0f')}){_verdict(over < TARGET_INPUT_OVER_PATH_MS)}"

    row("input RTT p95 ms (above path)", rtt, "< path + 100 ms")
    row("input pings / unanswered", lambda m: f"{m.pings} / {m.unanswered}")
    path = next((m.path_rtt_p95_ms for m in metrics.values() if m.path_rtt_p95_ms is not None), None)
    label_w = max(len(r[0]) for r in rows)
    col_w = max(12, *(len(c) for r in rows for c in r[1]))
    lines = [scenario.title + (f"; path RTT p95 {path:.1f} ms (idle UDP probe)" if path is not None else "")]
    lines.append(f"{'':{label_w}}  " + "  ".join(f"{n:<{col_w}}" for n in names) + "  target")
    for label, cells, target in rows:
        lines.append(f"{label:<{label_w}}  " + "  ".join(f"{c:<{col_w}}" for c in cells) + f"  {target}")
    for n in names:
        for note in metrics[n].notes:
            lines.append(f"  note ({n}): {note}")
    return "\n".join(lines)


# --- matrix mode (issue #22) ------------------------------------------------------------------------------

MATRIX_CAPACITIES_BPS = (2_000_000, 4_000_000, 8_000_000)
MATRIX_QUEUES_MS = (30, 60, 100)
MATRIX_RTTS_MS = (20, 60, 120)  # path round trip: half of it added each way
WARM_FACTOR = 2  # a grid cell opens at this x its capacity, then drops to it (settle after a drop, per cell)
FIXED_SHARE = 0.8  # the fixed sender runs at this share of the cell's lowest capacity (it is told the path)
# goals of issue #22
GOAL_FREEZES_PER_MIN = 1.0
GOAL_SETTLE_S = 1.0
GOAL_DELAY_OVER_BEST_MS = 15.0
GOAL_UTILIZATION = 0.80
GOAL_INPUT_OVER_PATH_MS = 50.0


@dataclass(frozen=True)
class Cell:
    """One matrix cell: a scenario, the fixed sender's rate, and the first phase its figures cover."""

    key: str
    scenario: Scenario
    fixed_bps: int
    measure_from: int


def cells(quick: bool = False) -> dict[str, Cell]:
    """The matrix: capacity x bottleneck queue x RTT (``2M-q30-r20`` ...), plus ``burst`` and ``step``.

    A grid cell opens at ``WARM_FACTOR`` x its capacity for the warm-up, then drops to its capacity
    for the measured phase (the figures cover that phase).  ``burst``: 4 Mbps, 60 ms queue, 60 ms
    RTT, 150 ms of 50 % loss every 2.5 s in the measured phase.  ``step``: 10 -> 3 -> 10 Mbps, 60 ms
    queue, 40 ms RTT (the independent tester's), every phase measured.
    """
    warm_s, measure_s, step_s = (4.0, 10.0, 6.0) if quick else (6.0, 24.0, 15.0)
    out: dict[str, Cell] = {}

    def grid(key: str, cap: int, queue_ms: int, rtt_ms: int, bursts: tuple[float, float, float] | None = None) -> Cell:
        way = Link(delay_ms=rtt_ms / 2)
        down = Link(rate_bps=cap, delay_ms=rtt_ms / 2, queue_ms=queue_ms)
        title = f"{key}: {cap / 1e6:g} Mbps, {queue_ms} ms queue, {rtt_ms} ms RTT"
        if bursts is not None:
            title += f", {bursts[1] * 1000:g} ms of {bursts[2]:g} % loss every {bursts[0]:g} s"
        phases = (Phase(warm_s, replace(down, rate_bps=cap * WARM_FACTOR), way), Phase(measure_s, down, way, bursts))
        return Cell(key, Scenario(key, title + f" (after {warm_s:g} s at {WARM_FACTOR} x)", phases),
                    int(cap * FIXED_SHARE), 1)  # fmt: skip

    for cap, queue_ms, rtt_ms in itertools.product(MATRIX_CAPACITIES_BPS, MATRIX_QUEUES_MS, MATRIX_RTTS_MS):
        key = f"{cap // 1_000_000}M-q{queue_ms}-r{rtt_ms}"
        out[key] = grid(key, cap, queue_ms, rtt_ms)
    out["burst"] = grid("burst", 4_000_000, 60, 60, (2.5, 0.15, 50.0))
    way = Link(delay_ms=20.0)
    rates = (10_000_000, 3_000_000, 10_000_000)
    steps = tuple(Phase(step_s, Link(rate_bps=r, delay_ms=20.0, queue_ms=60), way) for r in rates)
    out["step"] = Cell("step", Scenario("step", f"step: 10 -> 3 -> 10 Mbps, {step_s:g} s each, 60 ms queue, 40 ms RTT",
                                        steps), int(3_000_000 * FIXED_SHARE), 0)  # fmt: skip
    return out


def select_cells(all_cells: dict[str, Cell], patterns: Sequence[str]) -> list[Cell]:
    """The cells whose key matches any of ``patterns`` (fnmatch: ``2M-*``, ``*-q30-*``), in matrix order.

    Raises ValueError naming a pattern that matches no cell.
    """
    chosen: list[Cell] = []
    for pattern in patterns:
        hits = [c for k, c in all_cells.items() if fnmatch.fnmatchcase(k, pattern)]
        if not hits:
            raise ValueError(f"--cells: {pattern!r} matches no cell (e.g. 4M-q60-r60, 2M-*, burst, step)")
        chosen += [c for c in hits if c not in chosen]
    order = list(all_cells.values())
    return sorted(chosen, key=order.index)


@dataclass
class CellFigures:
    """One sender's figures in one cell (None: not measurable)."""

    freezes_per_min: float | None  # freezes > 200 ms after settling, per minute of settled time
    freezes_after: int
    settled_min: float  # minutes counted for freezes_per_min
    settle_s: list[float | None]  # per drop phase among the measured ones
    delay_p95_ms: float | None
    utilization: float | None
    input_p95_ms: float | None
    path_rtt_p95_ms: float | None
    overflows_after: int | None


def cell_figures(run: RunData, measure_from: int) -> CellFigures:
    """The cell's figures from one run: every figure over the phases from ``measure_from`` on.

    Settle is each phase's own (``analyse``); a phase that never settled counts whole, all its
    freezes "after settling".  A phase entered by a drop (lower capacity than the phase before,
    including the warm-up) reports its settle time.
    """
    whole = analyse(run)
    measured = RunData(run.scenario, run.sender, run.shaped, run.phases[measure_from:], run.path_rtt_ms,
                       run.viewer, run.sender_result, run.link, run.error)  # fmt: skip
    part = analyse(measured)
    settled_s = 0.0
    for p, st in zip(measured.phases, whole.settle_s[measure_from:], strict=True):
        settled_s += p["end"] - p["start"] - (st or 0.0)
    per_min = part.freezes_after_settle / (settled_s / 60) if settled_s > 0 else None
    drops = [i for i in whole.drop_phases if i >= measure_from]
    return CellFigures(
        freezes_per_min=per_min,
        freezes_after=part.freezes_after_settle,
        settled_min=settled_s / 60,
        settle_s=[whole.settle_s[i] for i in drops],
        delay_p95_ms=part.delay_p95_ms,
        utilization=part.utilization,
        input_p95_ms=part.input_p95_ms,
        path_rtt_p95_ms=part.path_rtt_p95_ms,
        overflows_after=part.overflows_after_settle,
    )


def cell_table(cell: Cell, figures: dict[str, CellFigures], shaped: bool) -> str:
    """One cell: a row per sender, the goals' verdicts beside each figure, and the cell's verdict for ours."""
    best = min((f.delay_p95_ms for f in figures.values() if f.delay_p95_ms is not None), default=None)
    path = next((f.path_rtt_p95_ms for f in figures.values() if f.path_rtt_p95_ms is not None), None)
    head = cell.scenario.title + (f"; path RTT p95 {path:.1f} ms" if path is not None else "")
    cols = ("sender", "freezes/min after settle", "settle after drop s", "delay p95 ms", "utilization",
            "input p95 ms (over path)", "overflows")  # fmt: skip
    rows: list[list[str]] = []
    for name, f in figures.items():
        fpm = "n/a" if f.freezes_per_min is None else (
            f"{f.freezes_per_min:.1f} ({f.freezes_after} in {f.settled_min * 60:.0f} s)"
            f"{_verdict(f.freezes_per_min <= GOAL_FREEZES_PER_MIN)}")  # fmt: skip
        settle = "/".join(_f(v, ".1f", "never") for v in f.settle_s) or "-"
        if f.settle_s and shaped:
            settle += _verdict(all(v is not None and v < GOAL_SETTLE_S for v in f.settle_s))
        delay = _f(f.delay_p95_ms, ".0f")
        if f.delay_p95_ms is not None and best is not None:
            delay += _verdict(f.delay_p95_ms <= best + GOAL_DELAY_OVER_BEST_MS)
        util = "n/a"
        if f.utilization is not None:
            util = f"{f.utilization * 100:.0f} %{_verdict(f.utilization >= GOAL_UTILIZATION)}"
        inp = "n/a"
        if f.input_p95_ms is not None:
            over = f.input_p95_ms - (path or 0.0)
            inp = f"{_f(f.input_p95_ms, '.0f')} (+{_f(over, '.0f')}){_verdict(over < GOAL_INPUT_OVER_PATH_MS)}"
        rows.append([name, fpm, settle, delay, util, inp, _f(f.overflows_after, "d")])
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    lines = [head, "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    lines.append("goals: <= 1 freeze/min after settling, settle < 1 s after a drop, delay p95 <= best + 15 ms, "
                 "utilization >= 80 %, input p95 < path + 50 ms")  # fmt: skip
    lines.append("overflows: bottleneck-queue drops (per 0.25 s link sample) after settling, reported")
    return "\n".join(lines)


def run_matrix(args: argparse.Namespace, use_lab: bool, viewer: str) -> int:
    """``--matrix``: every selected cell x sender, one cell table each; returns the failed-run count."""
    chosen = select_cells(cells(args.quick), args.cells or ["*"])
    print(f"matrix: {len(chosen)} cell(s) x {len(args.senders)} sender(s): {' '.join(c.key for c in chosen)}")
    failures = 0
    raw: list[dict[str, Any]] = []
    for cell in chosen:
        figures: dict[str, CellFigures] = {}
        for sender in args.senders:
            print(f"running {cell.key} with {sender} ...", file=sys.stderr, flush=True)
            try:
                run = run_one(cell.scenario, sender, use_lab=use_lab, fixed_bps=cell.fixed_bps, viewer=viewer)
            except Exception as exc:  # boundary: one failed run must not hide the others
                failures += 1
                print(f"  {sender}: run failed: {exc}", file=sys.stderr, flush=True)
                continue
            raw.append(run.__dict__)
            figures[sender] = cell_figures(run, cell.measure_from)
        if figures:
            print()
            print(cell_table(cell, figures, use_lab))
            sys.stdout.flush()
    if args.json:
        args.json.write_text(json.dumps(raw))
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="every phase a third as long (noisier)")
    parser.add_argument("--scenarios", nargs="+", choices=("a", "b", "c"), default=["a", "b", "c"])
    parser.add_argument("--senders", nargs="+", choices=SENDERS, default=list(SENDERS))
    parser.add_argument("--no-lab", action="store_true", help="loopback without shaping, even where a Lab works")
    parser.add_argument("--fixed-bps", type=int, default=6_000_000, help="bitrate of the fixed sender")
    parser.add_argument("--viewer", choices=list(VIEWERS), help="the receiving peer (default: chromium, if it can run)")
    parser.add_argument("--json", type=Path, help="write the raw per-run data here")
    parser.add_argument(
        "--matrix",
        action="store_true",
        help="the matrix of issue #22: capacity x queue x RTT, bursty loss, a step (see cells())",
    )
    parser.add_argument("--cells", nargs="+", metavar="PATTERN",
                        help="matrix cells to run (fnmatch on keys such as 4M-q60-r60, 2M-*, burst, step)")  # fmt: skip
    parser.add_argument(
        "--verbose", action="store_true", help=f"the peers log at INFO (stall keyframes, signalling) into {LOG_DIR}"
    )
    args = parser.parse_args(argv)
    if args.verbose:
        os.environ[PEERS_LOG_LEVEL_ENV] = "INFO"  # the children inherit it
    # SIGTERM unwinds like Ctrl-C: every open Lab (namespaces, emulator, peers) is closed on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))

    reason = "--no-lab given" if args.no_lab else unavailable_reason()
    use_lab = reason is None
    if not use_lab:
        print(f"network lab unavailable ({reason}): running on 127.0.0.1 without shaping")
    why_not = None if args.viewer else chromium_unavailable()
    viewer = args.viewer or ("aiortc" if why_not else "chromium")
    print(f"viewer: {VIEWERS[viewer][1]}" + (f" (chromium unavailable: {why_not})" if why_not else ""))
    if args.matrix or args.cells:
        try:
            failures = run_matrix(args, use_lab, viewer)
        except ValueError as exc:  # a --cells pattern that matches nothing
            parser.error(str(exc))
        print(f"\nchild logs: {LOG_DIR}" + (f"; {failures} run(s) failed" if failures else ""))
        return 1 if failures else 0
    chosen = scenarios(1 / 3 if args.quick else 1.0)
    raw: list[dict[str, Any]] = []
    failures = 0
    for key in args.scenarios:
        scenario = chosen[key]
        metrics: dict[str, Metrics] = {}
        for sender in args.senders:
            print(f"running {scenario.title} with {sender} ...", file=sys.stderr, flush=True)
            try:
                run = run_one(scenario, sender, use_lab=use_lab, fixed_bps=args.fixed_bps, viewer=viewer)
            except Exception as exc:  # boundary: one failed run must not hide the others
                failures += 1
                print(f"  {sender}: run failed: {exc}", file=sys.stderr, flush=True)
                continue
            raw.append(run.__dict__)
            metrics[sender] = analyse(run)
        if metrics:
            print()
            print(table(scenario, metrics, use_lab))
            sys.stdout.flush()
    if args.json:
        args.json.write_text(json.dumps(raw))
    print(f"\nchild logs: {LOG_DIR}" + (f"; {failures} run(s) failed" if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
