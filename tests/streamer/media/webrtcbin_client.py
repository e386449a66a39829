"""A native WebRTC viewer on GStreamer's webrtcbin, for tests/streamer/media/test_webrtcbin_e2e.py.

Run by the system Python (``/usr/bin/python3``, where Debian's ``python3-gi`` lives), not the
project's virtualenv, and imports nothing of the project: it is the media half of a third-party
client.  The test holds the other half (REST, SSE-free polling, the signaling WebSocket) and
relays signaling through this process's stdin/stdout, one JSON object per line:

- out: ``{"type": "offer", "sdp"}`` and ``{"type": "candidate", "candidate", "sdpMLineIndex"}``
  (webrtcbin's own messages, as a client would put them on the signaling socket);
  ``{"ev": "frame", "n", "w", "h"}`` per decoded frame; ``{"ev": "channel_open"}``;
  ``{"ev": "message", "data"}`` per text message from the node on ``input``;
  ``{"ev": "state", "what", "value"}`` for connection/ICE state changes; ``{"ev": "error", "detail"}``.
- in: ``{"type": "answer", "sdp"}``; ``{"type": "candidate", ...}``; ``{"send": {...}}`` (one
  message on ``input``); ``{"quit": true}``.

webrtcbin is used as GStreamer 1.22 ships it: its default (RSA-2048) DTLS certificate, an offer
with ``a=setup:actpass``, a recvonly H.264 (constrained baseline, packetization-mode 1) video
transceiver, the ordered ``input`` data channel created before the offer.  Decoded frames go to an
appsink; every ``FRAME_EVERY``-th one is written as raw BGR to ``<dir>/latest.bgr`` (renamed into
place) so the test can read the frame stamps and find the player.

Usage: ``python3 webrtcbin_client.py OUT_DIR``.
"""

from __future__ import annotations

import json
import os
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstSdp", "1.0")
gi.require_version("GstWebRTC", "1.0")
from gi.repository import GLib, Gst, GstSdp, GstWebRTC  # noqa: E402  (after require_version)

FRAME_EVERY = 3
H264_CAPS = ("application/x-rtp,media=video,encoding-name=H264,payload=102,clock-rate=90000,"
             "packetization-mode=(string)1,profile-level-id=(string)42e01f")


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Client:
    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir
        self.frames = 0
        self.offered = False
        self.channel: GstWebRTC.WebRTCDataChannel | None = None
        self.pipe = Gst.Pipeline.new("viewer")
        self.webrtc = Gst.ElementFactory.make("webrtcbin", "webrtc")
        self.webrtc.set_property("bundle-policy", GstWebRTC.WebRTCBundlePolicy.MAX_BUNDLE)
        self.pipe.add(self.webrtc)
        self.webrtc.connect("on-negotiation-needed", self.on_negotiation_needed)
        self.webrtc.connect("on-ice-candidate", self.on_ice_candidate)
        self.webrtc.connect("pad-added", self.on_pad_added)
        for prop in ("connection-state", "ice-connection-state"):
            self.webrtc.connect(f"notify::{prop}", self.on_state, prop)
        caps = Gst.Caps.from_string(H264_CAPS)
        self.webrtc.emit("add-transceiver", GstWebRTC.WebRTCRTPTransceiverDirection.RECVONLY, caps)
        self.pipe.set_state(Gst.State.READY)
        self.channel = channel = self.webrtc.emit("create-data-channel", "input", None)
        channel.connect("on-open", lambda _ch: emit({"ev": "channel_open"}))
        channel.connect("on-message-string", lambda _ch, data: emit({"ev": "message", "data": data}))
        channel.connect("on-error", lambda _ch, err: emit({"ev": "error", "detail": f"data channel: {err}"}))
        bus = self.pipe.get_bus()
        bus.add_signal_watch()
        bus.connect("message::error", self.on_bus_error)
        self.pipe.set_state(Gst.State.PLAYING)
        GLib.idle_add(self.make_offer)

    # -- signaling -------------------------------------------------------------------------
    def on_negotiation_needed(self, _element: Gst.Element) -> None:
        # webrtcbin asks as each transceiver/channel is added, from its own thread: offer once,
        # from the main loop, once the channel exists
        GLib.idle_add(self.make_offer)

    def make_offer(self) -> bool:
        if self.channel is None or self.offered:
            return False
        self.offered = True
        promise = Gst.Promise.new_with_change_func(self.on_offer_created, None)
        self.webrtc.emit("create-offer", None, promise)
        return False

    def on_offer_created(self, promise: Gst.Promise, _data: object) -> None:
        promise.wait()
        reply = promise.get_reply()  # keep it referenced: the offer's SDP lives in it
        offer = reply.get_value("offer")
        if offer is None or offer.sdp is None:  # webrtcbin refuses until it has started up: ask again
            self.offered = False
            GLib.timeout_add(100, self.make_offer)
            return
        self.webrtc.emit("set-local-description", offer, Gst.Promise.new())
        emit({"type": "offer", "sdp": offer.sdp.as_text()})

    def on_ice_candidate(self, _element: Gst.Element, mline: int, candidate: str) -> None:
        emit({"type": "candidate", "candidate": candidate, "sdpMLineIndex": mline})

    def on_state(self, _element: Gst.Element, _pspec: object, prop: str) -> None:
        value = self.webrtc.get_property(prop)
        emit({"ev": "state", "what": prop, "value": value.value_nick})

    def on_bus_error(self, _bus: Gst.Bus, message: Gst.Message) -> None:
        err, debug = message.parse_error()
        emit({"ev": "error", "detail": f"{err.message} ({debug})"})

    def on_input(self, line: str) -> bool:
        msg = json.loads(line)
        if msg.get("quit"):
            self.pipe.set_state(Gst.State.NULL)
            loop.quit()
            return False
        if "send" in msg and self.channel is not None:
            self.channel.emit("send-string", json.dumps(msg["send"]))
        elif msg.get("type") == "answer":
            ok, sdp = GstSdp.SDPMessage.new_from_text(msg["sdp"])
            assert ok == GstSdp.SDPResult.OK, "answer SDP does not parse"
            answer = GstWebRTC.WebRTCSessionDescription.new(GstWebRTC.WebRTCSDPType.ANSWER, sdp)
            self.webrtc.emit("set-remote-description", answer, Gst.Promise.new())
        elif msg.get("type") == "candidate" and msg.get("candidate"):
            self.webrtc.emit("add-ice-candidate", int(msg.get("sdpMLineIndex") or 0), msg["candidate"])
        return True

    # -- media -----------------------------------------------------------------------------
    def on_pad_added(self, _element: Gst.Element, pad: Gst.Pad) -> None:
        if pad.direction != Gst.PadDirection.SRC:
            return
        decode = Gst.parse_bin_from_description(
            "rtph264depay ! h264parse ! avdec_h264 ! videoconvert ! video/x-raw,format=BGR ! "
            "appsink name=sink emit-signals=true sync=false max-buffers=2 drop=true", True)
        self.pipe.add(decode)
        decode.sync_state_with_parent()
        decode.get_by_name("sink").connect("new-sample", self.on_sample)
        pad.link(decode.get_static_pad("sink"))

    def on_sample(self, sink: Gst.Element) -> Gst.FlowReturn:
        sample = sink.emit("pull-sample")
        structure = sample.get_caps().get_structure(0)
        w, h = structure.get_value("width"), structure.get_value("height")
        self.frames += 1
        if self.frames % FRAME_EVERY == 1:
            buf = sample.get_buffer()
            ok, info = buf.map(Gst.MapFlags.READ)
            if ok:
                try:
                    tmp = os.path.join(self.out_dir, "latest.tmp")
                    with open(tmp, "wb") as fh:
                        fh.write(info.data[: w * h * 3])
                    os.replace(tmp, os.path.join(self.out_dir, "latest.bgr"))
                finally:
                    buf.unmap(info)
        emit({"ev": "frame", "n": self.frames, "w": w, "h": h})
        return Gst.FlowReturn.OK


if __name__ == "__main__":
    Gst.init(None)
    loop = GLib.MainLoop()
    client = Client(sys.argv[1])
    pending = b""

    def on_stdin(fd: int, _condition: object) -> bool:
        global pending
        data = os.read(fd, 1 << 20)
        if not data:  # the test went away
            client.pipe.set_state(Gst.State.NULL)
            loop.quit()
            return False
        pending += data
        *lines, pending = pending.split(b"\n")
        return all(client.on_input(line.decode()) for line in lines if line.strip())

    GLib.io_add_watch(sys.stdin.fileno(), GLib.IO_IN | GLib.IO_HUP, on_stdin)
    loop.run()
