"""GPU inventory, seat planning and field-by-field telemetry against a stub NVML.

The stub mimics pynvml's functions and raises the bindings' real NVMLError classes (nvidia-ml-py
imports without a driver), so the code under test sees what a real card without an encoder
(H200: NotSupported) or a flaky driver (Unknown) gives it.  Seat counts go through the broker's
own seat rule (``broker.placement.gpu_seats``) so "a GPU without NVENC gets seats" is checked
end to end.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from broker.placement import gpu_seats
from streamer.node.gpus import (
    GEFORCE_NVENC_SESSION_LIMIT,
    TELEMETRY_FIELDS,
    THROTTLE_REASONS,
    GpuHardware,
    GpuInfo,
    GpuTelemetry,
    declared_inventory,
    nvenc_session_limit,
    plan_seats,
    read_gpus,
    throttle_names,
)

MIB = 1024 * 1024
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
UNKNOWN = pynvml.NVML_ERROR_UNKNOWN


@dataclass
class Card:
    model: str
    vram_mb: int
    has_encoder: bool = True
    used_mb: int = 1024
    util: int = 30
    enc_util: int = 20
    sessions: int = 1
    fps: int = 60
    latency_us: int = 900
    temp_c: int = 55
    power_mw: int = 72_500
    throttle: int = 0x4  # sw_power_cap
    uuid: str = "GPU-0000"
    bus: bytes = b"00000000:17:00.0"


@dataclass
class FakeNvml:
    """pynvml's surface as the node uses it; handles are GPU indexes."""

    cards: list[Card]
    init_error: int | None = None
    fail: dict[tuple[int, str], int] = field(default_factory=dict)  # (index, function) -> NVML error code
    inits: int = 0
    shutdowns: int = 0

    NVMLError = pynvml.NVMLError
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU

    def _card(self, h: int, fn: str) -> Card:
        code = self.fail.get((h, fn))
        if code is not None:
            raise pynvml.NVMLError(code)
        return self.cards[h]

    def _encoder(self, h: int, fn: str) -> Card:
        card = self._card(h, fn)
        if not card.has_encoder:
            raise pynvml.NVMLError(NOT_SUPPORTED)
        return card

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        self._card(i, "handle")
        return i

    def nvmlDeviceGetName(self, h: int) -> str:
        return self._card(h, "name").model

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self._card(h, "uuid").uuid

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=self._card(h, "pci").bus)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        c = self._card(h, "memory")
        return SimpleNamespace(total=c.vram_mb * MIB, used=c.used_mb * MIB, free=(c.vram_mb - c.used_mb) * MIB)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=self._card(h, "utilization").util, memory=5)

    def nvmlDeviceGetEncoderUtilization(self, h: int) -> list[int]:
        return [self._encoder(h, "encoder_utilization").enc_util, 167_000]

    def nvmlDeviceGetEncoderStats(self, h: int) -> list[int]:
        c = self._encoder(h, "encoder_stats")
        return [c.sessions, c.fps, c.latency_us]

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._card(h, "temperature").temp_c

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self._card(h, "power").power_mw

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self._card(h, "throttle").throttle


REAL_CARDS = [
    Card("NVIDIA L4", 23_034, uuid="GPU-l4"),
    Card("NVIDIA L40S", 46_068, uuid="GPU-l40s"),
    Card("NVIDIA A10", 23_028, uuid="GPU-a10"),
    Card("NVIDIA GeForce RTX 4090", 24_564, uuid="GPU-4090"),
    Card("NVIDIA H200", 143_771, has_encoder=False, uuid="GPU-h200"),
]


def test_read_gpus_reads_hardware_facts() -> None:
    nvml = FakeNvml(list(REAL_CARDS))
    nvml.cards[2] = Card("NVIDIA A10", 23_028, uuid="GPU-a10", bus=b"")
    nvml.fail[(2, "pci")] = UNKNOWN
    hw, why = read_gpus(nvml)
    assert why == "NVML: 5 GPU(s)"
    assert hw[0] == GpuHardware(0, "NVIDIA L4", 23_034, "GPU-l4", "00000000:17:00.0")
    assert hw[2] == GpuHardware(2, "NVIDIA A10", 23_028, "GPU-a10", None)  # PCI unreadable: only that fact blank
    assert [g.model for g in hw] == [c.model for c in REAL_CARDS]
    assert (nvml.inits, nvml.shutdowns) == (1, 1)


def test_read_gpus_leaves_out_a_gpu_without_memory_and_reports_no_nvml() -> None:
    nvml = FakeNvml(list(REAL_CARDS[:2]), fail={(1, "memory"): UNKNOWN})
    hw, why = read_gpus(nvml)
    assert [g.index for g in hw] == [0]
    assert why == "NVML: 1 GPU(s); left out GPU 1: Unknown Error"
    hw, why = read_gpus(FakeNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    assert hw == [] and why == "NVML unavailable: Driver Not Loaded"


def test_real_cards_seats_and_limits_follow_the_probe() -> None:
    hw, _ = read_gpus(FakeNvml(list(REAL_CARDS)))
    # the probe encoded on every card with an NVENC unit, not on the H200
    plan = plan_seats(hw, {0: True, 1: True, 2: True, 3: True, 4: False}, software_seats=6)
    assert [(g.model, g.encode, g.nvenc, g.encoder_session_limit) for g in plan] == [
        ("NVIDIA L4", "nvenc", True, None),
        ("NVIDIA L40S", "nvenc", True, None),
        ("NVIDIA A10", "nvenc", True, None),
        ("NVIDIA GeForce RTX 4090", "nvenc", True, GEFORCE_NVENC_SESSION_LIMIT),
        ("NVIDIA H200", "software", False, 6),
    ]
    assert plan[3].reason == "NVENC probe encoded; GeForce driver caps 8 sessions"
    assert plan[4].reason == "no NVENC unit on this model; software encode, 6 of the host's 6 software seat(s)"
    # the broker's seat rule: pool cap 16, 2 GiB per session, 20 % VRAM headroom
    seats = [gpu_seats(g.vram_mb, g.encoder_session_limit, 16, 2048, 0.2) for g in plan]
    assert seats == [8, 16, 8, 8, 6]  # the H200 now seats 6 (was 0 under the model-name rule)


def test_a_card_whose_probe_fails_encodes_in_software() -> None:
    hw, _ = read_gpus(FakeNvml(list(REAL_CARDS)))
    plan = plan_seats(hw, {0: False, 1: True, 3: True}, software_seats=5)  # 2 and 4 never probed: False
    assert [(g.index, g.encode, g.encoder_session_limit) for g in plan] == [
        (0, "software", 2), (1, "nvenc", None), (2, "software", 2), (3, "nvenc", 8), (4, "software", 1)]
    assert plan[0].reason == "NVENC probe did not encode; software encode, 2 of the host's 5 software seat(s)"
    assert not any(g.nvenc for g in plan if g.encode == "software")


@pytest.mark.parametrize(("budget", "n", "shares"), [
    (0, 1, [0]),
    (1, 3, [1, 0, 0]),
    (6, 1, [6]),
    (7, 3, [3, 2, 2]),
    (8, 3, [3, 3, 2]),
    (9, 3, [3, 3, 3]),
    (5, 4, [2, 1, 1, 1]),
    (64, 8, [8] * 8),
])
def test_plan_seats_splits_the_software_budget(budget: int, n: int, shares: list[int]) -> None:
    hw = [GpuHardware(i, "NVIDIA H200", 143_771) for i in reversed(range(n))]  # order in: any
    plan = plan_seats(hw, {}, budget)
    assert [g.index for g in plan] == list(range(n))
    assert [g.encoder_session_limit for g in plan] == shares and sum(shares) == budget


def test_plan_seats_rejects_a_negative_budget_and_keeps_nvenc_gpus_out_of_the_split() -> None:
    with pytest.raises(ValueError, match="software_seats"):
        plan_seats([], {}, -1)
    hw = [GpuHardware(0, "NVIDIA L4", 23_034), GpuHardware(1, "NVIDIA H100 80GB HBM3", 81_559)]
    assert [g.encoder_session_limit for g in plan_seats(hw, {0: True}, 3)] == [None, 3]


@pytest.mark.parametrize(("model", "hint"), [
    ("NVIDIA H200", (False, None)),
    ("NVIDIA A100-SXM4-40GB", (False, None)),
    ("NVIDIA H100 80GB HBM3", (False, None)),
    ("NVIDIA RTX A3000 Laptop GPU", (True, None)),  # not an A30
    ("NVIDIA GeForce RTX 4090", (True, GEFORCE_NVENC_SESSION_LIMIT)),
    ("NVIDIA L4", (True, None)),
])
def test_model_name_hint(model: str, hint: tuple[bool, int | None]) -> None:
    assert nvenc_session_limit(model) == hint


def test_declared_inventory_is_one_software_seat_group() -> None:
    assert declared_inventory(3) == [GpuInfo(0, "cpu-x264", 65_536, 3, False, "software",
                                             "no NVML: CPU encode, 3 seat(s)")]
    assert declared_inventory(3)[0].to_wire()["encode"] == "software"


def test_telemetry_reads_every_field() -> None:
    nvml = FakeNvml([Card("NVIDIA L4", 23_034, throttle=0x4 | 0x40)])
    (t,) = GpuTelemetry(nvml).read([0])
    assert t == {"index": 0, "utilization": 30.0, "vram_used_mb": 1024.0, "vram_total_mb": 23_034.0,
                 "encoder_utilization": 20.0, "encoder_sessions": 1, "encoder_fps": 60.0,
                 "encoder_latency_us": 900.0, "temperature_c": 55.0, "power_w": 72.5,
                 "throttle_reasons": ["sw_power_cap", "hw_thermal"]}
    assert (nvml.inits, nvml.shutdowns) == (1, 1)


def test_unsupported_fields_go_null_and_log_once(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml([Card("NVIDIA L4", 23_034), Card("NVIDIA H200", 143_771, has_encoder=False)],
                    fail={(0, "power"): UNKNOWN, (1, "throttle"): NOT_SUPPORTED})
    tel = GpuTelemetry(nvml)
    with caplog.at_level(logging.INFO, logger="streamer.node.gpus"):
        first = tel.read([0, 1])
        second = tel.read([0, 1])
    assert first == second
    l4, h200 = first
    assert l4["power_w"] is None and l4["temperature_c"] == 55.0 and l4["encoder_sessions"] == 1
    assert (h200["encoder_utilization"], h200["encoder_sessions"], h200["encoder_fps"],
            h200["encoder_latency_us"], h200["throttle_reasons"]) == (None, None, None, None, None)
    assert h200["utilization"] == 30.0 and h200["vram_total_mb"] == 143_771.0 and h200["power_w"] == 72.5
    logged = sorted((r.levelname, r.getMessage()) for r in caplog.records)
    assert logged == [
        ("INFO", "GPU 1 encoder_stats unavailable (NVMLError_NotSupported: Not Supported); "
                 "reported as null from now on"),
        ("INFO", "GPU 1 encoder_utilization unavailable (NVMLError_NotSupported: Not Supported); "
                 "reported as null from now on"),
        ("INFO", "GPU 1 throttle unavailable (NVMLError_NotSupported: Not Supported); reported as null from now on"),
        ("WARNING", "GPU 0 power unavailable (NVMLError_Unknown: Unknown Error); reported as null from now on"),
    ]


def test_a_missing_handle_or_old_bindings_never_raise(caplog: pytest.LogCaptureFixture) -> None:
    class OldBindings(FakeNvml):
        nvmlDeviceGetCurrentClocksEventReasons = None  # type: ignore[assignment]  # pre-12.535 nvidia-ml-py

        def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
            return 0x1 | 0x800  # gpu_idle and a bit this table does not know

    nvml = OldBindings([Card("NVIDIA A10", 23_028)], fail={(1, "handle"): UNKNOWN})
    nvml.cards.append(Card("NVIDIA A10", 23_028))
    with caplog.at_level(logging.INFO, logger="streamer.node.gpus"):
        t0, t1 = GpuTelemetry(nvml).read([0, 1])
    assert t0["throttle_reasons"] == ["gpu_idle", "other"]
    assert t1 == {"index": 1, **dict.fromkeys(TELEMETRY_FIELDS)}
    assert [r.getMessage() for r in caplog.records] == [
        "GPU 1 handle unavailable (NVMLError_Unknown: Unknown Error); reported as null from now on"]


def test_no_nvml_gives_bare_indexes() -> None:
    nvml = FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    assert GpuTelemetry(nvml).read([0, 1]) == [{"index": 0}, {"index": 1}]


def test_throttle_table_matches_the_bindings() -> None:
    exported = {name: getattr(pynvml, name) for name in dir(pynvml)
                if name.startswith("nvmlClocksThrottleReason") and name not in (
                    "nvmlClocksThrottleReasonNone", "nvmlClocksThrottleReasonAll",
                    "nvmlClocksThrottleReasonUserDefinedClocks")}  # alias of ApplicationsClocksSetting
    assert sorted(exported.values()) == [bit for bit, _ in THROTTLE_REASONS]
    assert sum(bit for bit, _ in THROTTLE_REASONS) == pynvml.nvmlClocksThrottleReasonAll
    assert throttle_names(0) == []
    assert throttle_names(pynvml.nvmlClocksEventReasonSwThermalSlowdown | pynvml.nvmlClocksEventReasonHwSlowdown) == [
        "hw_slowdown", "sw_thermal"]
