"""web/playout.js run in Node: the viewer's jitter-buffer floor policy, exact numbers on a fake clock,
and its constants against the node's half of the policy (streamer/abr/playout.py)."""

from __future__ import annotations

from pathlib import Path

from streamer.abr import playout
from streamer.media.peer import PLAYOUT_DELAY_URI
from tests.web.test_calc import run

PLAYOUT = Path(__file__).resolve().parents[2] / "web" / "playout.js"

# drive playoutTarget over (now_ms, jitter_ms) samples; the decisions' (targetMs, changed, reason)
DRIVE = """((samples) => { let st = c.initialPlayout(); return samples.map(([t, j]) => {
  const d = c.playoutTarget(st, j, t); st = d.state; return [d.targetMs, d.changed, d.reason]; }); })"""


def test_the_floor_is_zero_on_a_smooth_path_and_follows_jitter_when_it_needs_a_buffer() -> None:
    r = run({
        "smooth": f"{DRIVE}([[0, 2], [100, 20], [200, null], [300, NaN]])",
        # 21 ms -> 3 x 21 = 63 -> 70 (10 ms steps); 40 ms -> 120; 100 ms -> 300, capped at 250
        "grow": f"{DRIVE}([[0, 3], [1000, 21], [1100, 40], [1200, 100]])",
        # the 40 ms sample holds the floor for 5 s, then the 25 ms one (taken at 2000) leads: 80 ms; then none
        "shrink": f"{DRIVE}([[1000, 40], [2000, 25], [5999, null], [6000, null], [7000, null]])",
        "consts": "[c.JITTER_GROW_MS, c.SHRINK_AFTER_MS, c.MAX_BUFFER_MS, c.PLAYOUT_DELAY_URI]",
    }, PLAYOUT)
    assert r["smooth"] == [[0, False, "smooth"]] * 4
    assert r["grow"] == [[0, False, "smooth"], [70, True, "jitter"], [120, True, "jitter"], [250, True, "max"]]
    assert r["shrink"] == [[120, True, "jitter"], [120, False, "jitter"], [120, False, "jitter"],
                           [80, True, "jitter"], [0, True, "smooth"]]
    # the node relaxes the extension's maximum on the same jitter figure, threshold and window, and
    # never under the highest floor the viewer sets (else Chromium would clamp the floor away)
    grow_ms, shrink_ms, max_floor_ms, uri = r["consts"]
    assert (grow_ms, shrink_ms, uri) == (playout.JITTER_GROW_MS, playout.SHRINK_AFTER_MS, PLAYOUT_DELAY_URI)
    assert max_floor_ms <= playout.RELAXED_MAX_MS


def test_playout_control_sets_the_receiver_floor_only_in_low_mode() -> None:
    r = run({
        # a fake receiver and stats report: the control reads inbound-rtp video jitter (seconds)
        "low": """(() => { const rx = {jitterBufferTarget: null}; const pc = new c.PlayoutControl(rx, 'low');
          const report = (j) => new Map([['a', {type: 'inbound-rtp', kind: 'video', jitter: j}],
                                         ['b', {type: 'inbound-rtp', kind: 'audio', jitter: 1}]]);
          const seen = [rx.jitterBufferTarget];
          pc.observe(report(0.004), 0); seen.push(rx.jitterBufferTarget);
          pc.observe(report(0.030), 100); seen.push(rx.jitterBufferTarget, pc.targetMs, pc.reason);
          return seen; })()""",
        # the node's own jitter is taken out: 25 ms seen, 20 of them the node's -> 15, no buffer
        "node": """(() => { const rx = {jitterBufferTarget: null}; const pc = new c.PlayoutControl(rx, 'low');
          pc.nodeJitterMs = 20;
          pc.observe(new Map([['a', {type: 'inbound-rtp', kind: 'video', jitter: 0.025}]]), 0);
          return [rx.jitterBufferTarget, c.pathJitterMs(25, 20), c.pathJitterMs(10, 20),
                  c.pathJitterMs(null, 1)]; })()""",
        "browser": """(() => { const rx = {jitterBufferTarget: null}; const pc = new c.PlayoutControl(rx, 'browser');
          pc.observe(new Map([['a', {type: 'inbound-rtp', kind: 'video', jitter: 0.05}]]), 0);
          return [rx.jitterBufferTarget, pc.targetMs, pc.reason]; })()""",
        "negotiate": """(() => { let set = null; const t = {
            getHeaderExtensionsToNegotiate: () => [{uri: c.PLAYOUT_DELAY_URI, direction: 'stopped'},
                                                   {uri: 'x', direction: 'sendrecv'}],
            setHeaderExtensionsToNegotiate: (e) => { set = e; } };
          const low = c.negotiatePlayoutDelay(t, 'low'); const a = set;
          c.negotiatePlayoutDelay(t, 'browser');
          return [low, a, set, c.negotiatePlayoutDelay({}, 'low')]; })()""",
    }, PLAYOUT)
    assert r["low"] == [0, 0, 90, 90, "jitter"]
    assert r["browser"] == [None, None, "browser"]
    assert r["node"] == [0, 15, 0, None]
    assert playout.path_jitter_ms(25.0, 20.0) == 15.0 and playout.path_jitter_ms(10.0, 20.0) == 0.0
    low, asked, left_out, unsupported = r["negotiate"]
    assert low is True and unsupported is False
    assert asked == [{"uri": PLAYOUT_DELAY_URI, "direction": "recvonly"}, {"uri": "x", "direction": "sendrecv"}]
    assert left_out[0] == {"uri": PLAYOUT_DELAY_URI, "direction": "stopped"}


# a fake getStats() report for "sync": cumulative audio NetEq (sample-seconds, samples), audio output (the
# same), video
# arrival-to-decoded (s, frames)
SYNC_REPORT = """((a, an, o, on, v, vn) => new Map([
  ['a', {type: 'inbound-rtp', kind: 'audio', jitterBufferDelay: a, jitterBufferEmittedCount: an}],
  ['v', {type: 'inbound-rtp', kind: 'video', totalProcessingDelay: v, framesDecoded: vn}],
  ...(o === null ? [] : [['p', {type: 'media-playout', kind: 'audio', totalPlayoutDelay: o,
                                totalSamplesCount: on}]])]))"""


def test_sync_mode_makes_the_picture_wait_as_long_as_the_sound() -> None:
    r = run({
        "modes": """[c.defaultPlayoutMode(null, null, false), c.defaultPlayoutMode(null, null, true),
          c.defaultPlayoutMode(null, 'sync', true), c.defaultPlayoutMode(null, 'low', false),
          c.defaultPlayoutMode('browser', 'sync', false), c.defaultPlayoutMode('bogus', 'bogus', true)]""",
        # sound 80 + 42 = 122 ms, video 30 ms beyond a floor of 0: wanted 92, half of the way: 46
        "step": """[c.syncTarget({audioMs: 80, outputMs: null, videoMs: 30}, 42, 0),
          c.syncTarget({audioMs: 5, outputMs: 0, videoMs: 60}, 0, 0).targetMs,
          c.syncTarget({audioMs: 900, outputMs: 10, videoMs: 410}, 0, 400).targetMs,
          c.syncTarget({audioMs: null, outputMs: 10, videoMs: 30}, 0, 20)]""",
        # NetEq 80 ms, output 40 ms, video 20 ms beyond its floor: 0 -> 50 -> 75 (wanted 100 each time)
        "control": f"""(() => {{ const rx = {{jitterBufferTarget: null}}; const pc = new c.PlayoutControl(rx, 'sync');
          const r = {SYNC_REPORT}; const seen = [rx.jitterBufferTarget, pc.targetMs, pc.reason];
          pc.observe(r(0, 0, 0, 0, 0, 0), 0);
          pc.observe(r(1920, 24000, 960, 24000, 0.6, 30), 500); seen.push(rx.jitterBufferTarget);
          pc.observe(r(9999, 90000, 9999, 90000, 9, 90), 700); seen.push(rx.jitterBufferTarget);  // under the interval
          pc.observe(r(3840, 48000, 1920, 48000, 2.7, 60), 1000); seen.push(rx.jitterBufferTarget, pc.targetMs);
          pc.observe(r(3840, 48000, 1920, 48000, 2.7, 60), 1500); seen.push(rx.jitterBufferTarget);  // no samples
          return [...seen, pc.sync.last]; }})()""",
        # no media-playout stats: the owner's output latency (40 ms) stands in for them
        "fallback": f"""(() => {{ const rx = {{jitterBufferTarget: null}}; const pc = new c.PlayoutControl(rx, 'sync');
          pc.outputLatencyMs = 40; const r = {SYNC_REPORT};
          pc.observe(r(0, 0, null, 0, 0, 0), 0); pc.observe(r(1920, 24000, null, 0, 0.6, 30), 500);
          return rx.jitterBufferTarget; }})()""",
        "negotiate": """(() => { let set = null; const t = {
            getHeaderExtensionsToNegotiate: () => [{uri: c.PLAYOUT_DELAY_URI, direction: 'recvonly'}],
            setHeaderExtensionsToNegotiate: (e) => { set = e; } };
          c.negotiatePlayoutDelay(t, 'sync'); return set[0].direction; })()""",
    }, PLAYOUT)
    assert r["modes"] == ["sync", "low", "sync", "low", "browser", "low"]
    first, floor_zero, capped, unknown = r["step"]
    assert first == {"targetMs": 46, "wantedMs": 92, "ownMs": 30, "soundMs": 122, "outputMs": 42}
    assert (floor_zero, capped, unknown) == (0, 400, None)
    *floors, last = r["control"]
    assert floors == [0, 0, "sync", 50, 50, 75, 75, 75]
    assert last == {"targetMs": 75, "wantedMs": 100, "ownMs": 20, "soundMs": 120, "outputMs": 40}
    assert r["fallback"] == 50
    assert r["negotiate"] == "stopped"  # with the extension's maximum at 0 Chromium would ignore the floor
