"""rasd.devtools.motoserver: moto's writes, Queries and Scans run one at a time."""

from __future__ import annotations

import random
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


def test_delay_from_env() -> None:
    """Unset: no delay; a mean alone, stalls alone or both; nonsense is refused, naming both."""
    assert motoserver.delay_from_env({}) is None
    assert motoserver.delay_from_env({"RASD_MOTO_DELAY": "0.005"}) == (0.005, 0.0, 0.0)
    got = motoserver.delay_from_env({"RASD_MOTO_DELAY": "0.01", "RASD_MOTO_STALLS": "0.02:0.5"})
    assert got == (0.01, 0.02, 0.5)
    assert motoserver.delay_from_env({"RASD_MOTO_STALLS": "1:2"}) == (0.0, 1.0, 2.0)
    for env in ({"RASD_MOTO_DELAY": "x"}, {"RASD_MOTO_STALLS": "2:1"}, {"RASD_MOTO_DELAY": "-1"}):
        with pytest.raises(ValueError, match=r"RASD_MOTO_DELAY=.*RASD_MOTO_STALLS="):
            motoserver.delay_from_env(env)


def test_delayed_waits_before_each_request_then_answers() -> None:
    """Each request waits within [0, 2 x mean], plus the stall for the share drawn."""
    waits: list[float] = []
    answered: list[str] = []

    def app(environ: dict[str, str], start_response: object) -> list[bytes]:
        answered.append(environ["PATH_INFO"])
        return [b"ok"]

    rng = random.Random(1)
    d = motoserver.Delayed(app, 0.01, 0.25, 3.0, sleep=waits.append, rng=rng)
    for i in range(400):
        assert d({"PATH_INFO": f"/{i}"}, None) == [b"ok"]
    assert answered == [f"/{i}" for i in range(400)] and len(waits) == 400
    plain = [w for w in waits if w < 3.0]
    stalled = [w - 3.0 for w in waits if w >= 3.0]
    assert all(0 <= w <= 0.02 for w in plain + stalled)
    assert 60 < len(stalled) < 140  # about a quarter (the seed fixes the draws)
    assert max(plain) > 0.015 and min(plain) < 0.005  # spread over the range
