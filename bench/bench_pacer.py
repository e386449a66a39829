"""CPU cost of the send pacer: packets/s through ``PacedTransport`` against sending directly.

Feeds 30 fps frames of 1,200-byte packets at a video target (default 8 Mbps: about 830 packets/s)
through ``streamer.media.pacedtransport.PacedTransport`` to a transport that only counts, for
``--seconds``, and then the same frames straight to that transport.  Prints the process CPU time
per packet and per second of each, the pacer's mean and max queue wait, and the load average.
Run under ``flock /tmp/cpu-lock`` on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from streamer.media.pacedtransport import PacedTransport
from streamer.media.pacer import PacingQueue

PACKET = 1_200


class CountingTransport:
    state = "connected"

    def __init__(self) -> None:
        self.packets = 0

    async def _send_rtp(self, data: bytes) -> None:
        self.packets += 1


async def run(target_bps: int, seconds: float, paced: bool) -> tuple[float, int, PacingQueue[bytes]]:
    inner = CountingTransport()
    queue: PacingQueue[bytes] = PacingQueue(target_bps)
    sender: PacedTransport | CountingTransport = PacedTransport(inner, queue) if paced else inner
    per_frame = max(1, round(target_bps / 30 / 8 / PACKET))
    data = b"\x90\x60" + bytes(PACKET - 2)  # RTP version 2, payload type 96: not RTCP
    start_cpu, start = time.process_time(), time.monotonic()
    frame = 0
    while time.monotonic() - start < seconds:
        for _ in range(per_frame):
            await sender._send_rtp(data)
        frame += 1
        await asyncio.sleep(max(0.0, start + frame / 30 - time.monotonic()))
    await asyncio.sleep(0.1)  # the pacer's tail
    cpu = time.process_time() - start_cpu
    if isinstance(sender, PacedTransport):
        sender.close()
    return cpu, inner.packets, queue


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target-bps", type=int, nargs="+", default=[2_000_000, 8_000_000, 25_000_000])
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("target Mbps | packets/s | direct CPU us/packet (% core) | paced CPU us/packet (% core)"
          " | pacer wait mean/max ms")
    for target in args.target_bps:
        d_cpu, d_packets, _ = asyncio.run(run(target, args.seconds, paced=False))
        p_cpu, p_packets, queue = asyncio.run(run(target, args.seconds, paced=True))
        c = queue.counters
        print(
            f"{target / 1e6:11.1f} | {p_packets / args.seconds:9.0f} | "
            f"{d_cpu / d_packets * 1e6:8.1f} ({d_cpu / args.seconds * 100:4.1f} %) | "
            f"{p_cpu / p_packets * 1e6:8.1f} ({p_cpu / args.seconds * 100:4.1f} %) | "
            f"{c.wait_ms_total / max(1, c.packets):.1f}/{c.max_wait_ms:.1f}"
        )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
