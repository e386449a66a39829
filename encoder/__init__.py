"""Video encoding for render nodes: backends as data, probe, selection, encoder.

Job: know which video encoders exist (``backends``), find out which really
work on this machine (``probe``), choose one for a session from the probe,
the user's preference and the peer's codecs (``select``), and encode captured
frames into packets aiortc can send as they are (``video``), converting
colour only when the backend needs it (``convert``) and measuring every frame
(``stats``). Rate-control sizing and the live-bitrate policy live in
``ratecontrol``.

Concurrency model: everything that touches PyAV blocks (encoding, colour
conversion, probing) and must run in an executor or a dedicated thread, never
on the event loop; ``probe_all_async`` does that for the probe. Pure modules
(``backends``, ``ratecontrol``, ``select``, ``stats``) do no I/O.

This package imports nothing else of ours. Importing it has no side effects.
"""

from encoder.backends import (
    AIORTC_VIDEO_CODECS,
    BACKENDS,
    Backend,
    ProbeResult,
    backend_by_name,
)
from encoder.probe import clear_probe_cache, probe_all, probe_all_async, probe_backend
from encoder.ratecontrol import (
    KEYFRAME_CAP_FRAMES,
    BitrateChange,
    BitrateDecision,
    keyframe_cap_bytes,
)
from encoder.select import NoEncoderError, Selection, select_backend
from encoder.stats import EncoderStats, FrameStats, StatsSnapshot
from encoder.video import RTP_VIDEO_TIME_BASE, EncoderConfig, EncoderOpenError, VideoEncoder

__all__ = [
    "AIORTC_VIDEO_CODECS",
    "BACKENDS",
    "KEYFRAME_CAP_FRAMES",
    "RTP_VIDEO_TIME_BASE",
    "Backend",
    "BitrateChange",
    "BitrateDecision",
    "EncoderConfig",
    "EncoderOpenError",
    "EncoderStats",
    "FrameStats",
    "NoEncoderError",
    "ProbeResult",
    "Selection",
    "StatsSnapshot",
    "VideoEncoder",
    "backend_by_name",
    "clear_probe_cache",
    "keyframe_cap_bytes",
    "probe_all",
    "probe_all_async",
    "probe_backend",
    "select_backend",
]
