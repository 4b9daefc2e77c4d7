"""rasd.dynamo.ddb without DynamoDB: SigV4 equal to botocore's, serialization, error mapping,
and the connection pool's behaviour against tiny local servers (loopback only)."""

from __future__ import annotations

import asyncio
import datetime
import json
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any
from unittest import mock

import orjson
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials as BotoCreds
from botocore.credentials import RefreshableCredentials
from botocore.exceptions import (
    ChecksumError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from rasd.config import Config
from rasd.dynamo import ddb, http1, sigv4
from rasd.dynamo.retry import never_sent as _never_sent

WHEN = datetime.datetime(2024, 3, 9, 23, 59, 58, tzinfo=datetime.timezone.utc)
AMZ_DATE = "20240309T235958Z"


def _botocore_auth(url: str, region: str, body: bytes, target: str, token: str | None) -> str:
    creds = BotoCreds("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    req = AWSRequest(
        method="POST",
        url=url,
        data=body,
        headers={"Content-Type": sigv4.CONTENT_TYPE, "X-Amz-Target": target},
    )
    with mock.patch("botocore.auth.get_current_datetime", return_value=WHEN):
        SigV4Auth(creds, "dynamodb", region).add_auth(req)
    assert req.headers["X-Amz-Date"] == AMZ_DATE
    if token:
        assert req.headers["X-Amz-Security-Token"] == token
    return str(req.headers["Authorization"])


@pytest.mark.parametrize("token", [None, "FQoGZXIvYXdzEJr//////////token+/="])
@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("https://dynamodb.eu-west-1.amazonaws.com", "dynamodb.eu-west-1.amazonaws.com"),
        ("http://127.0.0.1:8000", "127.0.0.1:8000"),
    ],
)
def test_signature_equals_botocores(url: str, host: str, token: str | None) -> None:
    region = "eu-west-1"
    body = orjson.dumps({"TableName": "t", "Key": {"client_id": {"S": "ü#x"}}})
    target = "DynamoDB_20120810.GetItem"
    client = ddb.LeanDynamoDB(
        url,
        region,
        sigv4.Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token),
    )
    assert client._signer.host == host
    ours = client._signer.authorization(
        target, body, AMZ_DATE, "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token
    )
    assert ours == _botocore_auth(url, region, body, target, token)


def test_signing_key_is_derived_once_per_day_and_secret() -> None:
    s = sigv4.Signer("us-east-1", "h")
    k1 = s.signing_key("secret", "20240101")
    with mock.patch("hmac.digest", side_effect=AssertionError("derived again")):
        assert s.signing_key("secret", "20240101") is k1
    assert s.signing_key("secret", "20240102") != k1
    assert s.signing_key("other", "20240102") != k1


def test_request_head_and_body() -> None:
    client = ddb.LeanDynamoDB("http://localhost:9", "us-east-1", sigv4.Credentials("a", "b", "tok"))
    params = {"TableName": "t", "Key": {"k": {"S": "v"}}, "ConsistentRead": True, "Limit": 5}
    head, body = client.build("Query", params)
    assert orjson.loads(body) == params
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST / HTTP/1.1"
    assert head.endswith(b"\r\n\r\n")
    hdrs = dict(line.split(": ", 1) for line in lines[1:] if line)
    assert hdrs["Host"] == "localhost:9"
    assert hdrs["X-Amz-Target"] == "DynamoDB_20120810.Query"
    assert hdrs["Content-Type"] == "application/x-amz-json-1.0"
    assert hdrs["Content-Length"] == str(len(body))
    assert hdrs["X-Amz-Security-Token"] == "tok"
    assert hdrs["User-Agent"].startswith("rasd/")
    assert hdrs["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=a/")
    assert "x-amz-security-token" in hdrs["Authorization"]


def _client() -> ddb.LeanDynamoDB:
    return ddb.LeanDynamoDB("http://localhost:9", "us-east-1", sigv4.Credentials("a", "b", None))


def _hdrs(body: bytes, **extra: str) -> list[tuple[bytes, bytes]]:
    h = [(b"x-amzn-requestid", b"RID"), (b"x-amz-crc32", str(zlib.crc32(body)).encode())]
    return h + [(k.encode(), v.encode()) for k, v in extra.items()]


def test_parse_success() -> None:
    body = b'{"Items":[{"a":{"N":"1"}}],"Count":1,"LastEvaluatedKey":{"a":{"N":"1"}}}'
    resp = _client()._parse("Query", 200, _hdrs(body), body)
    assert resp["Items"] == [{"a": {"N": "1"}}] and resp["Count"] == 1
    assert resp["LastEvaluatedKey"] == {"a": {"N": "1"}}
    assert resp["ResponseMetadata"]["RequestId"] == "RID"


@pytest.mark.parametrize(
    ("status", "body", "code"),
    [
        (
            400,
            {
                "__type": "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException",
                "message": "The conditional request failed",
            },
            "ConditionalCheckFailedException",
        ),
        (
            400,
            {
                "__type": "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
                "message": "slow down",
            },
            "ProvisionedThroughputExceededException",
        ),
        (400, {"__type": "com.amazon.coral.validate#ValidationException", "Message": "bad"}, None),
        (500, {"__type": "com.amazonaws.dynamodb.v20120810#InternalServerError"}, None),
        (503, {}, "503"),
    ],
)
def test_parse_errors_raise_client_error(
    status: int, body: dict[str, Any], code: str | None
) -> None:
    raw = json.dumps(body).encode()
    with pytest.raises(ClientError) as ei:
        _client()._parse("UpdateItem", status, _hdrs(raw), raw)
    err = ei.value.response
    want = code or str(body["__type"]).rpartition("#")[2]
    assert err["Error"]["Code"] == want
    assert err["Error"]["Message"] == body.get(
        "message", body.get("Message", err["Error"]["Message"])
    )
    assert err["ResponseMetadata"]["HTTPStatusCode"] == status
    assert ei.value.operation_name == "UpdateItem"


def test_non_json_error_body_is_the_message_as_in_botocore() -> None:
    page = b"<html><h1>Internal Server Error</h1></html>"
    with pytest.raises(ClientError) as ei:
        _client()._parse("Query", 500, [], page)
    assert ei.value.response["Error"] == {"Code": "500", "Message": page.decode()}


def test_condition_failure_keeps_the_returned_item() -> None:
    raw = orjson.dumps(
        {
            "__type": "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException",
            "message": "The conditional request failed",
            "Item": {"k": {"S": "v"}},
        }
    )
    with pytest.raises(ClientError) as ei:
        _client()._parse("UpdateItem", 400, _hdrs(raw), raw)
    assert ei.value.response["Item"] == {"k": {"S": "v"}}  # type: ignore[typeddict-item]


def test_crc_mismatch_is_a_checksum_error() -> None:
    with pytest.raises(ChecksumError):
        _client()._parse("GetItem", 200, [(b"x-amz-crc32", b"1")], b"{}")


# ------------------------------------------------------------------ against local servers
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def _server(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A loopback TCP server; yields its URL and a list counting accepted connections."""
    accepted: list[int] = []

    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            await handler(r, w)
        finally:
            w.close()

    srv = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", accepted
    finally:
        srv.close()


async def _read_request(r: asyncio.StreamReader) -> bytes:
    head = await r.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.startswith(b"Content-Length")
    )
    return await r.readexactly(length)


async def _requests(r: asyncio.StreamReader) -> AsyncIterator[bytes]:
    """Each request's body on a kept-alive connection, until the client closes it."""
    while True:
        try:
            yield await _read_request(r)
        except asyncio.IncompleteReadError:
            return


def _echo(body: bytes) -> bytes:
    return orjson.dumps({"Echo": orjson.loads(body)["TableName"]})


def _response(body: bytes, close: bool = False) -> bytes:
    extra = b"Connection: close\r\n" if close else b""
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/x-amz-json-1.0\r\n"
        + f"Content-Length: {len(body)}\r\nx-amz-crc32: {zlib.crc32(body)}\r\n".encode()
        + extra
        + b"\r\n"
        + body
    )


def _lean(url: str, **kw: Any) -> ddb.LeanDynamoDB:
    return ddb.LeanDynamoDB(url, "us-east-1", sigv4.Credentials("a", "b", None), **kw)


async def test_keep_alive_reuses_one_connection() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        async for body in _requests(r):
            w.write(_response(_echo(body)))

    async with _server(handler) as (url, accepted):
        c = _lean(url)
        for i in range(3):
            assert (await c.get_item(TableName=f"t{i}"))["Echo"] == f"t{i}"
        await c.close()
    assert len(accepted) == 1


async def test_connection_close_and_stale_connections_are_not_reused() -> None:
    """A server that answers with Connection: close, and one that closes the connection
    while it is idle in the pool: the next request goes out on a fresh connection."""

    async def answer_then_close(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _read_request(r)
        w.write(_response(b"{}", close=False))  # keep-alive promised...
        await w.drain()
        # ...then closed (what an idle timeout on the server side does)

    async with _server(answer_then_close) as (url, accepted):
        c = _lean(url)
        await c.get_item(TableName="t")
        await asyncio.sleep(0.05)  # the FIN arrives while the connection sits in the pool
        await c.get_item(TableName="t")
        await c.close()
    assert len(accepted) == 2


async def test_an_aging_idle_connection_is_replaced_before_a_request_needs_one() -> None:
    """The keeper (``renew``, one round, time passed in): an idle connection within
    RENEW_AHEAD of max_age is closed and a new one opened in its place, so the next request
    finds one ready and opens none; a young one is kept; one the server closed is dropped,
    not replaced. Never more spares than ``keep_warm``'s number."""

    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        async for body in _requests(r):
            w.write(_response(_echo(body)))

    async with _server(echo) as (url, accepted):
        c = _lean(url, max_age=60.0)
        c._keep = 1  # keep_warm(1) without its timer: the rounds are run by hand
        await c.get_item(TableName="t")
        now = time.monotonic()
        assert await c.renew(now) == 0 and len(accepted) == 1  # young: kept
        c._idle[0].born -= 60.0 - ddb.RENEW_AHEAD + 0.5  # ages out within RENEW_AHEAD
        assert await c.renew(now) == 1 and len(accepted) == 2 and c.renewed == 1
        assert len(c._idle) == 1 and c._open == 1
        await c.get_item(TableName="t")
        assert len(accepted) == 2  # the request took the spare: no connection on its path
        c._idle[0].close()  # the server's side: gone, not aging
        assert await c.renew(time.monotonic()) == 0 and c._open == 0 and not c._idle
        await c.close()


async def test_the_keeper_runs_until_the_client_closes() -> None:
    async def idle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.read()

    async with _server(idle) as (url, _):
        c = _lean(url)
        c.keep_warm(2)
        task = c._keeper
        assert task is not None and not task.done()
        await c.close()
        assert task.done() and c._keeper is None


async def test_old_connections_are_replaced_and_the_name_resolved_again() -> None:
    """A pooled connection older than max_age is closed, not reused: the next request opens
    a new one, which resolves the endpoint's name again (DynamoDB's addresses change). Age is
    checked against the connection's birth, so the test ages it instead of waiting."""

    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        async for body in _requests(r):
            w.write(_response(_echo(body)))

    async with _server(echo) as (url, accepted):
        url = url.replace("127.0.0.1", "localhost")  # a name, resolved per connection
        c = _lean(url, max_age=60.0)
        await c.get_item(TableName="t")
        await c.get_item(TableName="t")
        assert len(accepted) == 1  # young: reused
        c._idle[0].born -= 61.0
        await c.get_item(TableName="t")
        await c.close()
    assert len(accepted) == 2
    assert ddb.MAX_AGE == 60.0 == Config().ddb_connection_max_age


async def test_pool_is_bounded() -> None:
    gate = asyncio.Event()

    async def slow(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            try:
                await _read_request(r)
            except asyncio.IncompleteReadError:
                return
            await gate.wait()
            w.write(_response(b"{}"))

    async with _server(slow) as (url, accepted):
        c = _lean(url, max_connections=2)
        calls = [asyncio.ensure_future(c.get_item(TableName="t")) for _ in range(5)]
        await asyncio.sleep(0.1)
        assert len(accepted) == 2 and c._open == 2
        gate.set()
        await asyncio.gather(*calls)
        await c.close()
    assert len(accepted) == 2


async def test_connection_refused_was_never_sent() -> None:
    async with _server(lambda r, w: asyncio.sleep(0)) as (url, _):
        pass  # closed again: the port now refuses
    c = _lean(url)
    with pytest.raises(EndpointConnectionError) as ei:
        await c.update_item(TableName="t")
    assert isinstance(ei.value.kwargs["error"], ConnectionRefusedError)
    assert _never_sent(ei.value)


async def test_other_connect_errors_were_never_sent() -> None:
    c = _lean("http://127.0.0.1:9")

    async def unreachable(*a: Any, **kw: Any) -> Any:
        raise OSError(113, "No route to host")

    loop = asyncio.get_running_loop()
    with (
        mock.patch.object(loop, "create_connection", unreachable),
        pytest.raises(EndpointConnectionError) as ei,
    ):
        await c.update_item(TableName="t")
    assert isinstance(ei.value.kwargs["error"], http1.ConnectFailed)
    assert _never_sent(ei.value)
    assert c._open == 0


async def test_connect_timeout_was_never_sent() -> None:
    c = _lean("http://127.0.0.1:9", connect_timeout=0.01)

    async def hang(*a: Any, **kw: Any) -> Any:
        await asyncio.sleep(10)

    loop = asyncio.get_running_loop()
    with (
        mock.patch.object(loop, "create_connection", hang),
        pytest.raises(ConnectTimeoutError) as ei,
    ):
        await c.get_item(TableName="t")
    assert _never_sent(ei.value)
    assert c._open == 0


async def test_read_timeout_may_have_applied() -> None:
    async def mute(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _read_request(r)
        await asyncio.sleep(5)

    async with _server(mute) as (url, _):
        c = _lean(url, read_timeout=0.05)
        with pytest.raises(ReadTimeoutError) as ei:
            await c.update_item(TableName="t")
        assert not _never_sent(ei.value)
        assert c._open == 0  # the connection is not reused
        await c.close()


async def test_reset_after_sending_may_have_applied() -> None:
    async def drop(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _read_request(r)  # read it all, then hang up without an answer

    async with _server(drop) as (url, _):
        c = _lean(url)
        with pytest.raises(ConnectionClosedError) as ei:
            await c.update_item(TableName="t")
        assert not _never_sent(ei.value)
        assert c._open == 0
        await c.close()


async def test_cancelled_call_closes_its_connection() -> None:
    async def mute(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _read_request(r)
        await asyncio.sleep(5)

    async with _server(mute) as (url, _):
        c = _lean(url)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await c.get_item(TableName="t")
        assert c._open == 0 and not c._idle
        await c.close()


def _chunked(body: bytes) -> bytes:
    half = len(body) // 2
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/x-amz-json-1.0\r\n"
        + f"x-amz-crc32: {zlib.crc32(body)}\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
        + f"{half:x}\r\n".encode()
        + body[:half]
        + f"\r\n{len(body) - half:x}\r\n".encode()
        + body[half:]
        + b"\r\n0\r\n\r\n"
    )


@pytest.mark.parametrize("how", ["byte_by_byte", "chunked", "continue_first"])
async def test_responses_however_framed_or_split(how: str) -> None:
    """A response in one-byte writes, in chunked encoding, or after a 100 Continue: the same
    answer, and the connection is reused."""

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        async for body in _requests(r):
            out = _echo(body)
            if how == "chunked":
                w.write(_chunked(out))
            elif how == "continue_first":
                w.write(b"HTTP/1.1 100 Continue\r\n\r\n" + _response(out))
            else:
                for i, b in enumerate(_response(out)):
                    w.write(bytes([b]))
                    if i % 7 == 0:
                        await w.drain()
                        await asyncio.sleep(0)

    async with _server(handler) as (url, accepted):
        c = _lean(url)
        for i in range(3):
            resp = await c.get_item(TableName=f"t{i}")
            assert resp["Echo"] == f"t{i}"
            assert resp["ResponseMetadata"]["HTTPStatusCode"] == 200
        await c.close()
    assert len(accepted) == 1


async def test_body_ending_with_the_connection_is_an_answer() -> None:
    """No Content-Length, no chunks: the body ends when the server closes (HTTP/1.1 allows
    it). The answer stands; the connection is not reused."""

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _read_request(r)
        w.write(b'HTTP/1.1 200 OK\r\nContent-Type: x\r\n\r\n{"Echo": "eof"}')
        await w.drain()

    async with _server(handler) as (url, accepted):
        c = _lean(url)
        assert (await c.get_item(TableName="t"))["Echo"] == "eof"
        assert c._open == 0 and not c._idle
        await c.get_item(TableName="t")
        await c.close()
    assert len(accepted) == 2


@pytest.mark.parametrize("junk", ["garbage", "cut_short"])
async def test_malformed_or_cut_response_may_have_applied(junk: str) -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _read_request(r)
        if junk == "garbage":
            w.write(b"HTTP/1.1 2x0 OK?\r\n\x00\x01\r\n\r\n")
        else:
            w.write(_response(b'{"Echo": "long enough"}')[:-5])
        await w.drain()
        await asyncio.sleep(0.05)

    async with _server(handler) as (url, _):
        c = _lean(url)
        with pytest.raises(ConnectionClosedError) as ei:
            await c.update_item(TableName="t")
        assert not _never_sent(ei.value)
        assert c._open == 0 and not c._idle
        await c.close()


@pytest.mark.parametrize("when", ["after_the_answer", "while_idle"])
async def test_bytes_nobody_asked_for_spoil_the_connection(when: str) -> None:
    """Bytes beyond the answer (with it, or later while the connection is pooled) are never
    taken as the answer to the next request: that request goes out on a new connection."""

    served: list[int] = []

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            try:
                await _read_request(r)
            except asyncio.IncompleteReadError:
                return
            first = not served
            served.append(1)
            stale = _response(b'{"Echo": "stale"}')
            if not first:
                w.write(_response(b'{"Echo": "fresh"}'))
            elif when == "after_the_answer":
                w.write(_response(b'{"Echo": "first"}') + stale)
            else:
                w.write(_response(b'{"Echo": "first"}'))
                await w.drain()
                await asyncio.sleep(0.02)
                w.write(stale)

    async with _server(handler) as (url, accepted):
        c = _lean(url)
        assert (await c.get_item(TableName="t"))["Echo"] == "first"
        await asyncio.sleep(0.1)
        assert (await c.get_item(TableName="t"))["Echo"] == "fresh"
        await c.close()
    assert len(accepted) == 2


# ----------------------------------------------------------------------------- credentials
def test_env_credentials_skip_botocore(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "tok")
    monkeypatch.delenv("AWS_CREDENTIAL_EXPIRATION", raising=False)
    creds = sigv4.resolve_credentials()
    assert type(creds) is sigv4.Credentials
    assert creds.current() == ("testing", "secret", "tok")


def test_profile_credentials_come_from_botocore(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    cred_file = tmp_path / "credentials"
    cred_file.write_text("[default]\naws_access_key_id = AKP\naws_secret_access_key = SKP\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(cred_file))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    creds = sigv4.resolve_credentials()
    assert isinstance(creds, sigv4.BotocoreCredentials)
    assert creds.current() == ("AKP", "SKP", None)


async def test_refreshable_credentials_refresh_off_the_loop() -> None:
    n = iter(range(100))
    hour = datetime.timedelta(hours=1)

    def fetch() -> dict[str, str]:
        exp = datetime.datetime.now(datetime.timezone.utc) + hour
        return {
            "access_key": f"A{next(n)}",
            "secret_key": "S",
            "token": "T",
            "expiry_time": exp.isoformat(),
        }

    boto = RefreshableCredentials.create_from_metadata(fetch(), fetch, "test")
    creds = sigv4.BotocoreCredentials(boto)
    first = creds.current()
    assert first == ("A0", "S", "T")
    # 11 minutes left: botocore wants a refresh (advisory); then a second passes
    boto._expiry_time = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(
        minutes=11
    )
    creds._next = 0.0
    assert creds.current() == first  # the refresh runs in a thread; old keys meanwhile
    for _ in range(200):
        await asyncio.sleep(0.01)
        if creds._refreshing is None:
            break
    assert creds.current()[0] == "A1"


async def test_calls_sent_together_leave_in_one_loop_iteration() -> None:
    """Three gathered calls on warm connections are all written before the loop polls for
    I/O once: a callback re-scheduling itself with call_soon counts the iterations."""

    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            try:
                await _read_request(r)
            except asyncio.IncompleteReadError:
                return
            w.write(_response(b"{}"))

    loop = asyncio.get_running_loop()
    ticks = [0]
    running = [True]

    def tick() -> None:
        ticks[0] += 1
        if running[0]:
            loop.call_soon(tick)

    async with _server(echo) as (url, accepted):
        c = _lean(url)
        await asyncio.gather(*(c.get_item(TableName="t") for _ in range(3)))  # 3 warm conns
        assert len(c._idle) == 3
        sent_at: list[int] = []
        for conn in c._idle:
            real = conn.transport.write  # type: ignore[union-attr]

            def write(data: bytes, real: Any = real) -> None:
                sent_at.append(ticks[0])
                real(data)

            conn.transport = mock.Mock(wraps=conn.transport, write=write)
        loop.call_soon(tick)
        await asyncio.gather(*(c.get_item(TableName="t") for _ in range(3)))
        running[0] = False
        assert len(sent_at) == 3 and len(set(sent_at)) == 1, sent_at
        await c.close()
    assert len(accepted) == 3
