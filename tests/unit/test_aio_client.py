"""``rasd_client.aio``'s connection handling against a small Unix server written here.

The server speaks the framing and answers ``ping``; it is not a double of the daemon, only
something to count connections on and to close them when a test says so. Every test runs on
asyncio's own loop and on uvloop, each in a fresh loop, so the client's first call in the
test is that loop's first use of the client.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import socket
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import uvloop

from rasd_client import aio, wire

LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


@pytest.fixture(params=sorted(LOOPS))
def run(request: pytest.FixtureRequest) -> Callable[[Awaitable[Any]], Any]:
    """Run a coroutine in a new loop of the parametrized kind, as a worker's first use."""

    def runner(coro: Awaitable[Any]) -> Any:
        with asyncio.Runner(loop_factory=LOOPS[request.param]) as r:
            return r.run(coro)  # type: ignore[arg-type]

    return runner


@pytest.fixture
def path() -> Iterator[str]:
    d = Path(tempfile.mkdtemp(prefix="rasd-u-"))  # AF_UNIX paths are short
    yield str(d / "s.sock")
    for p in d.iterdir():
        p.unlink()
    d.rmdir()


class PingServer:
    """Counts connections; answers every ``ping``, or holds them while ``hold`` is set."""

    def __init__(self) -> None:
        self.accepted = 0
        self.held = 0
        self.hold = False
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.writers.append(writer)
        decoder = wire.FrameDecoder()
        while data := await reader.read(65536):
            decoder.feed(data)
            for frame in decoder.frames():
                assert not isinstance(frame, wire.BadFrame)
                if self.hold:
                    self.held += 1
                else:
                    writer.write(wire.encode({"v": 1, "id": frame["id"], "ok": True}))
        writer.close()

    def drop_all(self) -> None:
        """Close every connection without answering what it holds."""
        for w in self.writers:
            w.close()
        self.writers.clear()


@asynccontextmanager
async def serving(path: str, sock: socket.socket | None = None) -> AsyncIterator[PingServer]:
    ps = PingServer()
    # A deep backlog: these tests are about how many connections the client opens.
    if sock is None:
        ps.server = await asyncio.start_unix_server(ps.handle, path=path, backlog=4096)
    else:
        ps.server = await asyncio.start_unix_server(ps.handle, sock=sock, backlog=4096)
    try:
        yield ps
    finally:
        await aio.close()
        ps.drop_all()
        ps.server.close()


@asynccontextmanager
async def loop_problems() -> AsyncIterator[list[str]]:
    """What the loop's exception handler is told (e.g. "Task was destroyed but it is
    pending!"), up to a full collection at the end, while the loop still runs."""
    loop = asyncio.get_running_loop()
    seen: list[str] = []
    loop.set_exception_handler(lambda _loop, ctx: seen.append(str(ctx.get("message"))))
    try:
        yield seen
    finally:
        gc.collect()
        await asyncio.sleep(0)
        loop.set_exception_handler(None)


def reader_tasks() -> list[asyncio.Task[Any]]:
    return [
        t
        for t in asyncio.all_tasks()
        if getattr(t.get_coro(), "__qualname__", "") == "_AioConn._read_loop"
    ]


async def until(pred: Callable[[], bool], what: str) -> None:
    """Bounded wait for something the test itself brings about (not a timing assertion)."""
    for _ in range(2000):
        if pred():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"never happened: {what}")


def test_concurrent_first_calls_share_one_connection(run: Any, path: str) -> None:
    """500 calls started at once as a loop's first use of the client open one connection
    between them (the others wait for it), all are answered, and no reader task is left
    for the garbage collector to destroy."""

    async def main() -> tuple[list[Any], int, list[str]]:
        async with loop_problems() as problems, serving(path) as ps:
            got = await asyncio.gather(
                *(aio.call_raw("ping", socket_path=path, timeout=5) for _ in range(500)),
                return_exceptions=True,
            )
        return got, ps.accepted, problems

    got, accepted, problems = run(main())
    assert [g for g in got if not isinstance(g, dict)] == []
    assert accepted == 1
    assert problems == []


def test_a_lost_connection_is_replaced_by_one(run: Any, path: str) -> None:
    """The connection closes with 50 requests unanswered: the 50 callers retry on one new
    connection between them, and the old connection's reader task has ended."""

    async def main() -> tuple[list[Any], int, int, list[str]]:
        async with loop_problems() as problems, serving(path) as ps:
            await aio.call_raw("ping", socket_path=path)
            ps.hold = True
            calls = [
                asyncio.ensure_future(aio.call_raw("ping", socket_path=path, timeout=5))
                for _ in range(50)
            ]
            await until(lambda: ps.held == 50, "the server holds 50 requests")
            (first,) = reader_tasks()
            ps.hold = False
            ps.drop_all()
            got = await asyncio.gather(*calls, return_exceptions=True)
            ended = first.done()
        return got, ps.accepted, ended, problems

    got, accepted, ended, problems = run(main())
    assert [g for g in got if not isinstance(g, dict)] == []
    assert accepted == 2
    assert ended
    assert problems == []


def test_close_ends_the_reader_task(run: Any, path: str) -> None:
    """``aio.close()`` returns once the connection's reader task has ended."""

    async def main() -> tuple[int, int]:
        async with serving(path):
            await aio.call_raw("ping", socket_path=path)
            before = len(reader_tasks())
            await aio.close()
            return before, len([t for t in reader_tasks() if not t.done()])

    assert run(main()) == (1, 0)


class SpySocket(socket.socket):
    """socket.socket that records how each connect to a watched path ended (an errno or 0)."""

    watched: str = ""
    outcomes: list[int] = []

    def connect(self, address: Any) -> None:
        try:
            super().connect(address)
        except OSError as exc:
            if address == self.watched:
                self.outcomes.append(exc.errno or -1)
            raise
        if address == self.watched:
            self.outcomes.append(0)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch, path: str) -> list[int]:
    outcomes: list[int] = []
    monkeypatch.setattr(SpySocket, "watched", path)
    monkeypatch.setattr(SpySocket, "outcomes", outcomes)
    monkeypatch.setattr(socket, "socket", SpySocket)
    return outcomes


def test_connect_is_retried_until_the_daemon_listens(run: Any, path: str, spy: list[int]) -> None:
    """No socket file yet (a daemon restarting without socket activation): the call keeps
    trying within its timeout and is answered once the server listens."""

    async def main() -> tuple[Any, int]:
        call = asyncio.ensure_future(aio.call_raw("ping", socket_path=path, timeout=5))
        await until(lambda: bool(spy) or call.done(), "a first connect attempt")
        assert not call.done(), call.result()  # raises the old client's Unavailable
        async with serving(path) as ps:
            return await call, ps.accepted

    got, accepted = run(main())
    assert got["ok"]
    assert accepted == 1
    assert spy[0] == errno.ENOENT and spy[-1] == 0, spy


def test_connect_is_retried_while_the_backlog_is_full(run: Any, path: str, spy: list[int]) -> None:
    """connect() fails with EAGAIN while the listening socket's backlog is full: the call
    keeps trying within its timeout and is answered once the backlog has room."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(0)
    fillers: list[socket.socket] = []
    while True:  # fill the backlog (Linux queues backlog + 1)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(path)
        except BlockingIOError:
            s.close()
            break
        fillers.append(s)
    spy.clear()

    async def main() -> tuple[Any, int]:
        call = asyncio.ensure_future(aio.call_raw("ping", socket_path=path, timeout=5))
        await until(lambda: bool(spy) or call.done(), "a first connect attempt")
        assert not call.done(), call.result()  # raises the old client's Unavailable
        assert spy[0] == errno.EAGAIN, spy
        listener.setblocking(False)
        for s in fillers:  # make room: take the queued connections and close them
            listener.accept()[0].close()
            s.close()
        async with serving(path, sock=listener) as ps:
            return await call, ps.accepted

    try:
        got, accepted = run(main())
    finally:
        for s in fillers:
            s.close()
        listener.close()
    assert got["ok"]
    assert accepted == 1
    assert spy[-1] == 0
