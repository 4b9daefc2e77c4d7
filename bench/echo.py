"""The IPC floor: a bare msgpack server on the daemon's socket machinery, doing no work.

Same stack as ``rasd.server``: uvloop, ``loop.create_unix_server`` with an ``asyncio.Protocol``
whose ``data_received`` feeds ``rasd_client.wire.FrameDecoder`` and answers each frame with
``wire.encode``. The answer is a canned lease-shaped map carrying the request's ``id``, so
the *unchanged* ``rasd_client.get_lease`` can call it: what the client measures against this
server is the floor that any daemon on this machinery could reach (client encode, two socket
hops, decode, encode, decode), with no validation, no cache lookup and no counters.

Run: ``python -m bench.echo --socket PATH`` (prints ``READY`` when listening).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from typing import Any

import uvloop

from rasd_client.wire import VERSION, BadFrame, FrameDecoder, encode

_CANNED: dict[str, Any] = {
    "v": VERSION,
    "ok": True,
    "resource": "echo-resource-0001",
    "lease_expires_us": int((time.time() + 3600) * 1_000_000),
    "version": 1,
    "new": False,
    "region": "us-east-1",
}


class EchoConn(asyncio.Protocol):
    __slots__ = ("decoder", "transport")

    def __init__(self) -> None:
        self.decoder = FrameDecoder()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.decoder.feed(data)
        assert self.transport is not None
        for frame in self.decoder.frames():
            if isinstance(frame, BadFrame):
                continue
            self.transport.write(encode({**_CANNED, "id": frame.get("id")}))


async def serve(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)
    loop = asyncio.get_running_loop()
    server = await loop.create_unix_server(EchoConn, path=path)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("READY", flush=True)
    await stop.wait()
    server.close()
    if os.path.exists(path):
        os.unlink(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.echo")
    ap.add_argument("--socket", required=True)
    a = ap.parse_args(argv)
    try:
        uvloop.run(serve(a.socket))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
