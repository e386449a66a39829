"""Helpers the benchmark scripts share: machine CPU readings, plain-text tables, how to start Chromium.

The scripts run as files (``python bench/bench_x.py``) and put the checkout's root first on
``sys.path``, so they import this as ``bench.common`` (a namespace package).
"""

from __future__ import annotations

import importlib.util
import os

CHROMIUM = "/usr/bin/chromium"  # Debian's package; browsers are never downloaded
# bench_abr.py --verbose sets this in its children's environment: abr_peers.py logs at this level
PEERS_LOG_LEVEL_ENV = "BENCH_ABR_PEERS_LOG_LEVEL"
CHROMIUM_ARGS = [  # FACTS.md: headless Debian Chromium, WebRTC to a peer on this machine with plain host candidates
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--allow-loopback-in-peer-connection",
    "--disable-features=WebRtcHideLocalIpsWithMdns", "--autoplay-policy=no-user-gesture-required",
]  # fmt: skip


def chromium_unavailable() -> str | None:
    """Why Playwright cannot drive ``CHROMIUM`` here, or None if it can."""
    if not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} is missing: install Debian's chromium package (browsers are never downloaded)"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed"
    return None


def machine_busy_cpu_s() -> float | None:
    """Busy CPU seconds of the whole machine since boot, all cores (Linux /proc/stat; None elsewhere).

    Busy = user + nice + system + irq + softirq: idle and iowait are not, nor is steal (time the
    hypervisor gave to other guests).
    """
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU seconds (user + system, every thread) of this process."""
    own = os.times()
    return own.user + own.system


def print_table(header: list[str], rows: list[list[str]]) -> None:
    """Right-aligned columns, a dashed rule under the header."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
