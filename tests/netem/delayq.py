"""User-space delay/jitter emulator fed by nftables NFQUEUE (the kernel here has no netem).

Job: run inside the router namespace of a ``tests.netem.lab.Lab``, bind one NFQUEUE per
direction (``--queue down=N`` / ``--queue up=M``) and give each queued packet its ACCEPT
verdict ``delay_ms +- jitter_ms`` (uniform) after it arrived.  By default a packet is never
released before the previous packet of the same direction (jitter without reordering, as
real path jitter comes from queueing); ``--reorder`` lets jitter reorder packets.

Control protocol, one JSON object a line:
  stdin  ``{"id": 1, "dir": "down", "delay_ms": 40.0, "jitter_ms": 5.0}``  -> applies live
  stdin  ``{"id": 2, "stats": true}``                                      -> counts per dir
  stdout ``{"ready": true}`` once both queues are bound (before any rule feeds them),
         ``{"id": 1, "ok": true}`` after the change is in force, ``{"id": 1, "error": "..."}``.
EOF on stdin (the Lab closing the pipe) stops the program; held packets are then dropped
by the kernel when the queue is unbound.

Concurrency model: one thread, one ``selectors`` loop over the two queue sockets and stdin.
The loop's timeout is the next release time; after every wake-up it drains the readable
queues (``run(block=False)`` reads until EAGAIN) and releases every due packet.

Invariants: per direction, release times are non-decreasing unless ``--reorder``; a packet
that is due when it arrives (zero delay, nothing held before it) gets its verdict inside
the callback, without touching the heap, so 0 ms adds only the user-space round trip.
Metadata only is copied to user space (COPY_META): the payload stays in the kernel.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import selectors
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from netfilterqueue import COPY_META, NetfilterQueue, Packet

# Packets the kernel may hold for one queue: 25 Mbit/s of 1200-byte packets is ~2,600 pps,
# so 20,000 covers several seconds of delay at that rate.
QUEUE_MAX_LEN = 20_000
# Netlink receive buffer per queue, bytes (bursts arrive faster than one Python wake-up).
SOCK_RCVBUF_BYTES = 8 * 1024 * 1024


@dataclass
class Direction:
    """One direction's settings, held packets (a heap of (release_s, seq, packet)) and counts."""

    name: str
    reorder: bool
    delay_s: float = 0.0
    jitter_s: float = 0.0
    last_release_s: float = 0.0  # monotonic seconds of the latest scheduled release
    held: list[tuple[float, int, Packet]] = field(default_factory=list)
    seq: int = 0
    seen: int = 0
    released: int = 0

    def release_time(self, now_s: float) -> float:
        """When a packet arriving at ``now_s`` (monotonic seconds) may leave."""
        delay_s = self.delay_s
        if self.jitter_s > 0:
            delay_s += random.uniform(-self.jitter_s, self.jitter_s)
        due_s = now_s + max(delay_s, 0.0)
        if not self.reorder:
            due_s = max(due_s, self.last_release_s)
        self.last_release_s = max(self.last_release_s, due_s)
        return due_s

    def on_packet(self, packet: Packet) -> None:
        """NFQUEUE callback: accept now when due and nothing is held, else hold it."""
        self.seen += 1
        now_s = time.monotonic()
        due_s = self.release_time(now_s)
        if due_s <= now_s and not self.held:
            packet.accept()
            self.released += 1
            return
        # No retain(): a later verdict needs only the packet id, and COPY_META copied no payload.
        self.seq += 1
        heapq.heappush(self.held, (due_s, self.seq, packet))

    def release_due(self, now_s: float) -> None:
        """Give ACCEPT to every held packet due at ``now_s``."""
        held = self.held
        while held and held[0][0] <= now_s:
            heapq.heappop(held)[2].accept()
            self.released += 1

    def next_due(self) -> float | None:
        return self.held[0][0] if self.held else None


def handle_command(line: str, directions: dict[str, Direction]) -> dict[str, Any]:
    """Apply one control line; return the reply object."""
    try:
        msg = json.loads(line)
    except ValueError as exc:
        return {"id": None, "error": f"bad json: {exc}"}
    reply: dict[str, Any] = {"id": msg.get("id")}
    if msg.get("stats"):
        reply["stats"] = {
            name: {"seen": d.seen, "released": d.released, "held": len(d.held)} for name, d in directions.items()
        }
        reply["ok"] = True
        return reply
    direction = directions.get(msg.get("dir", ""))
    if direction is None:
        reply["error"] = f"unknown direction {msg.get('dir')!r}"
        return reply
    delay_ms = float(msg.get("delay_ms", 0.0))
    jitter_ms = float(msg.get("jitter_ms", 0.0))
    if delay_ms < 0 or jitter_ms < 0:
        reply["error"] = "delay_ms and jitter_ms must be >= 0"
        return reply
    direction.delay_s = delay_ms / 1000.0
    direction.jitter_s = jitter_ms / 1000.0
    reply["ok"] = True
    return reply


def parse_queues(specs: list[str]) -> dict[str, int]:
    queues: dict[str, int] = {}
    for spec in specs:
        name, _, num = spec.partition("=")
        queues[name] = int(num)
    return queues


def run(queues: dict[str, int], reorder: bool) -> int:
    directions = {name: Direction(name=name, reorder=reorder) for name in queues}
    nfqs: list[NetfilterQueue] = []
    sel = selectors.DefaultSelector()
    for name, num in queues.items():
        nfq = NetfilterQueue()
        nfq.bind(num, directions[name].on_packet, max_len=QUEUE_MAX_LEN, mode=COPY_META, sock_len=SOCK_RCVBUF_BYTES)
        nfqs.append(nfq)
        sel.register(nfq.get_fd(), selectors.EVENT_READ, nfq)
    stdin_fd = sys.stdin.fileno()
    os.set_blocking(stdin_fd, False)
    sel.register(stdin_fd, selectors.EVENT_READ, None)
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    pending = b""
    try:
        while True:
            dues = [d for d in (x.next_due() for x in directions.values()) if d is not None]
            timeout_s = max(min(dues) - time.monotonic(), 0.0) if dues else None
            for key, _ in sel.select(timeout_s):
                if key.data is not None:
                    key.data.run(block=False)
                    continue
                chunk = os.read(stdin_fd, 65536)
                if not chunk:
                    return 0
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    if line.strip():
                        out.write(json.dumps(handle_command(line.decode(), directions)) + "\n")
                        out.flush()
            now_s = time.monotonic()
            for d in directions.values():
                d.release_due(now_s)
    finally:
        for nfq in nfqs:
            nfq.unbind()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--queue", action="append", required=True, help="direction=queue_num, e.g. down=0")
    parser.add_argument("--reorder", action="store_true", help="let jitter reorder packets")
    args = parser.parse_args(argv)
    return run(parse_queues(args.queue), args.reorder)


if __name__ == "__main__":
    sys.exit(main())
