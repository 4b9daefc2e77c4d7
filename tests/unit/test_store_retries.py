"""The store's retries on the wire, against a scripted loopback DynamoDB and against botocore's
standard mode on the very same script: the same number of attempts, the same delays from the
same random numbers. Also: throttles reach the circuit breaker, conflicts are retried, the
ambiguity of a write is kept per error, an expired token forces a credential refresh, and the
request id is in every message and log line about a failed call.

Sleeps are recorded, not slept, and the store's clock is a fake one that only the recorded
sleeps advance: no test here depends on how fast the machine is."""

from __future__ import annotations

import asyncio
import logging
import random
import types
import zlib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import boto3
import orjson
import pytest
import structlog
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError, NoCredentialsError

import rasd.dynamo.ddb
import rasd.dynamo.store
from rasd.config import Config
from rasd.core.decide import Outcome
from rasd.core.errors import Timeout, Unavailable
from rasd.core.writes import Cond, Write
from rasd.dynamo.store import Store

pytestmark = pytest.mark.usefixtures("one_botocore_loader")

SEED = 7


@dataclass
class Answer:
    status: int = 200
    code: str = ""
    body: bytes | None = None

    def encode(self, rid: str) -> bytes:
        if self.body is not None:
            body = self.body
        elif self.code:
            body = orjson.dumps(
                {"__type": f"com.amazonaws.dynamodb.v20120810#{self.code}", "message": "scripted"}
            )
        else:
            body = b'{"Attributes": {"n": {"N": "1"}}}'
        return (
            f"HTTP/1.1 {self.status} X\r\nContent-Type: application/x-amz-json-1.0\r\n"
            f"Content-Length: {len(body)}\r\nx-amz-crc32: {zlib.crc32(body)}\r\n"
            f"x-amzn-RequestId: {rid}\r\n\r\n"
        ).encode() + body


THROTTLE = Answer(400, "ProvisionedThroughputExceededException")
HANG = Answer(0)  # the server reads the request and never answers it
OK = Answer()


@dataclass
class Script:
    """What the server answers, in order (then 200 OK); what it was asked."""

    answers: list[Answer]
    requests: list[dict[str, str]] = field(default_factory=list)

    def next(self) -> tuple[Answer, str]:
        rid = f"RID-{len(self.requests)}"
        return (self.answers.pop(0) if self.answers else OK), rid


@asynccontextmanager
async def scripted(script: Script) -> AsyncIterator[str]:
    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                headers = {}
                for line in head.decode().split("\r\n")[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                await r.readexactly(int(headers.get("content-length", "0")))
                answer, rid = script.next()
                script.requests.append(headers)
                if answer is HANG:  # no answer: wait for the client to give up and close
                    await r.read()
                    break
                w.write(answer.encode(rid))
                await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()

    srv = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.close()


class FakeTime:
    """The store's clock: the real one plus every recorded sleep."""

    def __init__(self) -> None:
        import time

        self._real = time.monotonic
        self.offset = 0.0

    def monotonic(self) -> float:
        return self._real() + self.offset

    def freeze(self) -> None:
        """Real time stands still from now: only the recorded sleeps move the clock (a test
        whose figures depend on the time left must not see a loaded machine's delays)."""
        base = self._real()
        self._real = lambda: base


@pytest.fixture
def fake_time(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeTime]:
    ft = FakeTime()
    monkeypatch.setattr(rasd.dynamo.store, "time", types.SimpleNamespace(monotonic=ft.monotonic))
    yield ft


@asynccontextmanager
async def store_on(
    url: str, fake_time: FakeTime, rng: Any = None, **cfg: Any
) -> AsyncIterator[tuple[Store, list[float]]]:
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)
        fake_time.offset += s

    store = Store(
        Config(table="t", endpoint_url=url, **cfg).validate(),
        rng=rng or random.Random(SEED).random,
        sleep=sleep,
    )
    await store.start()
    try:
        yield store, slept
    finally:
        await store.close()


def botocore_run(
    url: str, answers: list[Answer], op: str = "UpdateItem"
) -> tuple[int, list[float]]:
    """botocore's standard mode on the same script: (attempts, delays), with the global
    random generator (which botocore's backoff draws from) seeded as rasd's."""
    import botocore.endpoint

    delays: list[float] = []
    with pytest.MonkeyPatch.context() as m:
        m.setattr(botocore.endpoint.time, "sleep", delays.append)
        client = boto3.client(
            "dynamodb",
            endpoint_url=url,
            region_name="us-east-1",
            config=BotoConfig(retries={"mode": "standard"}),
        )
        random.seed(SEED)
        try:
            if op == "UpdateItem":
                client.update_item(TableName="t", Key={"k": {"S": "a"}})
            else:
                client.get_item(TableName="t", Key={"k": {"S": "a"}})
        except ClientError:
            pass
    return len(delays) + 1, delays


def _answers(*specs: Answer) -> list[Answer]:
    return list(specs)


SCRIPTS = {
    "2 throttles": _answers(THROTTLE, THROTTLE),
    "5 throttles": _answers(*[THROTTLE] * 5),
    "500 503 502 504": _answers(
        Answer(500, "InternalServerError"), Answer(503), Answer(502), Answer(504)
    ),
    "html 502 page": _answers(Answer(502, body=b"<html>bad gateway</html>")),
    "ThrottlingException": _answers(Answer(400, "ThrottlingException")),
    "RequestLimitExceeded x3": _answers(*[Answer(400, "RequestLimitExceeded")] * 3),
    "TransactionInProgress": _answers(Answer(400, "TransactionInProgressException")),
    "ReplicatedWriteConflict x2": _answers(*[Answer(400, "ReplicatedWriteConflictException")] * 2),
    "ValidationException": _answers(Answer(400, "ValidationException")),
}


@pytest.mark.parametrize("name", list(SCRIPTS))
async def test_attempts_and_delays_equal_botocores(name: str, fake_time: FakeTime) -> None:
    """The same scripted errors through botocore (standard mode) and through the store: the
    same attempts, and the same delays from the same random numbers."""
    theirs_script = Script(list(SCRIPTS[name]))
    async with scripted(theirs_script) as url:
        attempts, delays = await asyncio.to_thread(botocore_run, url, theirs_script.answers)
    assert attempts == len(theirs_script.requests)
    ours_script = Script(list(SCRIPTS[name]))
    async with scripted(ours_script) as url, store_on(url, fake_time) as (store, slept):
        try:
            await store._call("UpdateItem", fake_time.monotonic() + 60.0, Key={"k": {"S": "a"}})
        except Unavailable as exc:
            print("rasd:", exc.message)
    print(
        f"{name}: botocore {attempts} attempts, delays {[round(d, 3) for d in delays]}; "
        f"rasd {len(ours_script.requests)} attempts, delays {[round(d, 3) for d in slept]}"
    )
    assert len(ours_script.requests) == attempts
    assert slept == pytest.approx(delays)


async def test_max_attempts_from_the_environment(
    fake_time: FakeTime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AWS_MAX_ATTEMPTS means the same to both."""
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "5")
    script = Script([THROTTLE] * 9)
    async with scripted(script) as url:
        attempts, delays = await asyncio.to_thread(botocore_run, url, script.answers)
    assert attempts == 5
    script = Script([THROTTLE] * 9)
    async with scripted(script) as url, store_on(url, fake_time) as (store, slept):
        with pytest.raises(Unavailable, match="after 5 attempts"):
            await store._call("UpdateItem", fake_time.monotonic() + 60.0)
    assert len(script.requests) == 5 and slept == pytest.approx(delays)


async def test_a_one_second_deadline_bounds_the_retries(fake_time: FakeTime) -> None:
    """With the default 1 s deadline: botocore's three attempts, the jitter's range shrunk to
    the time left (less the 0.1 s an attempt needs at the least), so every retry fits."""
    script = Script([THROTTLE] * 5)
    fake_time.freeze()
    async with scripted(script) as url, store_on(url, fake_time, rng=lambda: 0.5) as (store, slept):
        with pytest.raises(Unavailable):
            await store._call("UpdateItem", fake_time.monotonic() + 1.0)
    assert slept == pytest.approx([0.45, 0.225], abs=0.01)  # 0.5 x min(1, 0.9), 0.5 x min(2, 0.45)
    assert len(script.requests) == 3
    assert store.retry.quota.available == 490


async def test_throttles_open_the_breaker(fake_time: FakeTime) -> None:
    """Throttling counts for the circuit breaker: a throttled fleet backs off together."""
    script = Script([THROTTLE] * 3)
    async with (
        scripted(script) as url,
        store_on(url, fake_time, breaker_failures=3) as (
            store,
            _,
        ),
    ):
        with pytest.raises(Unavailable):
            await store._call("GetItem", fake_time.monotonic() + 60.0)
        assert store.breaker.state == "open"
        assert store.counters["ddb.throttles"] == 3


def _write() -> Write:
    return Write(key=("c", "r"), conds=(Cond("n", "not_exists"),), set=(("n", 1),))


@pytest.mark.parametrize(
    ("answers", "outcome"),
    [
        ([Answer(400, "ReplicatedWriteConflictException")], Outcome.APPLIED),
        ([Answer(400, "TransactionInProgressException")] * 2, Outcome.APPLIED),
        ([THROTTLE] * 3, Outcome.REJECTED),
        ([Answer(400, "ReplicatedWriteConflictException")] * 3, Outcome.REJECTED),
        ([THROTTLE, Answer(500), THROTTLE], Outcome.UNKNOWN),
        ([Answer(400, "RequestTimeoutException")] * 3, Outcome.UNKNOWN),
        ([Answer(400, "ValidationException")], Outcome.REJECTED),
    ],
    ids=[
        "conflict-then-ok",
        "in-progress-twice-then-ok",
        "throttled",
        "conflicted",
        "a-500-among-throttles",
        "request-timeouts",
        "validation",
    ],
)
async def test_write_outcome_per_error(
    fake_time: FakeTime, answers: list[Answer], outcome: Outcome
) -> None:
    """Conflicts with other writers are retried; a write met only by refusals (throttles,
    conflicts) did not apply (REJECTED); one that met a 5xx or a request timeout may have
    (UNKNOWN), never REJECTED."""
    script = Script(list(answers))
    async with scripted(script) as url, store_on(url, fake_time) as (store, _):
        res = await store.write(_write(), fake_time.monotonic() + 60.0)
    assert res.outcome is outcome, res


async def test_request_id_in_messages_and_log_lines(
    fake_time: FakeTime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # debug lines, whatever an earlier test configured (a level, a logger cached on first use)
    saved = structlog.get_config()
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        cache_logger_on_first_use=False,
    )
    monkeypatch.setattr(rasd.dynamo.store, "log", structlog.get_logger("rasd.dynamo.store"))
    script = Script([Answer(500, "InternalServerError")] * 3)
    try:
        async with scripted(script) as url, store_on(url, fake_time) as (store, _):
            with structlog.testing.capture_logs() as logs, pytest.raises(Unavailable) as err:
                await store._call("GetItem", fake_time.monotonic() + 60.0)
    finally:
        structlog.configure(**saved)
    assert "request id RID-2" in err.value.message  # what every error line about it quotes
    retries = [e for e in logs if e["event"] == "ddb_retry"]
    assert [e["request_id"] for e in retries] == ["RID-0", "RID-1"]
    assert [e["request_id"] for e in logs if e["event"] == "ddb_gave_up"] == ["RID-2"]


async def test_expired_token_forces_a_refresh_and_one_more_attempt(
    fake_time: FakeTime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ExpiredTokenException: the credentials are fetched again (in a thread) and the call
    is made once more with them; a second expiry is UNAVAILABLE, naming the request id."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKOLD")
    script = Script([Answer(400, "ExpiredTokenException")])
    async with scripted(script) as url, store_on(url, fake_time) as (store, slept):
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKNEW")  # what a refresh finds
        resp = await store._call("GetItem", fake_time.monotonic() + 60.0)
        assert resp is not None
        assert [r["authorization"].split("Credential=")[1][:5] for r in script.requests] == [
            "AKOLD",
            "AKNEW",
        ]
        assert slept == [] and store.client.credential_refreshes == 1
        script.answers[:] = [Answer(400, "ExpiredToken")] * 2
        with pytest.raises(Unavailable, match=r"did not help \(request id RID-3\)"):
            await store._call("GetItem", fake_time.monotonic() + 60.0)
        assert store.client.credential_refreshes == 2

        def no_credentials() -> None:
            raise NoCredentialsError()

        monkeypatch.setattr(rasd.dynamo.ddb, "resolve_credentials", no_credentials)
        script.answers[:] = [Answer(400, "ExpiredTokenException")]
        with pytest.raises(Unavailable, match=r"could not be refreshed: NoCredentialsError"):
            await store._call("GetItem", fake_time.monotonic() + 60.0)


@pytest.mark.parametrize("share, attempts", [(0.6, 2), (1.0, 1)])
async def test_a_hung_attempt_is_cut_at_its_share_of_the_time_left(
    share: float, attempts: int, fake_time: FakeTime
) -> None:
    """``ddb_attempt_share``: at 0.6 a hung attempt is cut with time left for a retry (which
    is answered); at 1.0 the one attempt waits until the deadline, and the call times out
    with no retry and no quota spent (``rasd dev``: moto is slow, not lossy)."""
    script = Script([HANG])
    async with (
        scripted(script) as url,
        store_on(url, fake_time, rng=lambda: 0.0, ddb_attempt_share=share) as (store, _),
    ):
        # 1.5 s: a cut at 0.9 s leaves the retry 0.36 s, time for a loopback answer under load
        deadline = fake_time.monotonic() + 1.5
        if attempts == 1:
            with pytest.raises(Timeout, match="no answer within the deadline"):
                await store._call("GetItem", deadline, Key={"k": {"S": "a"}})
            assert store.retry.quota.available == 500
        else:
            await store._call("GetItem", deadline, Key={"k": {"S": "a"}})
    assert len(script.requests) == attempts


async def test_a_callers_tiny_deadlines_do_not_open_the_breaker(fake_time: FakeTime) -> None:
    """An attempt that a caller's deadline gave less than 0.1 s and that timed out says
    nothing about DynamoDB: thirty of them leave the breaker closed for every other caller
    (counted as ``ddb.timeouts_cut_short``); attempts given their full time that hang do
    open it."""
    script = Script([HANG] * 32)
    async with (
        scripted(script) as url,
        store_on(url, fake_time, breaker_failures=2, ddb_attempt_share=1.0) as (store, _),
    ):
        for _ in range(30):  # 50 ms: an attempt of less than 0.1 s
            with pytest.raises(Timeout):
                await store._call("GetItem", fake_time.monotonic() + 0.05, Key={"k": {"S": "a"}})
        assert store.breaker.state == "closed"
        # every attempt made timed out (a call whose deadline passed before it could start
        # makes none; a loaded machine may stall a few that long)
        sent = store.counters["ddb.GetItem"]
        assert sent >= 20 and store.counters["ddb.timeouts_cut_short"] == sent
        assert store.counters["ddb.timeouts"] == 0
        for _ in range(2):
            with pytest.raises(Timeout):
                await store._call("GetItem", fake_time.monotonic() + 0.5, Key={"k": {"S": "a"}})
        assert store.breaker.state == "open"
        assert store.counters["ddb.timeouts"] == 2
