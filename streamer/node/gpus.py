"""GPU inventory, seat planning and telemetry for the node (NVML where a driver exists).

Three steps, kept apart so each one is testable on its own:

1. ``read_gpus`` reads hardware facts from NVML: index, model, VRAM, UUID, PCI bus id.
   ``([], reason)`` when NVML cannot be used here (no library, no driver, no device).
2. The agent probes NVENC on each GPU by really encoding a few frames (``encoder/``), giving
   ``{index: works}``.  A model name is a hint, never proof: H100/H200/A100 have no NVENC unit,
   and a card that should have one can still fail (driver, container, session cap reached).
3. ``plan_seats`` (pure) turns the facts, the probe results and the host's software-encode seat
   budget into the ``GpuInfo`` list the node registers.  A GPU whose probe encoded gets
   ``encode="nvenc"`` and the driver's session cap for its model (GeForce: 8, else unlimited);
   a GPU without working NVENC gets ``encode="software"`` and a share of the software budget as
   its encoder session limit, so the broker's seat rule (min of pool cap, encoder limit, VRAM
   budget) gives it seats the host's CPUs can really encode.  ``declared_inventory`` describes a
   host with no NVML at all (one pseudo-GPU, ``cpu-x264``).

``GpuTelemetry.read`` returns the heartbeat's per-GPU figures, reading NVML query by query: a
query that fails (NotSupported on a card without an encoder, Unknown, anything NVML raises)
turns its fields to None and is logged once per (GPU, query); ``read`` never raises.

Concurrency: NVML calls block; callers run ``read_gpus`` and ``GpuTelemetry.read`` through
``asyncio.to_thread``, one read at a time per ``GpuTelemetry`` (its log-once set is not locked).
No module-level mutable state; the NVML module can be injected (tests pass a stub).

Invariants: only a GPU whose probe encoded has ``nvenc=True``; the software shares of one host
sum to its budget; ``plan_seats`` and ``throttle_names`` read no clock and do no I/O.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal

log = logging.getLogger(__name__)

Encode = Literal["nvenc", "software"]

GEFORCE_NVENC_SESSION_LIMIT: Final = 8  # concurrent NVENC sessions the GeForce driver allows (2023+ drivers)
NO_NVENC_MODELS: Final = ("H100", "H200", "A100", "A30", "B200")  # compute parts without an NVENC unit
# whole words, so "RTX A3000" is not an A30 ("A100-SXM4-40GB" still is an A100)
_NO_NVENC_RE: Final = re.compile(r"\b(?:" + "|".join(NO_NVENC_MODELS) + r")\b")
MIB: Final = 1024 * 1024  # bytes per MiB (NVML reports memory in bytes)
MW_PER_W: Final = 1000.0  # NVML reports power in milliwatts

# NVML clock-event ("throttle") reason bits, as nvidia-ml-py exports them
# (nvmlClocksThrottleReason* == nvmlClocksEventReason*); a test checks them against the bindings.
THROTTLE_REASONS: Final[tuple[tuple[int, str], ...]] = (
    (0x0001, "gpu_idle"),
    (0x0002, "applications_clocks"),
    (0x0004, "sw_power_cap"),
    (0x0008, "hw_slowdown"),
    (0x0010, "sync_boost"),
    (0x0020, "sw_thermal"),
    (0x0040, "hw_thermal"),
    (0x0080, "hw_power_brake"),
    (0x0100, "display_clocks"),
    (0x0200, "board_limit"),
    (0x0400, "reliability"),
)
THROTTLE_OTHER: Final = "other"  # any bit this table does not name

# Besides NVMLError: older bindings lack a function (AttributeError) or return another shape
# (TypeError/ValueError).  One unreadable field must never take the heartbeat down.
_FIELD_ERRORS: Final = (AttributeError, TypeError, ValueError)


@dataclass(frozen=True)
class GpuHardware:
    """What NVML says about one GPU (no judgement about encoding)."""

    index: int
    model: str
    vram_mb: int
    uuid: str | None = None
    pci_bus_id: str | None = None


@dataclass(frozen=True)
class GpuInfo:
    """One GPU (or CPU seat group) as the node registers it with the broker."""

    index: int
    model: str
    vram_mb: int
    encoder_session_limit: int | None  # concurrent sessions this GPU can encode; None = no cap
    nvenc: bool  # True only when an NVENC probe really encoded on this GPU
    encode: Encode = "nvenc"
    reason: str = ""  # why this GPU encodes the way it does (shown to operators)

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)


def nvenc_session_limit(model: str) -> tuple[bool, int | None]:
    """Model-name hint: (should have NVENC, driver session cap or None for none)."""
    upper = model.upper()
    if _NO_NVENC_RE.search(upper):
        return False, None
    if "GEFORCE" in upper or "TITAN" in upper:
        return True, GEFORCE_NVENC_SESSION_LIMIT
    return True, None


def plan_seats(hw: Sequence[GpuHardware], nvenc_works: Mapping[int, bool], software_seats: int) -> list[GpuInfo]:
    """What each GPU registers as, given NVENC probe results and the host's software-encode budget.

    ``nvenc_works[index]`` is True when a probe really encoded on that GPU (missing = False).
    ``software_seats`` is how many concurrent software encodes the host's CPUs can carry; it is
    split over the GPUs without working NVENC in index order: ``budget // n`` each, plus one for
    the first ``budget % n``.  Pure.
    """
    if software_seats < 0:
        raise ValueError(f"software_seats must be >= 0, got {software_seats}")
    ordered = sorted(hw, key=lambda g: g.index)
    soft = [g.index for g in ordered if not nvenc_works.get(g.index, False)]
    base, extra = divmod(software_seats, len(soft)) if soft else (0, 0)
    out = []
    for g in ordered:
        should_have, cap = nvenc_session_limit(g.model)
        if nvenc_works.get(g.index, False):
            why = (f"NVENC probe encoded; GeForce driver caps {cap} sessions" if cap is not None
                   else "NVENC probe encoded; no driver session cap")
            out.append(GpuInfo(g.index, g.model, g.vram_mb, cap, True, "nvenc", why))
            continue
        k = soft.index(g.index)
        share = base + (1 if k < extra else 0)
        cause = "no NVENC unit on this model" if not should_have else "NVENC probe did not encode"
        why = f"{cause}; software encode, {share} of the host's {software_seats} software seat(s)"
        out.append(GpuInfo(g.index, g.model, g.vram_mb, share, False, "software", why))
    return out


def declared_inventory(seats: int, model: str = "cpu-x264", vram_mb: int = 65_536) -> list[GpuInfo]:
    """A host without NVML: one pseudo-GPU whose encoder limit is the host's software seat count."""
    return [GpuInfo(0, model, vram_mb, seats, False, "software", f"no NVML: CPU encode, {seats} seat(s)")]


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _import_nvml() -> Any:
    import pynvml  # nvidia-ml-py; lazy so CPU hosts never need a driver

    return pynvml


def read_gpus(nvml: Any = None) -> tuple[list[GpuHardware], str]:
    """NVML hardware facts per GPU and a reason; ``([], reason)`` when NVML is unusable.

    A GPU whose memory cannot be read is left out (the broker needs its VRAM); a missing
    name, UUID or PCI bus id only blanks that fact.  Blocking.
    """
    if nvml is None:
        try:
            nvml = _import_nvml()
        except ImportError as exc:
            return [], f"nvidia-ml-py not importable: {exc}"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return [], f"NVML unavailable: {exc}"
    errors = (nvml.NVMLError, *_FIELD_ERRORS)
    try:
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except errors as exc:
            return [], f"NVML device count failed: {exc}"
        out: list[GpuHardware] = []
        skipped: list[str] = []
        for i in range(count):
            try:
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                vram_mb = int(nvml.nvmlDeviceGetMemoryInfo(h).total // MIB)
            except errors as exc:
                skipped.append(f"GPU {i}: {exc}")
                continue
            model: str | None = None
            uuid: str | None = None
            bus: str | None = None
            with contextlib.suppress(*errors):
                model = _text(nvml.nvmlDeviceGetName(h))
            with contextlib.suppress(*errors):
                uuid = _text(nvml.nvmlDeviceGetUUID(h))
            with contextlib.suppress(*errors):
                bus = _text(nvml.nvmlDeviceGetPciInfo(h).busId)
            out.append(GpuHardware(i, model or "unknown", vram_mb, uuid, bus))
        why = f"NVML: {len(out)} GPU(s)" + (f"; left out {'; '.join(skipped)}" if skipped else "")
        return out, why
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def throttle_names(mask: int) -> list[str]:
    """Short names of the clock-event (throttle) reasons set in an NVML bitmask. Pure."""
    names = [name for bit, name in THROTTLE_REASONS if mask & bit]
    known = 0
    for bit, _name in THROTTLE_REASONS:
        known |= bit
    if mask & ~known:
        names.append(THROTTLE_OTHER)
    return names


# ---- telemetry: one NVML query per entry; its fields go null together when it fails -------------
Query = Callable[[Any, Any], dict[str, Any]]


def _q_utilization(nvml: Any, h: Any) -> dict[str, Any]:
    return {"utilization": float(nvml.nvmlDeviceGetUtilizationRates(h).gpu)}  # percent


def _q_memory(nvml: Any, h: Any) -> dict[str, Any]:
    mem = nvml.nvmlDeviceGetMemoryInfo(h)  # bytes
    return {"vram_used_mb": mem.used / MIB, "vram_total_mb": mem.total / MIB}


def _q_encoder_utilization(nvml: Any, h: Any) -> dict[str, Any]:
    util, _period_us = nvml.nvmlDeviceGetEncoderUtilization(h)  # percent over a sampling period
    return {"encoder_utilization": float(util)}


def _q_encoder_stats(nvml: Any, h: Any) -> dict[str, Any]:
    sessions, fps, latency_us = nvml.nvmlDeviceGetEncoderStats(h)  # averages over active sessions
    return {"encoder_sessions": int(sessions), "encoder_fps": float(fps), "encoder_latency_us": float(latency_us)}


def _q_temperature(nvml: Any, h: Any) -> dict[str, Any]:
    return {"temperature_c": float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))}


def _q_power(nvml: Any, h: Any) -> dict[str, Any]:
    return {"power_w": nvml.nvmlDeviceGetPowerUsage(h) / MW_PER_W}


def _q_throttle(nvml: Any, h: Any) -> dict[str, Any]:
    # ClocksEventReasons is the current name; ClocksThrottleReasons the older (deprecated) one.
    fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return {"throttle_reasons": throttle_names(int(fn(h)))}


QUERIES: Final[tuple[tuple[str, tuple[str, ...], Query], ...]] = (
    ("utilization", ("utilization",), _q_utilization),
    ("memory", ("vram_used_mb", "vram_total_mb"), _q_memory),
    ("encoder_utilization", ("encoder_utilization",), _q_encoder_utilization),
    ("encoder_stats", ("encoder_sessions", "encoder_fps", "encoder_latency_us"), _q_encoder_stats),
    ("temperature", ("temperature_c",), _q_temperature),
    ("power", ("power_w",), _q_power),
    ("throttle", ("throttle_reasons",), _q_throttle),
)
TELEMETRY_FIELDS: Final = tuple(f for _q, fields, _fn in QUERIES for f in fields)


class GpuTelemetry:
    """Heartbeat GPU figures, read query by query; remembers which failures it already logged.

    The agent holds one for its lifetime so a card that never supports a query (NVENC stats on
    an H200) logs that once, not every heartbeat.
    """

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = nvml  # None: import pynvml on first read
        self._logged: set[tuple[int, str]] = set()  # (gpu index or -1 for NVML itself, query)

    def read(self, indexes: Sequence[int]) -> list[dict[str, Any]]:
        """One dict per index: every field of ``TELEMETRY_FIELDS``, None where NVML could not say.

        Without NVML the dicts hold only the index (CPU hosts).  Never raises. Blocking.
        """
        nvml = self._nvml
        if nvml is None:
            try:
                nvml = self._nvml = _import_nvml()
            except ImportError as exc:
                self._note(-1, "nvml", exc, expected=True)
                return [{"index": i} for i in indexes]
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            self._note(-1, "nvml", exc, expected=True)
            return [{"index": i} for i in indexes]
        try:
            return [self._read_one(nvml, i) for i in indexes]
        finally:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()

    def _read_one(self, nvml: Any, index: int) -> dict[str, Any]:
        out: dict[str, Any] = {"index": index}
        out.update(dict.fromkeys(TELEMETRY_FIELDS))
        errors = (nvml.NVMLError, *_FIELD_ERRORS)
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(index)
        except errors as exc:
            self._note(index, "handle", exc, expected=False)
            return out
        for name, _fields, query in QUERIES:
            try:
                out.update(query(nvml, h))
            except errors as exc:
                not_supported = getattr(exc, "value", None) == getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3)
                self._note(index, name, exc, expected=not_supported)
        return out

    def _note(self, index: int, query: str, exc: BaseException, *, expected: bool) -> None:
        """Log a failed query once per (GPU, query); NotSupported is expected (INFO), the rest WARNING."""
        if (index, query) in self._logged:
            return
        self._logged.add((index, query))
        where = "NVML" if index < 0 else f"GPU {index} {query}"
        log.log(logging.INFO if expected else logging.WARNING,
                "%s unavailable (%s: %s); reported as null from now on", where, type(exc).__name__, exc)

