"""rasd.dynamo.retry, the pure retry policy, against botocore's standard mode itself: the same
errors are retryable, the same delays come from the same random numbers, the same quota is spent and
refunded. No clock, no sleep, no I/O."""

from __future__ import annotations

import functools
import random
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import (
    ChecksumError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)
from botocore.retries import quota as bquota
from botocore.retries import standard

from rasd.dynamo.retry import (
    CONFLICT_CODES,
    EXPIRED_TOKEN_CODES,
    MIN_ATTEMPT,
    THROTTLE_CODES,
    Failure,
    RetryPolicy,
    RetryQuota,
    attempt_budget,
    classify_code,
    classify_exception,
)


@functools.cache
def _ddb_model() -> Any:
    import botocore.session

    return botocore.session.get_session().get_service_model("dynamodb")


def _context(attempt: int, code: str | None = None, status: int = 400, exc: Any = None) -> Any:
    response = None
    parsed = None
    if exc is None:
        response = AWSResponse("https://x", status, {}, None)
        parsed = {"Error": {"Code": code}} if code else {}
    return standard.RetryContext(
        attempt_number=attempt,
        operation_model=_ddb_model().operation_model("UpdateItem"),
        parsed_response=parsed,
        http_response=response,
        caught_exception=exc,
        request_context={},
    )


def test_every_error_botocore_retries_is_retried() -> None:
    """botocore's standard mode lists (throttles, transient codes and statuses) and DynamoDB's
    modeled retryable errors are all retryable here; a new one in botocore fails this test."""
    checker = standard.StandardRetryConditions(max_attempts=3)
    codes = set(standard.ThrottledRetryableChecker._THROTTLED_ERROR_CODES)
    codes |= set(standard.TransientRetryableChecker._TRANSIENT_ERROR_CODES)
    model = _ddb_model()
    modeled = {n for n in model.shape_names if "retryable" in model.shape_for(n).metadata}
    assert "ReplicatedWriteConflictException" in modeled
    for code in codes | modeled:
        if code in modeled:
            assert checker.is_retryable(_context(1, code)), code
        assert classify_code(code, 400).retryable, code
    for status in standard.TransientRetryableChecker._TRANSIENT_STATUS_CODES:
        assert checker.is_retryable(_context(1, None, status))
        assert classify_code("", status) is Failure.TRANSIENT
    assert {"TransactionInProgressException", "ReplicatedWriteConflictException"} <= CONFLICT_CODES
    assert classify_code("TransactionInProgressException", 400) is Failure.CONFLICT
    for code in ("ValidationException", "ResourceNotFoundException", "AccessDeniedException"):
        assert not checker.is_retryable(_context(1, code))
        assert classify_code(code, 400) is Failure.FATAL
    for code in EXPIRED_TOKEN_CODES:
        assert classify_code(code, 400) is Failure.EXPIRED_TOKEN
    assert THROTTLE_CODES.isdisjoint(CONFLICT_CODES)


@pytest.mark.parametrize(
    ("exc", "failure"),
    [
        (ReadTimeoutError(endpoint_url="u"), Failure.TIMEOUT),
        (TimeoutError(), Failure.TIMEOUT),
        (ConnectTimeoutError(endpoint_url="u"), Failure.CONNECT_TIMEOUT),
        (EndpointConnectionError(endpoint_url="u"), Failure.CONNECTION),
        (ConnectionClosedError(endpoint_url="u"), Failure.CONNECTION),
        (
            ChecksumError(checksum_type="crc32", expected_checksum="1", actual_checksum="2"),
            Failure.CONNECTION,
        ),
        (ConnectionResetError(), Failure.CONNECTION),
        (NoCredentialsError(), Failure.FATAL),
    ],
)
def test_exceptions_as_botocore_classifies_them(exc: Exception, failure: Failure) -> None:
    assert classify_exception(exc) is failure
    if not isinstance(exc, TimeoutError | ChecksumError | ConnectionResetError):
        retryable = standard.StandardRetryConditions().is_retryable(_context(1, exc=exc))
        assert retryable == failure.retryable


def test_delays_equal_botocores_for_the_same_random_numbers() -> None:
    """Exponential backoff, full jitter, base 2, capped at 20 s: botocore's formula."""
    draws = [random.Random(7).random() for _ in range(1)] + [0.0, 0.5, 0.999, 1.0 - 1e-9]
    for r in draws:
        theirs = standard.ExponentialBackoff(random=lambda r=r: r)
        ours = RetryPolicy(rng=lambda r=r: r)
        for attempt in range(1, 10):
            assert ours.delay(attempt) == theirs.delay_amount(_context(attempt, "Throttling"))
    assert RetryPolicy(rng=lambda: 0.999).delay(9) == pytest.approx(0.999 * 20)


def test_attempts_and_quota_follow_botocore() -> None:
    """A long scripted run of failures and successes: the same retry decisions and the same
    quota left as botocore's RetryQuotaChecker after every step (until it runs dry)."""
    rng = random.Random(3)
    theirs_quota = standard.RetryQuotaChecker(bquota.RetryQuota())
    conditions = standard.StandardRetryConditions(max_attempts=3)
    ours = RetryPolicy(3, rng=lambda: 0.0)
    exhausted = False
    for _call in range(400):
        attempt, cost, request_context = 1, 0, {}
        while True:
            kind = rng.choice(["ok", "ok", "throttle", "500", "timeout"])
            if kind == "ok":
                ours.succeeded(cost)
                ok = AWSResponse("https://x", 200, {}, None)
                theirs_quota.release_retry_quota(request_context, ok)
                break
            if kind == "timeout":
                ctx = _context(attempt, exc=ReadTimeoutError(endpoint_url="u"))
                failure = Failure.TIMEOUT
            else:
                code, status = ("ThrottlingException", 400) if kind == "throttle" else ("", 500)
                ctx = _context(attempt, code or None, status)
                failure = classify_code(code, status)
            ctx.request_context = request_context
            theirs = conditions.is_retryable(ctx) and theirs_quota.acquire_retry_quota(ctx)
            decision = ours.after_failure(attempt, failure, now=0.0, deadline=1e9)
            assert decision.retry == theirs, (attempt, kind)
            assert ours.quota.available == theirs_quota._quota.available_capacity
            exhausted = exhausted or decision.reason == "quota"
            if not decision.retry:
                break
            cost = decision.cost
            attempt += 1
    assert exhausted, "the script never drained the quota"


def test_the_deadline_bounds_retries_and_refunds_the_quota() -> None:
    """Far from the deadline the delay is botocore's; near it the jitter's range shrinks to
    the time left less ``min_attempt`` (the retry is still made); with no time left for an
    attempt no retry is made and its quota is given back."""
    policy = RetryPolicy(3, rng=lambda: 0.5)
    d = policy.after_failure(1, Failure.THROTTLE, now=10.0, deadline=10.05)
    assert not d.retry and d.reason == "deadline"
    assert policy.quota.available == 500
    d = policy.after_failure(1, Failure.THROTTLE, now=10.0, deadline=10.4)
    assert d.retry and d.delay == pytest.approx(0.15) and d.cost == 5  # 0.5 x (0.4 - 0.1)
    assert policy.quota.available == 495
    d = policy.after_failure(1, Failure.THROTTLE, now=10.0, deadline=20.0)
    assert d.retry and d.delay == 0.5 and policy.quota.available == 490  # botocore's
    d = policy.after_failure(2, Failure.TIMEOUT, now=10.0, deadline=20.0)
    assert d.retry and d.delay == 1.0 and d.cost == 10
    assert policy.after_failure(3, Failure.TIMEOUT, 10.0, 20.0).reason == "max_attempts"
    policy.succeeded(10)
    assert policy.quota.available == 490


def test_not_retried() -> None:
    policy = RetryPolicy(5, rng=lambda: 0.0)
    for failure in (Failure.FATAL, Failure.EXPIRED_TOKEN):
        assert policy.after_failure(1, failure, 0.0, 1e9).reason == "not_retryable"
    assert RetryPolicy(1).after_failure(1, Failure.THROTTLE, 0.0, 1e9).reason == "max_attempts"
    with pytest.raises(ValueError):
        RetryPolicy(0)
    q = RetryQuota(10)
    assert q.acquire(10) and not q.acquire(1)
    q.release(100)
    assert q.available == 10


def test_an_attempt_gets_its_share_of_the_time_left() -> None:
    """A share of the time left, so that a hung attempt leaves time for a retry or a
    read-back; never under MIN_ATTEMPT unless less is left; all of it at a share of 1."""
    assert attempt_budget(1.0) == pytest.approx(0.6)
    assert attempt_budget(0.15) == pytest.approx(MIN_ATTEMPT)
    assert attempt_budget(0.05) == pytest.approx(0.05)
    assert attempt_budget(1.0, share=0.9) == pytest.approx(0.9)
    assert attempt_budget(1.0, share=1.0) == 1.0
    assert attempt_budget(30.0, share=1.0) == 30.0
