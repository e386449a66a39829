"""The node's own health: event-loop lag, the watchdog's state between heartbeats, and ``/healthz``.

Job: the thin effectful side of ``streamer.node.watchdog`` (which is pure).  ``NodeHealth``
- measures how late the node's event loop runs a 100 ms timer (``run_lag_monitor``, a task),
- feeds the watchdog one ``Sample`` per heartbeat (``step``) and returns its decision for the agent
  to apply (drain/undrain through the broker), logging the reason,
- reports the watchdog's state in each heartbeat (``heartbeat_report``: the checks tripped, whether it
  holds the drain for an operator) and hears the host's state back (``host_state``): a host the
  watchdog drained that the broker says is up was undrained by an operator (or the drain request
  never landed), so the watchdog starts afresh (``watchdog.released``) and drains again if still sick,
- serves ``GET /healthz`` on ``NODE_HEALTH_PORT`` for Kubernetes probes: 200 while the node is
  registered and heartbeats reach the broker, 503 otherwise, with the watchdog's state as JSON.

Concurrency model: everything runs on the agent's event loop; no locks needed.
Invariants: the watchdog state only changes in ``step``; the lag figure handed to a sample is the
worst lag since the previous sample (then reset).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web

from streamer.node.watchdog import Decision, Limits, Sample, WatchdogState, decide, released

log = logging.getLogger(__name__)

LAG_TICK_S: Final = 0.1  # the lag monitor's timer period


@dataclass
class HeartbeatStatus:
    ok: bool = False  # the last heartbeat reached the broker
    at_ms: int | None = None


class NodeHealth:
    """Watchdog state, loop lag and the health endpoint of one node (see module docstring)."""

    def __init__(self, limits: Limits, enabled: bool = True) -> None:
        self.limits = limits
        self.enabled = enabled
        self.state = WatchdogState()
        self.last_decision = Decision("none", "")
        self.worst_lag_ms = 0.0
        self.session_failures = 0  # sessions that failed to start or whose capture/encoder gave up
        self.selftest_failure = ""  # why the latest stream self-test failed ("" = passed or not run)
        self.selftest: dict[str, Any] | None = None  # the latest self-test report, for /healthz
        self.heartbeat = HeartbeatStatus()
        self.registered = False

    async def run_lag_monitor(self) -> None:
        """Forever: how late a 100 ms timer fires is how late the loop serves everything else."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + LAG_TICK_S
            await asyncio.sleep(LAG_TICK_S)
            self.worst_lag_ms = max(self.worst_lag_ms, (loop.time() - due) * 1000.0)

    def step(self, gpus: Sequence[dict[str, Any]], sessions: int, now_ms: int, encoder_errors: int = 0) -> Decision:
        """One watchdog decision from this heartbeat's figures (the lag window restarts);
        ``encoder_errors``: the node's cumulative count."""
        sample = Sample(gpus=gpus, sessions=sessions, session_failures=self.session_failures,
                        loop_lag_ms=self.worst_lag_ms, selftest_failure=self.selftest_failure,
                        encoder_errors=encoder_errors)
        self.worst_lag_ms = 0.0
        if not self.enabled:
            return Decision("none", "")
        decision, self.state = decide(self.state, sample, now_ms, self.limits)
        if decision.action != "none":
            self.last_decision = decision
            log.warning("watchdog: %s: %s", decision.action, decision.reason)
        return decision

    def heartbeat_report(self) -> dict[str, Any] | None:
        """The heartbeat's ``watchdog`` field (None while the watchdog is off)."""
        if not self.enabled:
            return None
        return {"tripped": sorted(self.state.tripped), "held": self.state.held}

    def host_state(self, state: str | None) -> None:
        """The broker's word on this host's state (a heartbeat reply): up while the watchdog holds it drained
        means an operator undrained it, or the drain never reached the broker."""
        if state == "up" and self.state.drained:
            log.warning("watchdog: the broker has this host up while the watchdog drained it (%s): an operator "
                        "undrained it or the drain was lost; the watchdog starts afresh",
                        ", ".join(sorted(self.state.tripped)) or "no check")
            self.state = released(self.state)

    def beat(self, ok: bool) -> None:
        self.heartbeat = HeartbeatStatus(ok, int(time.time() * 1000))

    def report(self) -> dict[str, Any]:
        return {
            "registered": self.registered,
            "heartbeat_ok": self.heartbeat.ok,
            "heartbeat_at_ms": self.heartbeat.at_ms,
            "watchdog": {"enabled": self.enabled, "drained": self.state.drained, "held": self.state.held,
                         "last_action": self.last_decision.action, "last_reason": self.last_decision.reason,
                         "trips": len(self.state.trips_ms), "tripped": sorted(self.state.tripped)},
            "selftest": self.selftest,
        }

    async def healthz(self, _request: web.Request) -> web.Response:
        body = self.report()
        healthy = self.registered and self.heartbeat.ok
        return web.json_response({"status": "ok" if healthy else "unhealthy", **body}, status=200 if healthy else 503)

    async def serve(self, host: str, port: int) -> web.AppRunner:
        """Start ``/healthz`` on ``host:port``; the caller cleans the runner up."""
        app = web.Application()
        app.router.add_get("/healthz", self.healthz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        log.info("health endpoint on http://%s:%d/healthz", host, port)
        return runner
