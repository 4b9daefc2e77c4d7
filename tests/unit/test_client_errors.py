"""The clients raise ``RasdError``s only, with the BAD_REQUEST the docs promise for bad arguments
(naming the Python argument), and end a call with the daemon's answer to a frame it refused
without reading its id.

No daemon here: arguments are checked before any connect, and the refused frame comes from a
small Unix server written here that answers every frame the way the daemon answers one it
cannot read (``id`` null) and then closes, as the daemon does after an oversized frame.
"""

from __future__ import annotations

import asyncio
import math
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

import rasd_client
from rasd_client import aio, wire

C, P, K = "demo", "default", "k"
HOUR = timedelta(hours=1)
NOWHERE = "/nonexistent/rasd.sock"  # a call that got past the checks fails UNAVAILABLE here


@pytest.fixture
def path() -> Iterator[str]:
    d = Path(tempfile.mkdtemp(prefix="rasd-u-"))  # AF_UNIX paths are short
    yield str(d / "s.sock")
    for p in d.iterdir():
        p.unlink()
    d.rmdir()


class Refusing:
    """Answers the first frame of each connection with ``BAD_REQUEST`` and ``id`` null, then
    closes it: the daemon's answer to a frame over the limit. Counts the frames it read."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(8)
        self.frames = 0
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                decoder = wire.FrameDecoder()
                while not (got := list(decoder.frames())):
                    data = conn.recv(65536)
                    if not data:
                        break
                    decoder.feed(data)
                if not got:
                    continue
                self.frames += len(got)
                answer = wire.error_payload(None, "BAD_REQUEST", "frame of 70011 bytes too large")
                conn.sendall(wire.encode(answer))

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def refusing(path: str) -> Iterator[Refusing]:
    server = Refusing(path)
    yield server
    server.close()


def test_a_reply_without_id_ends_the_sync_call_with_its_error(
    path: str, refusing: Refusing
) -> None:
    """The daemon's BAD_REQUEST to a frame it refused is the call's answer: not ignored, the
    frame not sent again, no UNAVAILABLE (which the docs call retryable)."""
    with pytest.raises(rasd_client.BadRequest, match="too large"):
        rasd_client.get_lease(C, P, K, HOUR, socket_path=path, timeout=2)
    assert refusing.frames == 1
    with pytest.raises(rasd_client.BadRequest):  # the next call, on a new connection
        rasd_client.headroom(C, P, socket_path=path, timeout=2)
    assert refusing.frames == 2


def test_a_reply_without_id_ends_the_async_call_with_its_error(
    path: str, refusing: Refusing
) -> None:
    async def main() -> None:
        with pytest.raises(rasd_client.BadRequest, match="too large"):
            await aio.get_lease(C, P, K, HOUR, socket_path=path, timeout=2)
        with pytest.raises(rasd_client.BadRequest):
            await aio.release(C, P, K, socket_path=path, timeout=2)
        await aio.close()

    asyncio.run(main())
    assert refusing.frames == 2


def test_a_frame_over_the_limit_is_refused_before_it_is_sent(path: str, refusing: Refusing) -> None:
    """A 70,000-character key makes a frame the daemon must refuse: BAD_REQUEST at once,
    nothing sent."""
    for call in (
        lambda: rasd_client.get_lease(C, P, "k" * 70_000, HOUR, socket_path=path),
        lambda: rasd_client.release(C, P, "k" * 70_000, socket_path=path),
        lambda: asyncio.run(aio.get_lease(C, P, "k" * 70_000, HOUR, socket_path=path)),
    ):
        with pytest.raises(rasd_client.BadRequest, match="over the protocol's limit of 65536"):
            call()
    assert refusing.frames == 0


BAD_EXPIRES: list[Any] = [
    math.inf,
    -math.inf,
    math.nan,
    timedelta.max,
    timedelta.min,
    10**30,
    -(10**30),
    10**5000,  # its repr alone raises ValueError
    1e300,
    datetime.min.replace(tzinfo=timezone.utc),
    True,
    "tomorrow",
    None,
    b"\x00",
    [3600],
    datetime(2030, 1, 1),  # naive
]


@pytest.mark.parametrize("value", BAD_EXPIRES, ids=lambda v: type(v).__name__)
def test_bad_lease_expires_is_bad_request_in_both_clients(value: Any) -> None:
    """Out-of-range or mistyped ``lease_expires`` raises BadRequest naming the argument, not
    OverflowError or ValueError, which ``except RasdError`` would not catch."""
    with pytest.raises(rasd_client.BadRequest, match="lease_expires"):
        rasd_client.get_lease(C, P, K, value, socket_path=NOWHERE)
    with pytest.raises(rasd_client.BadRequest, match="lease_expires"):
        asyncio.run(aio.get_lease(C, P, K, value, socket_path=NOWHERE))


def test_a_duration_given_as_epoch_seconds_is_told_to_be_a_timedelta() -> None:
    """``get_lease(..., 3600)`` means an hour; a number is epoch seconds, so it is 1970. Both
    clients refuse it before any connect, saying the time it is and how to pass a duration."""
    want = (
        "lease_expires 3600 is epoch seconds (1970-01-01T01:00:00Z), in the past; for a "
        "duration pass timedelta(seconds=3600)"
    )
    with pytest.raises(rasd_client.BadRequest) as got:
        rasd_client.get_lease(C, P, K, 3600, socket_path=NOWHERE)
    assert got.value.message == want
    with pytest.raises(rasd_client.BadRequest) as got:
        asyncio.run(aio.get_lease(C, P, K, 3600, socket_path=NOWHERE))
    assert got.value.message == want
    with pytest.raises(rasd_client.BadRequest, match=r"timedelta\(seconds=86400.5\)"):
        rasd_client.get_lease(C, P, K, 86400.5, socket_path=NOWHERE)
    two_years_ago = time.time() - 2 * 366 * 86400
    with pytest.raises(rasd_client.BadRequest, match="in the past by over a year"):
        rasd_client.get_lease(C, P, K, two_years_ago, socket_path=NOWHERE)


def test_a_time_that_has_just_passed_is_the_daemons_to_judge() -> None:
    """Epoch seconds a minute, or a month, ago get past the client's checks (a clock may be
    off): the daemon answers them (UNAVAILABLE here, with no daemon)."""
    for ago in (60, 30 * 86400):
        with pytest.raises(rasd_client.Unavailable):
            rasd_client.get_lease(C, P, K, time.time() - ago, socket_path=NOWHERE)


BAD_TIMEOUTS: list[Any] = [-1, 0, 0.0, 120, 60.001, math.inf, math.nan, -math.inf, 10**400]
BAD_TIMEOUTS += [True, "1", b"1", [1], timedelta(seconds=1)]


@pytest.mark.parametrize("value", BAD_TIMEOUTS, ids=lambda v: type(v).__name__)
def test_bad_timeout_names_the_argument_not_the_wire_field(value: Any) -> None:
    """``timeout=120`` says "timeout must be in (0, 60] seconds", not "deadline_ms must be in
    1..60000"; every op, both clients."""
    want = r"timeout must be in \(0, 60\] seconds"
    calls = [
        lambda: rasd_client.get_lease(C, P, K, HOUR, timeout=value, socket_path=NOWHERE),
        lambda: rasd_client.release(C, P, K, timeout=value, socket_path=NOWHERE),
        lambda: rasd_client.headroom(C, P, timeout=value, socket_path=NOWHERE),
        lambda: rasd_client.call_raw("ping", timeout=value, socket_path=NOWHERE),
        lambda: asyncio.run(aio.get_lease(C, P, K, HOUR, timeout=value, socket_path=NOWHERE)),
        lambda: asyncio.run(aio.headroom(C, P, timeout=value, socket_path=NOWHERE)),
        lambda: asyncio.run(aio.call_raw("ping", timeout=value, socket_path=NOWHERE)),
    ]
    for call in calls:
        with pytest.raises(rasd_client.BadRequest, match=want):
            call()


def test_the_longest_timeout_is_the_wires_longest_deadline() -> None:
    from rasd.wire import MAX_DEADLINE_MS
    from rasd_client._common import MAX_TIMEOUT

    assert MAX_TIMEOUT * 1000 == MAX_DEADLINE_MS
    # the limit itself and anything just above nothing get past the checks
    with pytest.raises(rasd_client.Unavailable):
        rasd_client.get_lease(C, P, K, HOUR, timeout=MAX_TIMEOUT, socket_path=NOWHERE)
    with pytest.raises(rasd_client.Unavailable):
        rasd_client.get_lease(C, P, K, HOUR, timeout=1e-9, socket_path=NOWHERE)


@pytest.mark.parametrize(
    "args",
    [
        ("\ud800", P, K),
        (C, "", K),
        (C, P, None),
        (C, P, b"k"),
        (C, P, "k\udfff"),
        (1, P, K),
    ],
    ids=lambda a: repr(a)[:30],
)
def test_bad_names_are_bad_request(args: tuple[Any, Any, Any]) -> None:
    """A name that is not a non-empty str, or that msgpack cannot encode as UTF-8 (a lone
    surrogate), is BAD_REQUEST before any connect."""
    with pytest.raises(rasd_client.BadRequest):
        rasd_client.get_lease(*args, HOUR, socket_path=NOWHERE)
    with pytest.raises(rasd_client.BadRequest):
        asyncio.run(aio.get_lease(*args, HOUR, socket_path=NOWHERE))


@pytest.mark.parametrize(
    "value", [123, ["/x"], "\ud800", "/tmp/" + "x" * 200, object()], ids=lambda v: repr(v)[:20]
)
def test_bad_socket_path_is_bad_request(value: Any) -> None:
    with pytest.raises(rasd_client.BadRequest, match="socket_path"):
        rasd_client.get_lease(C, P, K, HOUR, socket_path=value)
    with pytest.raises(rasd_client.BadRequest, match="socket_path"):
        asyncio.run(aio.headroom(C, P, socket_path=value))


def test_call_raw_fields_msgpack_cannot_carry_are_bad_request(
    path: str, refusing: Refusing
) -> None:
    with pytest.raises(rasd_client.BadRequest, match="cannot be encoded"):
        rasd_client.call_raw("ping", socket_path=path, extra=object())
    with pytest.raises(rasd_client.BadRequest, match="cannot be encoded"):
        asyncio.run(aio.call_raw("ping", socket_path=path, extra=2**64))
    assert refusing.frames == 0


@pytest.mark.parametrize("raw", ["abc", "0", "-1", "120", "nan", "1s"])
def test_a_bad_rasd_timeout_is_named(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``RASD_TIMEOUT`` (a call's timeout when it passes none) is checked as ``timeout=``
    is, and the message names the variable; every op, both clients."""
    monkeypatch.setenv("RASD_TIMEOUT", raw)
    want = r"RASD_TIMEOUT must be seconds in \(0, 60\]"
    calls = [
        lambda: rasd_client.get_lease(C, P, K, HOUR, socket_path=NOWHERE),
        lambda: rasd_client.release(C, P, K, socket_path=NOWHERE),
        lambda: rasd_client.headroom(C, P, socket_path=NOWHERE),
        lambda: rasd_client.call_raw("ping", socket_path=NOWHERE),
        lambda: asyncio.run(aio.get_lease(C, P, K, HOUR, socket_path=NOWHERE)),
        lambda: asyncio.run(aio.release(C, P, K, socket_path=NOWHERE)),
        lambda: asyncio.run(aio.headroom(C, P, socket_path=NOWHERE)),
        lambda: asyncio.run(aio.call_raw("ping", socket_path=NOWHERE)),
    ]
    for call in calls:
        with pytest.raises(rasd_client.BadRequest, match=want):
            call()
    # a timeout passed to the call is its own: the variable is not read
    with pytest.raises(rasd_client.Unavailable):
        rasd_client.get_lease(C, P, K, HOUR, timeout=0.5, socket_path=NOWHERE)


def test_rasd_timeout_is_the_default_deadline(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A daemon that never answers: the call waits ``RASD_TIMEOUT`` (not the 1 s default),
    and sends it as the request's deadline; ``timeout=`` still overrides it."""
    path = str(tmp_path / "silent.sock")
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(path)
    silent.listen(8)  # accepts into the backlog, never reads or answers
    try:
        monkeypatch.setenv("RASD_TIMEOUT", "0.2")
        with pytest.raises(rasd_client.Timeout, match=r"within 0\.200s"):
            rasd_client.get_lease(C, P, K, HOUR, socket_path=path)
        with pytest.raises(rasd_client.Timeout, match=r"within 0\.300s"):
            rasd_client.get_lease(C, P, K, HOUR, socket_path=path, timeout=0.3)
        monkeypatch.delenv("RASD_TIMEOUT")
        assert rasd_client.DEFAULT_TIMEOUT == 1.0
    finally:
        silent.close()
