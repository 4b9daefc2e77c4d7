"""``python -m sim.delayproxy --target HOST:PORT --one-way-ms N``: a TCP proxy that holds every
chunk ``N`` ms in each direction, so a call through it costs one cross-region round trip
more (``2 N`` ms) than the same call made directly. The simulation puts it in front of a
strict pool's home region for the other regions' daemons (their ``peer_endpoints``).

Prints the port it listens on (loopback), then serves until its stdin closes. Order is kept
per direction: each chunk is written ``N`` ms after it was read, in the order read."""

from __future__ import annotations

import argparse
import asyncio
import sys


async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, delay: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def writer() -> None:
        while True:
            due, chunk = await queue.get()
            if not chunk:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            dst.write(chunk)
            await dst.drain()
        if dst.can_write_eof():
            dst.write_eof()

    task = asyncio.create_task(writer())
    try:
        while True:
            chunk = await src.read(65536)
            queue.put_nowait((loop.time() + delay, chunk))
            if not chunk:
                break
        await task
    except (ConnectionError, OSError):
        task.cancel()


async def serve(target_host: str, target_port: int, delay: float) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(target_host, target_port)
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(_pump(reader, up_w, delay), _pump(up_r, writer, delay))
        finally:
            for w in (writer, up_w):
                w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(port, flush=True)
    loop = asyncio.get_running_loop()
    stdin_closed = loop.run_in_executor(None, sys.stdin.read)
    async with server:
        await stdin_closed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.delayproxy", description=__doc__)
    ap.add_argument("--target", required=True, metavar="HOST:PORT")
    ap.add_argument("--one-way-ms", type=float, required=True)
    a = ap.parse_args(argv)
    host, _, port = a.target.rpartition(":")
    asyncio.run(serve(host, int(port), a.one_way_ms / 1000))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
