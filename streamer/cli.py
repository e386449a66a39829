"""``render-node``: run the node agent, print this machine's encoder probe table, check what the host will do,
or run the stream self-test."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from rbcommon.realtime import forbid_realtime


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Run as root, SVT-AV1 (an AV1 stream, the encoder probe) puts its threads on SCHED_FIFO 99 and the processes
    # started after (Xvfb, the session's app) inherit it: a busy one starves the host.  None of it may.
    realtime_notes = forbid_realtime()
    # CUDA ordinals (NVENC's gpu option) in NVML's PCI bus order, so "GPU 3" is one card everywhere
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    if argv[:1] == ["encoders"]:
        from encoder.cli import main as encoders_main

        return encoders_main(argv[1:])
    if argv[:1] == ["doctor"]:
        from streamer.node.doctor import main as doctor_main
        from streamer.node.settings import NodeSettings

        return doctor_main(argv[1:], software_seats=NodeSettings().seats)
    if argv[:1] == ["selftest"]:
        from streamer.node.selftest import main as selftest_main

        return selftest_main(argv[1:])
    from streamer.node.settings import load

    settings = load(argv, os.environ)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for note in realtime_notes:
        logging.getLogger("streamer.node").warning("real-time scheduling not fully ruled out: %s", note)
    if not settings.node_token:
        print("render-node: --node-token (or NODE_NODE_TOKEN) is required", file=sys.stderr)
        return 2
    return asyncio.run(_run(settings))


async def _run(settings: object) -> int:
    from streamer.node.agent import NodeAgent

    try:
        agent = NodeAgent(settings)  # type: ignore[arg-type]
    except ValueError as exc:  # a bad setting (e.g. an unknown session_user): one line, no traceback
        print(f"render-node: {exc}", file=sys.stderr)
        return 2
    refusal = agent.runtime_config.app_refusal
    if refusal:
        logging.getLogger("streamer.node").warning("desktop and game-command sessions will fail: %s", refusal)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, agent.stop)  # Ctrl-C: now
    loop.add_signal_handler(signal.SIGTERM, agent.request_shutdown)  # rolling restart: drain, warn, wait
    await agent.run()
    return 0
