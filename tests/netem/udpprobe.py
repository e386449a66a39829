"""UDP probe for measuring a Lab path: a paced sender and a recording receiver.

Job: run (by file path, via ``Lab.popen``) inside a lab namespace.
  send: ``udpprobe.py send --dst IP --port P --rate-bps R --size B --count N``
        paces N datagrams of B payload bytes at R bit/s counted on IP packets (B + 28 bytes),
        each carrying (seq, CLOCK_MONOTONIC send time in ns); prints {"sent": N, "elapsed_s": s}.
  recv: ``udpprobe.py recv --port P [--idle S] [--max-s S]``
        prints ``READY`` once bound, then records every datagram until ``--idle`` seconds pass
        without one after the first (or ``--max-s`` in all) and prints one JSON line:
        {"packets", "bytes", "records": [[seq, send_ns, recv_ns], ...]}.
CLOCK_MONOTONIC is shared by all network namespaces, so recv_ns - send_ns is the one-way
delay.  Concurrency model: one thread, blocking socket with a timeout.  Invariant: the
sender never sends ahead of its schedule; when it falls behind it catches up in a burst.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import time

HEADER = struct.Struct("!QQ")  # seq, send time (CLOCK_MONOTONIC ns)
IP_UDP_OVERHEAD_BYTES = 28  # IPv4 (20) + UDP (8) headers
RCVBUF_BYTES = 8 * 1024 * 1024
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)  # Linux value; Python does not export it


def send(dst: str, port: int, rate_bps: int, size: int, count: int) -> dict[str, float]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, RCVBUF_BYTES)
    interval_s = (size + IP_UDP_OVERHEAD_BYTES) * 8 / rate_bps
    padding = b"\0" * (size - HEADER.size)
    start_s = time.monotonic()
    seq = 0
    while seq < count:
        now_s = time.monotonic()
        due = min(int((now_s - start_s) / interval_s) + 1, count)
        while seq < due:
            try:
                sock.sendto(HEADER.pack(seq, time.monotonic_ns()) + padding, (dst, port))
            except (BlockingIOError, ConnectionRefusedError):
                pass  # a full local buffer or an ICMP error: the datagram is simply lost
            seq += 1
        if seq < count:
            time.sleep(max(start_s + seq * interval_s - time.monotonic(), 0.0))
    return {"sent": count, "elapsed_s": time.monotonic() - start_s}


def recv(port: int, idle_s: float, max_s: float) -> dict[str, object]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF_BYTES)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
    sock.bind(("0.0.0.0", port))
    print("READY", flush=True)
    records: list[list[int]] = []
    nbytes = 0
    deadline_s = time.monotonic() + max_s
    sock.settimeout(max_s)
    while time.monotonic() < deadline_s:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            break
        recv_ns = time.monotonic_ns()
        if len(data) >= HEADER.size:
            seq, send_ns = HEADER.unpack_from(data)
            records.append([seq, send_ns, recv_ns])
        nbytes += len(data)
        sock.settimeout(max(min(idle_s, deadline_s - time.monotonic()), 0.001))
    return {"packets": len(records), "bytes": nbytes, "records": records}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    p_send = sub.add_parser("send")
    p_send.add_argument("--dst", required=True)
    p_send.add_argument("--port", type=int, required=True)
    p_send.add_argument("--rate-bps", type=int, required=True)
    p_send.add_argument("--size", type=int, default=1200)
    p_send.add_argument("--count", type=int, required=True)
    p_recv = sub.add_parser("recv")
    p_recv.add_argument("--port", type=int, required=True)
    p_recv.add_argument("--idle", type=float, default=0.5)
    p_recv.add_argument("--max-s", type=float, default=30.0)
    args = parser.parse_args(argv)
    if args.mode == "send":
        result: dict[str, object] = dict(send(args.dst, args.port, args.rate_bps, args.size, args.count))
    else:
        result = recv(args.port, args.idle, args.max_s)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
