"""Prometheus metrics for one broker process (a per-app registry, no globals).

Gauges of live state (sessions by pool and state, queue lengths, seats) are
refreshed from Redis at scrape time, so every replica reports the same cluster
view; counters and the allocation latency histogram are per process.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


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
        self.stream = Gauge("render_broker_stream", "Per-session stream stats reported by nodes",
                            ["pool", "session", "stat"], registry=r)

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

    def update_streams(self, hosts: list[dict[str, Any]]) -> None:
        self.stream.clear()
        for h in hosts:
            for s in (h.get("telemetry") or {}).get("sessions", []):
                for stat in ("fps", "encode_ms", "bitrate_bps", "target_bps", "rtt_ms", "jitter_ms", "loss",
                             "keyframes"):
                    if s.get(stat) is not None:
                        self.stream.labels(h["pool"], s["id"], stat).set(s[stat])

    def render(self) -> bytes:
        return generate_latest(self.registry)
