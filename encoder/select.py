"""Choosing an encoder backend: a pure function of probe results (pure).

Job: given what the probe found on this machine, the user's preference and
the WebRTC codecs the peer can receive (and the transport can packetize),
return the backend to use and the reasons -- every candidate that was passed
over says why -- or raise ``NoEncoderError`` carrying all of them.

Concurrency model: none. ``select_backend`` is pure: no clock, no I/O, no
PyAV. The caller probes (``encoder.probe``), selects, opens
(``encoder.video``) and logs ``Selection.reasons``.

Preference grammar (case-insensitive):
- ``"auto"``: every backend, in priority order (``BACKENDS`` order);
- a backend name (``"libx264"``, ``"h264_nvenc"``): that backend only;
- a codec (``"h264"``, ``"vp8"``, ``"hevc"``/``"h265"``, ``"av1"``): the
  backends producing it, in priority order.
When the preference cannot be met, ``strict=False`` (default) falls back to
``"auto"`` and says so in the reasons; ``strict=True`` raises.

Invariant: the chosen backend probed ``ok`` and produces a codec that is in
``peer_codecs`` and in ``packetizable``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from encoder.backends import AIORTC_VIDEO_CODECS, BACKENDS, Backend, ProbeResult

AUTO = "auto"

# Preference spellings for codecs -> WebRTC codec name.
_CODEC_ALIASES: Mapping[str, str] = {
    "h264": "H264",
    "avc": "H264",
    "vp8": "VP8",
    "hevc": "HEVC",
    "h265": "HEVC",
    "av1": "AV1",
}


class NoEncoderError(RuntimeError):
    """No backend fits; ``reasons`` says why each candidate was rejected."""

    code = "no_encoder"

    def __init__(self, message: str, reasons: Iterable[str]) -> None:
        self.reasons: tuple[str, ...] = tuple(reasons)
        detail = "; ".join(self.reasons)
        super().__init__(f"{message}: {detail}" if detail else message)


@dataclass(frozen=True)
class Selection:
    """The chosen backend and why (rejections first, then the choice)."""

    backend: Backend
    reasons: tuple[str, ...]


def _candidates(preference: str, backends: tuple[Backend, ...]) -> tuple[Backend, ...] | None:
    """Backends a preference names, in priority order; None if it names nothing."""
    pref = preference.strip().lower()
    if pref == AUTO:
        return backends
    by_name = tuple(b for b in backends if b.name.lower() == pref)
    if by_name:
        return by_name
    codec = _CODEC_ALIASES.get(pref)
    if codec is not None:
        return tuple(b for b in backends if b.webrtc_codec == codec)
    return None


def _first_fit(
    candidates: tuple[Backend, ...],
    probes: Mapping[str, ProbeResult],
    receivable: frozenset[str],
    peer_codecs: frozenset[str],
    reasons: list[str],
) -> Backend | None:
    for backend in candidates:
        if backend.webrtc_codec not in peer_codecs:
            reasons.append(
                f"{backend.name}: peer cannot receive {backend.webrtc_codec} "
                f"(peer accepts {', '.join(sorted(peer_codecs)) or 'nothing'})"
            )
            continue
        if backend.webrtc_codec not in receivable:
            reasons.append(f"{backend.name}: transport cannot packetize {backend.webrtc_codec}")
            continue
        probe = probes.get(backend.name)
        if probe is None:
            reasons.append(f"{backend.name}: not probed")
            continue
        if not probe.ok:
            reasons.append(f"{backend.name}: unavailable ({probe.reason})")
            continue
        return backend
    return None


def select_backend(
    probes: Iterable[ProbeResult],
    preference: str = AUTO,
    peer_codecs: Collection[str] = AIORTC_VIDEO_CODECS,
    *,
    packetizable: Collection[str] = AIORTC_VIDEO_CODECS,
    strict: bool = False,
    backends: tuple[Backend, ...] = BACKENDS,
) -> Selection:
    """Choose a backend.

    ``probes``: results from ``encoder.probe``; ``preference``: see the module
    docstring; ``peer_codecs``: WebRTC codec names the remote side can
    receive (from its SDP); ``packetizable``: codecs our RTP sender can
    packetize (aiortc: H264, VP8). Raises ``NoEncoderError`` when nothing fits.
    """
    by_name = {p.name: p for p in probes}
    peer = frozenset(c.upper() for c in peer_codecs)
    receivable = peer & frozenset(c.upper() for c in packetizable)
    reasons: list[str] = []

    candidates = _candidates(preference, backends)
    if candidates is None:
        reasons.append(
            f"unknown preference {preference!r} (expected 'auto', a backend: "
            f"{', '.join(b.name for b in backends)}; or a codec: {', '.join(sorted(_CODEC_ALIASES))})"
        )
    elif not candidates:
        reasons.append(f"no backend produces {preference!r}")
    else:
        chosen = _first_fit(candidates, by_name, receivable, peer, reasons)
        if chosen is not None:
            reasons.append(f"chose {chosen.name} ({chosen.webrtc_codec}) for preference {preference!r}")
            return Selection(chosen, tuple(reasons))

    is_auto = preference.strip().lower() == AUTO
    if strict or is_auto:
        raise NoEncoderError(f"no usable encoder for preference {preference!r}", reasons)

    reasons.append(f"preference {preference!r} cannot be met; falling back to 'auto'")
    remaining = tuple(b for b in backends if candidates is None or b not in candidates)
    chosen = _first_fit(remaining, by_name, receivable, peer, reasons)
    if chosen is None:
        raise NoEncoderError(f"no usable encoder for preference {preference!r} or 'auto'", reasons)
    reasons.append(f"chose {chosen.name} ({chosen.webrtc_codec}) by fallback to 'auto'")
    return Selection(chosen, tuple(reasons))
