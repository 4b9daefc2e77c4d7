"""When to retry a DynamoDB call, and after how long: botocore's standard retry mode, pure.

A failed attempt is classified (:func:`classify_code`, :func:`classify_exception`) into a
:class:`Failure`; :class:`RetryPolicy` and the shared :class:`RetryQuota` decide whether and
when to try again within the request's deadline. Time and randomness are passed in. The
rules: docs/operations.md, "Load shedding and limits"; docs/design.md, I4.
"""

from __future__ import annotations

import enum
import random
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

#: botocore's standard mode: throttling error codes (ThrottledRetryableChecker).
THROTTLE_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "RequestThrottled",
        "SlowDown",
        "PriorRequestNotComplete",
        "EC2ThrottledException",
    }
)
#: Refusals because another writer holds the item: in botocore's standard mode as a throttle
#: (TransactionInProgressException) or as modeled retryable in DynamoDB's service model
#: (ReplicatedWriteConflictException); TransactionConflictException rasd retries beyond
#: botocore (an item in another client's transaction). Nothing was applied.
CONFLICT_CODES = frozenset(
    {
        "TransactionInProgressException",
        "ReplicatedWriteConflictException",
        "TransactionConflictException",
    }
)
#: botocore's standard mode: transient error codes and HTTP statuses (TransientRetryableChecker),
#: plus DynamoDB's own 5xx error types (which come with a 500 or 503 anyway).
TRANSIENT_CODES = frozenset(
    {
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalServerError",
        "InternalFailure",
        "ServiceUnavailable",
        "ServiceUnavailableException",
    }
)
TRANSIENT_STATUSES = frozenset({500, 502, 503, 504})
#: The session's credentials expired: refresh them (off the event loop) and try once more.
EXPIRED_TOKEN_CODES = frozenset({"ExpiredTokenException", "ExpiredToken"})

DEFAULT_MAX_ATTEMPTS = 3
BACKOFF_BASE = 2.0
MAX_BACKOFF = 20.0
#: Time an attempt needs at the least: a retry with less left before the deadline is not made.
MIN_ATTEMPT = 0.1
#: The share of the time left an attempt may use by default (``ddb_attempt_share``).
ATTEMPT_SHARE = 0.6
QUOTA_CAPACITY = 500
RETRY_COST = 5
TIMEOUT_RETRY_COST = 10
NO_RETRY_INCREMENT = 1


class Failure(enum.Enum):
    """What a failed attempt was. ``retryable``: worth another attempt under the policy;
    ``may_have_applied``: a write that met it may have been applied by DynamoDB."""

    #: DynamoDB refused for capacity (per partition or account): nothing applied.
    THROTTLE = ("throttle", True, False)
    #: DynamoDB refused because another writer holds the item: nothing applied.
    CONFLICT = ("conflict", True, False)
    #: a 5xx or a transient error code: DynamoDB may have applied the write.
    TRANSIENT = ("transient", True, True)
    #: sent, no answer in time (read timeout): may have applied. A retry costs more quota.
    TIMEOUT = ("timeout", True, True)
    #: the connection failed or the answer was unreadable: may have applied (unless the store
    #: can tell that nothing was sent).
    CONNECTION = ("connection", True, True)
    #: connecting took too long: nothing was sent. A retry costs as much as after a timeout.
    CONNECT_TIMEOUT = ("connect_timeout", True, False)
    #: the credentials expired: nothing applied; retried once after a forced refresh.
    EXPIRED_TOKEN = ("expired_token", False, False)
    #: anything else (validation, access denied, a missing table): not retried.
    FATAL = ("fatal", False, False)

    def __init__(self, label: str, retryable: bool, may_have_applied: bool) -> None:
        self.label = label
        self.retryable = retryable
        self.may_have_applied = may_have_applied

    @property
    def is_timeout(self) -> bool:
        """Does a retry after it cost TIMEOUT_RETRY_COST (botocore: ConnectTimeoutError and
        ReadTimeoutError)?"""
        return self is Failure.TIMEOUT or self is Failure.CONNECT_TIMEOUT


def classify_code(code: str, status: int) -> Failure:
    """An error answer from DynamoDB (its short ``__type`` and HTTP status)."""
    if code in THROTTLE_CODES:
        return Failure.THROTTLE
    if code in CONFLICT_CODES:
        return Failure.CONFLICT
    if code in EXPIRED_TOKEN_CODES:
        return Failure.EXPIRED_TOKEN
    if code in TRANSIENT_CODES or status in TRANSIENT_STATUSES:
        return Failure.TRANSIENT
    return Failure.FATAL


def classify_exception(exc: BaseException) -> Failure:
    """An attempt that got no answer: what botocore's standard mode makes of the exception
    (ConnectionError and HTTPClientError are transient; the DynamoDB checksum check too)."""
    from botocore.exceptions import (
        ChecksumError,
        ConnectionError,
        ConnectTimeoutError,
        HTTPClientError,
        ReadTimeoutError,
    )

    if isinstance(exc, ConnectTimeoutError):
        return Failure.CONNECT_TIMEOUT
    if isinstance(exc, ReadTimeoutError | TimeoutError):
        return Failure.TIMEOUT
    if isinstance(exc, ConnectionError | HTTPClientError | ChecksumError | OSError):
        return Failure.CONNECTION
    return Failure.FATAL


def attempt_budget(left: float, share: float = ATTEMPT_SHARE) -> float:
    """How long one attempt may wait for its answer with ``left`` seconds to the deadline:
    ``share`` of it, so that an attempt that hangs leaves time for a retry or a read-back,
    but never less than MIN_ATTEMPT (all of ``left`` when less is left)."""
    if left < MIN_ATTEMPT or share >= 1.0:
        return left
    return max(MIN_ATTEMPT, left * share)


def request_id(rid: str) -> str:
    """The request id for a message (empty when DynamoDB never answered)."""
    return f" (request id {rid})" if rid else ""


class AttemptFailure(NamedTuple):
    """What a failed attempt was (:func:`attempt_failed`)."""

    failure: Failure
    #: the request was never on the wire: a write that met it did not apply
    never_sent: bool
    #: short, for counters and logs: DynamoDB's error code, or the exception's class
    reason: str
    #: the message
    detail: str
    #: the request id of DynamoDB's last error answer
    request_id: str


def attempt_failed(exc: BaseException, rid: str) -> AttemptFailure:
    """What a failed attempt was; the request id is ``rid`` when this answer has none."""
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        rid = exc.response.get("ResponseMetadata", {}).get("RequestId") or rid
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        status = status if isinstance(status, int) else 0
        reason = code or str(status)
        message = exc.response.get("Error", {}).get("Message", "")
        return AttemptFailure(
            classify_code(code, status),
            False,
            reason,
            f"{reason}: {message}" if message else reason,
            rid,
        )
    if isinstance(exc, TimeoutError):
        return AttemptFailure(Failure.TIMEOUT, False, "timeout", "no answer", rid)
    reason, detail = type(exc).__name__, f"{type(exc).__name__}: {exc}"
    cause = getattr(exc, "kwargs", {}).get("error")
    if cause is not None and str(cause) not in detail:
        detail = f"{detail} ({cause})"  # botocore's text leaves out why
    return AttemptFailure(classify_exception(exc), never_sent(exc), reason, detail, rid)


def never_sent(exc: BaseException) -> bool:
    """Did this failure happen before the request was on the wire (so a write that met it did
    not apply)? Only connection set-up failures qualify. aiobotocore also maps aiohttp's
    generic connection errors, a reset after the request went out among them, to
    EndpointConnectionError, so that class alone proves nothing: its cause must be a connect
    error (the lean client's causes are all of that kind: ``rasd.dynamo.http1.ConnectFailed``)."""
    from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError, SSLError

    from .http1 import ConnectFailed

    if isinstance(exc, ConnectTimeoutError):
        return True
    if not isinstance(exc, EndpointConnectionError | SSLError):
        return False
    cause = getattr(exc, "kwargs", {}).get("error")
    if isinstance(cause, ConnectionRefusedError | socket.gaierror | ConnectFailed):
        return True
    aiohttp = sys.modules.get("aiohttp")  # imported only by the botocore path
    return aiohttp is not None and isinstance(cause, aiohttp.ClientConnectorError)


class RetryQuota:
    """botocore's retry quota (``botocore.retries.quota``): a bucket of tokens that retries
    spend and successes refill, shared by all calls of one client."""

    __slots__ = ("available", "capacity")

    def __init__(self, capacity: int = QUOTA_CAPACITY) -> None:
        self.capacity = capacity
        self.available = capacity

    def acquire(self, amount: int) -> bool:
        if amount > self.available:
            return False
        self.available -= amount
        return True

    def release(self, amount: int) -> None:
        if self.available != self.capacity:  # full (the usual case): nothing to do
            self.available = min(self.capacity, self.available + amount)

    def __repr__(self) -> str:
        return f"RetryQuota({self.available}/{self.capacity})"


@dataclass(frozen=True, slots=True)
class Decision:
    """Retry after ``delay`` seconds (``retry``), or give up for ``reason``: "not_retryable",
    "max_attempts", "quota", "deadline". ``cost`` is the quota a retry took."""

    retry: bool
    delay: float = 0.0
    reason: str = ""
    cost: int = 0


class RetryPolicy:
    """botocore's standard retry mode with the request's deadline on top (module docstring).

    ``rng`` returns a float in [0, 1) (``random.random``); tests pass their own."""

    __slots__ = ("max_attempts", "max_backoff", "min_attempt", "quota", "rng")

    def __init__(
        self,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        *,
        rng: Callable[[], float] = random.random,
        max_backoff: float = MAX_BACKOFF,
        quota: RetryQuota | None = None,
        min_attempt: float = MIN_ATTEMPT,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.max_attempts = max_attempts
        self.rng = rng
        self.max_backoff = max_backoff
        self.min_attempt = min_attempt
        self.quota = quota if quota is not None else RetryQuota()

    def delay(self, attempt: int, room: float = float("inf")) -> float:
        """The wait before attempt ``attempt + 1`` (``attempt`` counts from 1): full jitter
        over botocore's exponential range, or over ``room`` when that is shorter."""
        return self.rng() * min(BACKOFF_BASE ** (attempt - 1), self.max_backoff, room)

    def after_failure(
        self, attempt: int, failure: Failure, now: float, deadline: float
    ) -> Decision:
        """Attempt ``attempt`` (from 1) failed with ``failure`` at ``now``: retry or not?"""
        if not failure.retryable:
            return Decision(False, reason="not_retryable")
        if attempt >= self.max_attempts:
            return Decision(False, reason="max_attempts")
        cost = TIMEOUT_RETRY_COST if failure.is_timeout else RETRY_COST
        if not self.quota.acquire(cost):
            return Decision(False, reason="quota")
        room = deadline - now - self.min_attempt
        if room <= 0:
            self.quota.release(cost)  # no retry was made
            return Decision(False, reason="deadline")
        return Decision(True, delay=self.delay(attempt, room), cost=cost)

    def succeeded(self, last_cost: int) -> None:
        """A call succeeded; ``last_cost`` is what its last retry took (0: no retry)."""
        self.quota.release(last_cost or NO_RETRY_INCREMENT)

    def __repr__(self) -> str:
        return f"RetryPolicy(max_attempts={self.max_attempts}, {self.quota!r})"
