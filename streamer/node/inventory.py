"""What this host offers the broker: its GPUs, how each one encodes, and the seats that follow.

Job: one blocking function, ``take_inventory``, that the agent (at start) and ``render-node
doctor`` both call, so what the doctor prints is what the node registers:

1. NVML lists the GPUs (``streamer.node.gpus.read_gpus``); no NVML -> a CPU-encode host whose one
   pseudo-GPU carries the declared software seat budget.
2. Each GPU's NVENC is probed by really encoding on that GPU (``encoder.probe.probe_backend`` with
   ``gpu=index``): a model name says nothing about a card whose encoder is busy or missing.
3. ``streamer.node.gpus.plan_seats`` (pure) turns hardware + probe results + the software seat
   budget into the wire inventory: NVENC GPUs get their session limit, GPUs without a working
   NVENC share the software budget (they still render on the GPU and encode on the CPU).

Concurrency model: blocking (NVML, encoder probes); the agent calls it with ``asyncio.to_thread``.
Invariants: never raises for missing hardware (the reason is in the result); every GPU NVML lists
appears in the inventory with a reason for its seats.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from encoder.backends import ProbeResult, backend_by_name
from encoder.probe import probe_backend
from streamer.node.gpus import GpuHardware, GpuInfo, declared_inventory, plan_seats, read_gpus

log = logging.getLogger(__name__)

NVENC_PROBE_BACKEND = "h264_nvenc"  # what WebRTC viewers decode (aiortc payloads H.264, not HEVC/AV1)

NvencProbe = Callable[[int], ProbeResult]


def probe_nvenc(gpu: int) -> ProbeResult:
    """Encode a few frames with NVENC H.264 on GPU ``gpu`` (CUDA ordinal). Blocking."""
    return probe_backend(backend_by_name(NVENC_PROBE_BACKEND), gpu=gpu)


@dataclass(frozen=True)
class Inventory:
    """What ``take_inventory`` found: the wire GPUs, whether apps render on NVIDIA GPUs, and why."""

    gpus: list[GpuInfo]
    gpu_render: bool  # NVML found NVIDIA GPUs: sessions render (GLX/EGL) and encode on them
    reason: str  # NVML's summary, or why the host is a CPU-encode host
    hardware: list[GpuHardware] = field(default_factory=list)
    nvenc: dict[int, ProbeResult] = field(default_factory=dict)  # per GPU index

    @property
    def seats_note(self) -> str:
        """One line per GPU: index, model, encode path, its seat limit and why."""
        return "; ".join(f"GPU {g.index} {g.model}: {g.encode}, limit {g.encoder_session_limit} ({g.reason})"
                         for g in self.gpus)


def take_inventory(software_seats: int, nvenc_probe: NvencProbe = probe_nvenc,
                   gpu_reader: Callable[[], tuple[list[GpuHardware], str]] = read_gpus) -> Inventory:
    """NVML GPUs with per-GPU NVENC probes and planned seats; a declared CPU host without NVML.

    NVML indexes GPUs in PCI bus order; the NVENC probe's ``gpu`` is a CUDA ordinal, which follows
    the same order only under ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (``render-node`` sets it at start).
    """
    hardware, why = gpu_reader()
    if not hardware:
        return Inventory(declared_inventory(software_seats), False,
                         f"{why}; a CPU-encode host with {software_seats} declared seat(s)")
    probes = {hw.index: nvenc_probe(hw.index) for hw in hardware}
    for index, result in probes.items():
        log.info("GPU %d NVENC probe: %s (%s)", index, "ok" if result.ok else "unavailable", result.reason)
    gpus = plan_seats(hardware, {i: r.ok for i, r in probes.items()}, software_seats)
    return Inventory(gpus, True, why, hardware, probes)
