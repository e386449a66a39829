"""Canary rollout: a pure judge (``policy``) and the thin loop and API service that apply it (``service``)."""
