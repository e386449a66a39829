"""Domain errors with stable codes.

Every failure a client can cause or observe is one of these classes.  They carry
an HTTP status *hint* and an optional ``field`` naming the offending input, but
import nothing from aiohttp: ``broker.app``'s problem middleware is the one place that maps
them to responses (RFC 9457 problem bodies).

Invariant: ``code`` strings are stable API; clients may switch on them.
"""

from __future__ import annotations

from typing import Any


class BrokerError(Exception):
    """Base class: ``code`` is stable, ``status`` is the HTTP status to answer with."""

    code = "broker_error"
    status = 500
    title = "Internal error"

    def __init__(self, detail: str, *, field: str | None = None, extra: dict[str, Any] | None = None):
        super().__init__(detail)
        self.detail = detail
        self.field = field
        self.extra = extra or {}

    def problem(self) -> dict[str, Any]:
        """The JSON problem body for this error."""
        body: dict[str, Any] = {
            "type": f"urn:render-broker:problem:{self.code}",
            "title": self.title,
            "status": self.status,
            "code": self.code,
            "detail": self.detail,
        }
        if self.field is not None:
            body["field"] = self.field
        body.update(self.extra)
        return body


class ValidationError(BrokerError):
    code = "invalid_input"
    status = 422
    title = "Invalid input"


class MalformedBody(BrokerError):
    code = "malformed_body"
    status = 400
    title = "Malformed request body"


class PayloadTooLarge(BrokerError):
    code = "payload_too_large"
    status = 413
    title = "Request body too large"


class Unauthorized(BrokerError):
    code = "unauthorized"
    status = 401
    title = "Missing or invalid credentials"


class Forbidden(BrokerError):
    code = "forbidden"
    status = 403
    title = "Not allowed"


class ShareRevoked(Forbidden):
    """The session's owner (or an admin) revoked the share this token belongs to, or the session ended."""

    code = "share_revoked"
    title = "Share revoked"


class NotFound(BrokerError):
    code = "not_found"
    status = 404
    title = "Not found"


class Conflict(BrokerError):
    code = "conflict"
    status = 409
    title = "Conflict"


class HostRetired(BrokerError):
    """An admin or the autoscaler removed this host: its node must stop, not register again."""

    code = "host_retired"
    status = 410
    title = "Host retired"


class QueueFull(BrokerError):
    code = "queue_full"
    status = 429
    title = "Pool queue is full"


class Unavailable(BrokerError):
    code = "unavailable"
    status = 503
    title = "A backing service is unavailable"
