"""The WebRTC media path: encoded-packet track, aiortc peer, RTX, delay probes, session runtime."""
