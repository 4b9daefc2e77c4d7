"""rasd.devtools.motoserver: moto's writes, Queries and Scans run one at a time."""

from __future__ import annotations

import threading

import pytest

from rasd.devtools import motoserver


@pytest.mark.parametrize("op", motoserver.WRITE_OPS + motoserver.READ_OPS)
def test_operation_waits_for_the_lock(op: str) -> None:
    """While another thread holds the lock, the operation does not start. A Query walking
    the index next to a claim removing ``lease_available`` made moto's sort raise KeyError."""
    from moto.dynamodb.models import DynamoDBBackend

    motoserver.make_writes_atomic()
    method = getattr(DynamoDBBackend, op)
    holding, release = threading.Event(), threading.Event()
    passed: list[str] = []

    def holder() -> None:
        with motoserver._LOCK:
            holding.set()
            release.wait(10)

    def caller() -> None:
        try:
            method(object())  # the real operation fails at once on this stand-in backend
            passed.append("returned")
        except Exception as exc:  # noqa: BLE001 - any failure: it got past the lock
            passed.append(type(exc).__name__)

    h = threading.Thread(target=holder)
    h.start()
    assert holding.wait(10)
    c = threading.Thread(target=caller)
    c.start()
    c.join(0.2)
    waited = c.is_alive()
    release.set()
    h.join(10)
    c.join(10)
    assert waited, f"{op} ran while the lock was held"
    assert passed  # and ran once it was released
