"""The one error hierarchy of rasd, shared by the daemon, the wire and the client (public:
``rasd_client.errors``).

Every error has a stable ``code`` (see docs/errors.md). The daemon raises these, the wire carries
``code`` and ``message``, and the client re-raises the matching subclass.
"""

from __future__ import annotations

from typing import ClassVar


class RasdError(Exception):
    """Root of every rasd error. ``code`` is stable and goes over the wire and into logs."""

    code: ClassVar[str] = "INTERNAL"

    def __init__(self, message: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(message or self.code)
        self.message = message or self.code
        #: Seconds after which a retry may succeed (set with BUSY from the rate limiter).
        self.retry_after = retry_after

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class BadRequest(RasdError):
    code = "BAD_REQUEST"


class UnknownPool(RasdError):
    code = "UNKNOWN_POOL"


class NoCapacity(RasdError):
    code = "NO_CAPACITY"


class Busy(RasdError):
    code = "BUSY"


class Timeout(RasdError):
    code = "TIMEOUT"


class Unavailable(RasdError):
    code = "UNAVAILABLE"


class Forbidden(RasdError):
    code = "FORBIDDEN"


class NotHeld(RasdError):
    code = "NOT_HELD"


class Internal(RasdError):
    code = "INTERNAL"


ERRORS_BY_CODE: dict[str, type[RasdError]] = {
    cls.code: cls
    for cls in (
        BadRequest,
        UnknownPool,
        NoCapacity,
        Busy,
        Timeout,
        Unavailable,
        Forbidden,
        NotHeld,
        Internal,
    )
}


def error_from_wire(code: str, message: str, retry_after: float | None = None) -> RasdError:
    """Build the exception for a wire error; an unknown code becomes a plain RasdError."""
    cls = ERRORS_BY_CODE.get(code)
    if cls is None:
        err = RasdError(f"{code}: {message}", retry_after=retry_after)
        return err
    return cls(message, retry_after=retry_after)
