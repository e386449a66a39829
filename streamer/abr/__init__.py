"""Adaptive bitrate: the pure bitrate controller, the quality ladder, the control loop."""
