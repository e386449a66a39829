"""render-broker's Python client SDK: sign in, queue, stream, send input, measure (docs/client.md).

The same API the reference native client (``render-broker play``, ``rbclient.play``) and the
viewers benchmark (``bench/bench_viewers.py``) use.  Imports only ``broker.protocol`` and
``rbcommon`` of the project, plus aiohttp, aiortc, PyAV and numpy; pygame only in ``play``.
"""

from rbclient.api import ApiError, Broker, SessionEnded, SessionView
from rbclient.stamp import Stamp, read_frame
from rbclient.stats import StatsSnapshot, StatsSummary, ViewerStats
from rbclient.stream import Frame, SignalingError, Stream, start, watch

__all__ = ["ApiError", "Broker", "Frame", "SessionEnded", "SessionView", "SignalingError", "Stamp",
           "StatsSnapshot", "StatsSummary", "Stream", "ViewerStats", "read_frame", "start", "watch"]
