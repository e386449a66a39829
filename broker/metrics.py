"""Prometheus metrics for one broker process (a per-app registry, no globals).

Gauges of live state (sessions by pool and state, queue lengths, seats, per-GPU
telemetry) are refreshed from Redis at scrape time, so every replica reports the
same cluster view; counters and the allocation latency histogram are per process.

Per-GPU gauges (labels pool, host, gpu) come from each host's last heartbeat; a
field the node reported as null (NVML could not read it) is not exported, and a
host whose lease has expired exports no telemetry (its last figures are stale).
``render_broker_gpu_software_encode`` and ``render_broker_gpu_vram_total_bytes``
come from the registration too, and ``render_broker_gpu_sessions`` from the broker's own seat
counts, so they exist for every registered GPU.

Concurrency: ``update_*`` are synchronous (clear, then set) and run on the event
loop, so two scrapes never interleave their updates.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from broker.models import CANDIDATE_TYPES
from broker.protocol import WatchdogCheck
from broker.store.keys import QUEUE_WAIT_BUCKETS_S
from broker.store.live import QueueWaits

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
BYTES_PER_MIB = 1024 * 1024
US_PER_S = 1_000_000.0
GPU_LABELS = ["pool", "host", "gpu"]

# heartbeat field -> (metric name, help, scale to the metric's unit)
GPU_GAUGES: dict[str, tuple[str, str, float]] = {
    "utilization": ("render_broker_gpu_utilization_percent", "GPU utilization, percent", 1.0),
    "vram_used_mb": ("render_broker_gpu_vram_used_bytes", "GPU memory in use, bytes", BYTES_PER_MIB),
    "encoder_utilization": ("render_broker_gpu_encoder_utilization_percent", "NVENC utilization, percent", 1.0),
    "encoder_sessions": ("render_broker_gpu_encoder_sessions", "Active NVENC sessions", 1.0),
    "encoder_fps": ("render_broker_gpu_encoder_fps", "Average fps over active NVENC sessions", 1.0),
    "encoder_latency_us": ("render_broker_gpu_encoder_latency_seconds",
                           "Average NVENC encode latency over active sessions, seconds", 1.0 / US_PER_S),
    "temperature_c": ("render_broker_gpu_temperature_celsius", "GPU temperature, degrees Celsius", 1.0),
    "power_w": ("render_broker_gpu_power_watts", "GPU board power draw, watts", 1.0),
}


# name -> (metric, help, heartbeat field, divisor to the metric's unit); "fps_ratio" is derived
STREAM_QUANTILES: dict[str, tuple[str, str, str, float]] = {
    "fps_ratio": ("render_broker_stream_fps_ratio",
                  "Frames delivered / frames requested, over a pool's live sessions", "fps_ratio", 1.0),
    "encode": ("render_broker_stream_encode_seconds", "Median conversion + encode time per frame, seconds",
               "encode_ms", 1000.0),
    "rtt": ("render_broker_stream_rtt_seconds", "Viewer round-trip time, seconds", "rtt_ms", 1000.0),
    "jitter": ("render_broker_stream_jitter_seconds", "Viewer-reported jitter, seconds", "jitter_ms", 1000.0),
    "loss": ("render_broker_stream_loss_ratio", "Viewer-reported packet loss, 0..1", "loss", 1.0),
    "first_frame": ("render_broker_stream_first_frame_seconds",
                    "Time to first frame: the first viewer offer answered -> the first frame a viewer decoded, "
                    "seconds (sessions whose viewer reports decoded frames)", "first_frame_ms", 1000.0),
}
# the low tail matters for delivered frames, the high tail for times and loss
STREAM_QUANTILE_LABELS: dict[str, tuple[str, ...]] = {
    "fps_ratio": ("0.05", "0.5"), "encode": ("0.5", "0.95"), "rtt": ("0.5", "0.95"), "jitter": ("0.5", "0.95"),
    "loss": ("0.5", "0.95"), "first_frame": ("0.5", "0.95"),
}

# heartbeat field (a node-cumulative count, reset only when the node restarts) -> (counter, help)
HOST_COUNTERS: dict[str, tuple[str, str]] = {
    "freezes_total": ("render_broker_stream_freezes",
                      "Stream freezes (the picture stood still 200 ms or more) of the sessions a node ran, "
                      "counted by the node since it started"),
    "encoder_errors_total": ("render_broker_encoder_errors",
                             "Encoder errors (frames the encoder failed on, encoders that failed to open) of the "
                             "sessions and stream self-tests a node ran, counted by the node since it started"),
    "session_starts_total": ("render_broker_session_starts",
                             "Session starts a node attempted (staged sessions included), counted by the node since "
                             "it started"),
}
# heartbeat field (an object of node-cumulative counts by reason) -> (counter, help); labels pool, host, reason
HOST_REASON_COUNTERS: dict[str, tuple[str, str]] = {
    "session_start_failures_total": ("render_broker_session_start_failures",
                                     "Session starts that failed on a node, by reason (refused, display, encoder, "
                                     "error; ice_failed, dtls_failed: the session's first viewer connection "
                                     "failed), counted by the node since it started"),
}
# heartbeat field (a node-cumulative histogram in ms: {"le", "counts", "sum"}) -> (histogram, help, divisor)
HOST_HISTOGRAMS: dict[str, tuple[str, str, float]] = {
    "glass_to_glass_ms": ("render_broker_stream_glass_to_glass_seconds",
                          "Glass-to-glass latency the viewers of a node's sessions measured (a frame's render "
                          "stamp to its display; web client, built-in game), seconds, since the node started",
                          1000.0),
}


def histogram_buckets(histogram: dict[str, Any], divisor: float) -> tuple[list[tuple[str, float]], float]:
    """A heartbeat histogram ({"le", "counts", "sum"}, validated) as Prometheus' cumulative buckets
    (le in the metric's unit, "+Inf" last) and its sum in that unit."""
    buckets: list[tuple[str, float]] = []
    total = 0
    for bound, n in zip([*histogram["le"], None], histogram["counts"], strict=True):
        total += n
        buckets.append(("+Inf" if bound is None else repr(bound / divisor), float(total)))
    return buckets, histogram["sum"] / divisor


class HostCounters:
    """Counters and histograms a node keeps and reports in each heartbeat, exported per pool and host
    (and reason, for counts by reason) as they stand.

    The node owns the count (monotonic while it runs, reset by a restart: Prometheus' counter
    semantics), so every replica exports the same figure for a host; ``rate()`` over it is the
    host's rate.  A host whose lease expired exports nothing (its last figure is stale).  The host
    label stays even where alerts want a pool's figure: a pool-wide sum would drop when a host
    leaves, which Prometheus would read as a counter reset (a false burst).
    """

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, dict[str, Any]]] = []  # (pool, host, last telemetry)

    def describe(self) -> list[CounterMetricFamily | HistogramMetricFamily]:
        return [*(CounterMetricFamily(name, doc, labels=["pool", "host"]) for name, doc in HOST_COUNTERS.values()),
                *(CounterMetricFamily(name, doc, labels=["pool", "host", "reason"])
                  for name, doc in HOST_REASON_COUNTERS.values()),
                *(HistogramMetricFamily(name, doc, labels=["pool", "host"])
                  for name, doc, _divisor in HOST_HISTOGRAMS.values())]

    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        for field, (name, doc) in HOST_COUNTERS.items():
            family = CounterMetricFamily(name, doc, labels=["pool", "host"])
            for pool, host, tel in self.rows:
                if tel.get(field) is not None:
                    family.add_metric([pool, host], float(tel[field]))
            yield family
        for field, (name, doc) in HOST_REASON_COUNTERS.items():
            family = CounterMetricFamily(name, doc, labels=["pool", "host", "reason"])
            for pool, host, tel in self.rows:
                for reason, n in sorted((tel.get(field) or {}).items()):
                    if n is not None:
                        family.add_metric([pool, host, reason], float(n))
            yield family
        for field, (name, doc, divisor) in HOST_HISTOGRAMS.items():
            hist = HistogramMetricFamily(name, doc, labels=["pool", "host"])
            for pool, host, tel in self.rows:
                if tel.get(field):
                    buckets, total = histogram_buckets(tel[field], divisor)
                    hist.add_metric([pool, host], buckets, total)
            yield hist


QUEUE_WAIT = ("render_broker_queue_wait_seconds",
              "Time from a session request to its seat, seconds (0 when seated at once; sessions that left the "
              "queue unseated are not counted), counted per pool by the seating step in Redis")


class QueueWaitHistogram:
    """The per-pool queue wait histograms the Lua seating step keeps in Redis, exported as they stand.

    Redis owns the counts, so every replica exports the same figure for a pool (aggregate with
    ``max by (pool, le)``, not ``sum``); a Redis that loses its state resets them (a counter reset).
    """

    def __init__(self) -> None:
        self.pools: dict[str, QueueWaits] = {}

    def describe(self) -> list[HistogramMetricFamily]:
        return [HistogramMetricFamily(*QUEUE_WAIT, labels=["pool"])]

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(*QUEUE_WAIT, labels=["pool"])
        for pool, waits in sorted(self.pools.items()):
            running, buckets = 0, []
            for le, n in zip((*QUEUE_WAIT_BUCKETS_S, float("inf")), waits.counts, strict=True):
                running += n
                buckets.append((floatToGoString(le), float(running)))
            family.add_metric([pool], buckets, waits.sum_ms / 1000.0)
        yield family


def stream_value(session: dict[str, Any], field: str) -> float | None:
    """One session's figure for ``field``; ``fps_ratio`` = fps / target fps (None until both are known)."""
    if field == "fps_ratio":
        fps, target = session.get("fps"), session.get("target_fps")
        return None if fps is None or not target else min(float(fps) / float(target), 1.0)
    value = session.get(field)
    return None if value is None else float(value)


def quantile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank quantile of an ascending, non-empty list (q in 0..1)."""
    rank = max(1, -(-int(q * 1000) * len(sorted_values) // 1000))  # ceil(q * n), at least 1
    return sorted_values[min(rank, len(sorted_values)) - 1]


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions = Gauge("render_broker_sessions", "Live sessions by pool and state", ["pool", "state"],
                              registry=r)
        self.queue = Gauge("render_broker_queue_length", "Queued sessions per pool", ["pool"], registry=r)
        self.seats_used = Gauge("render_broker_seats_used", "Seats in use per pool", ["pool"], registry=r)
        self.seats_total = Gauge("render_broker_seats_total", "Seats on up hosts per pool", ["pool"], registry=r)
        self.hosts = Gauge("render_broker_hosts", "Hosts per pool and state", ["pool", "state"], registry=r)
        self.allocation = Histogram("render_broker_allocation_seconds", "Seat-or-queue step latency",
                                    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
                                    registry=r)
        self.http_errors = Counter("render_broker_http_errors_total", "HTTP error responses by status and code",
                                   ["status", "code"], registry=r)
        self.http_requests = Counter("render_broker_http_requests_total", "HTTP requests by method and status",
                                     ["method", "status"], registry=r)
        # Stream health per pool over the live sessions' last heartbeat: quantile labels are a fixed set,
        # never a session id, so the series count follows pools, not sessions.
        self.streams = Gauge("render_broker_streams", "Sessions whose node reports stream stats", ["pool"],
                             registry=r)
        self.stream_paths = Gauge("render_broker_stream_paths", "Streams by how the viewer's media travels "
                                  "(candidate: host, srflx through a NAT, relay through TURN)", ["pool", "candidate"],
                                  registry=r)
        self.stream = {name: Gauge(metric, doc, ["pool", "quantile"], registry=r)
                       for name, (metric, doc, _field, _divisor) in STREAM_QUANTILES.items()}
        self.stream_bitrate = Gauge("render_broker_stream_bits_per_second",
                                    "Video sent to viewers per pool (sum of the sessions' measured send rate)",
                                    ["pool"], registry=r)
        self.host_counters = HostCounters()
        r.register(self.host_counters)
        self.queue_waits = QueueWaitHistogram()
        r.register(self.queue_waits)
        # this process's own: sessions its reaper ended because their node never made them ready
        self.start_timeouts = Counter("render_broker_session_start_timeouts_total",
                                      "Sessions ended start_failed by the broker: their node did not report them "
                                      "running within the start timeout (this replica's reaper)", ["pool"],
                                      registry=r)
        self.gpu = {f: Gauge(name, doc, GPU_LABELS, registry=r) for f, (name, doc, _scale) in GPU_GAUGES.items()}
        self.gpu_vram_total = Gauge("render_broker_gpu_vram_total_bytes",
                                    "GPU memory, bytes (NVML's figure, else the registered size)", GPU_LABELS,
                                    registry=r)
        self.gpu_throttled = Gauge("render_broker_gpu_throttled",
                                   "1 per active NVML clock-event (throttle) reason", [*GPU_LABELS, "reason"],
                                   registry=r)
        self.gpu_sessions = Gauge("render_broker_gpu_sessions",
                                  "Sessions seated on the GPU (staged ones included: each holds a seat and its "
                                  "memory), as the broker's seat counts say", GPU_LABELS, registry=r)
        # The node watchdog's state from each live host's last heartbeat (hosts whose node runs none: no series)
        self.watchdog_tripped = Gauge("render_broker_node_watchdog_tripped",
                                      "1 when the check has failed since the host's node watchdog drained it, 0 "
                                      "for the other checks", ["pool", "host", "check"], registry=r)
        self.watchdog_held = Gauge("render_broker_node_watchdog_held",
                                   "1 while the node watchdog, after repeated trips, holds its host drained until "
                                   "an operator undrains it", ["pool", "host"], registry=r)
        self.gpu_software = Gauge("render_broker_gpu_software_encode",
                                  "1 when the host registered this GPU to encode in software, 0 for NVENC",
                                  GPU_LABELS, registry=r)

    def update_pools(self, pools: list[dict[str, Any]]) -> None:
        for g in (self.sessions, self.queue, self.seats_used, self.seats_total, self.hosts):
            g.clear()
        for p in pools:
            name = p["name"]
            for state, n in p["sessions"].items():
                self.sessions.labels(name, state).set(n)
            for state, n in p["hosts"].items():
                self.hosts.labels(name, state).set(n)
            self.queue.labels(name).set(p["queue_length"])
            self.seats_used.labels(name).set(p["seats_used"])
            self.seats_total.labels(name).set(p["seats_total"])
            self.start_timeouts.labels(name)  # every pool's series from 0, so rate() sees its first timeout

    def start_timed_out(self, pool: str) -> None:
        """The reaper ended a session of ``pool`` because its node never made it ready."""
        self.start_timeouts.labels(pool).inc()

    def update_queue_waits(self, waits: dict[str, QueueWaits]) -> None:
        self.queue_waits.pools = dict(waits)

    def update_streams(self, hosts: list[dict[str, Any]]) -> None:
        """Per-pool stream quantiles from the sessions in live hosts' last heartbeats."""
        for g in (self.streams, self.stream_paths, self.stream_bitrate, *self.stream.values()):
            g.clear()
        by_pool: dict[str, list[dict[str, Any]]] = {}
        self.host_counters.rows = []
        for h in hosts:
            if h.get("alive") is False:
                continue  # an expired lease's figures are stale
            self.host_counters.rows.append((h.get("pool") or "", h["id"], h.get("telemetry") or {}))
            by_pool.setdefault(h.get("pool") or "", []).extend((h.get("telemetry") or {}).get("sessions", []))
        for pool, sessions in by_pool.items():
            self.streams.labels(pool).set(len(sessions))
            for kind in CANDIDATE_TYPES:
                self.stream_paths.labels(pool, kind).set(sum(1 for s in sessions if s.get("candidate") == kind))
            self.stream_bitrate.labels(pool).set(sum(s.get("bitrate_bps") or 0 for s in sessions))
            for name, (_metric, _doc, field, divisor) in STREAM_QUANTILES.items():
                values = sorted(v / divisor for v in (stream_value(s, field) for s in sessions) if v is not None)
                if not values:
                    continue
                for q in STREAM_QUANTILE_LABELS[name]:
                    self.stream[name].labels(pool, q).set(quantile(values, float(q)))

    def update_watchdogs(self, hosts: list[dict[str, Any]]) -> None:
        """Each live host's watchdog report (its last heartbeat's ``watchdog``): every check 0/1, and held."""
        for g in (self.watchdog_tripped, self.watchdog_held):
            g.clear()
        for h in hosts:
            report = (h.get("telemetry") or {}).get("watchdog") if h.get("alive") else None
            if report is None:
                continue
            pool, tripped = h.get("pool") or "", set(report.get("tripped") or ())
            for check in WatchdogCheck:
                self.watchdog_tripped.labels(pool, h["id"], check.value).set(1 if check in tripped else 0)
            self.watchdog_held.labels(pool, h["id"]).set(1 if report.get("held") else 0)

    def update_gpus(self, hosts: list[dict[str, Any]]) -> None:
        """Per-GPU gauges from host records (``LiveStore.get_hosts``): registration and last telemetry."""
        gauges = [*self.gpu.values(), self.gpu_vram_total, self.gpu_throttled, self.gpu_software, self.gpu_sessions]
        for g in gauges:
            g.clear()
        for h in hosts:
            pool, host = h.get("pool") or "", h["id"]
            tel = (h.get("telemetry") or {}) if h.get("alive") else {}
            by_index = {t["index"]: t for t in tel.get("gpus", [])}
            for gpu in h.get("gpus", []):
                labels = (pool, host, str(gpu["index"]))
                self.gpu_software.labels(*labels).set(1 if gpu.get("encode") == "software" else 0)
                self.gpu_sessions.labels(*labels).set(gpu.get("used", 0))
                t = by_index.get(gpu["index"], {})
                total_mb = t.get("vram_total_mb")
                self.gpu_vram_total.labels(*labels).set((gpu["vram_mb"] if total_mb is None else total_mb)
                                                        * BYTES_PER_MIB)
                for f, (_name, _doc, scale) in GPU_GAUGES.items():
                    if t.get(f) is not None:
                        self.gpu[f].labels(*labels).set(t[f] * scale)
                for reason in t.get("throttle_reasons") or []:
                    self.gpu_throttled.labels(*labels, reason).set(1)

    def render(self) -> bytes:
        return generate_latest(self.registry)
