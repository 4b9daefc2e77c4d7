"""A raw ASGI app for the uvicorn test: what a web worker's request handler does.

``GET /lease?key=K&together=N`` answers ``{"key", "resource", "version"}`` from
``await rasd_client.aio.get_lease(...)`` on ``$RASD_SOCKET`` (503 with ``{"key", "error",
"message"}`` on a RasdError). Each such request first waits until N of them have arrived, so
that all N call the client at once however uvicorn spreads their arrival over its loop's
iterations: a burst, whatever the machine's speed. ``GET /health`` answers without touching
the client; ``GET /gc`` runs a full collection, so a reader task left pending would be
destroyed (and logged to stderr) while the server still runs.
"""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs

import rasd_client
from rasd_client import aio

#: /lease requests arrived so far; the event is set once ``together`` of them have
arrived = 0
all_in: asyncio.Event | None = None

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    status, body = 200, {}
    if scope["path"] == "/lease":
        query = parse_qs(scope["query_string"].decode())
        key = query["key"][0]
        await arrive(int(query["together"][0]))
        try:
            lease = await aio.get_lease("demo", "default", key, timedelta(hours=1), timeout=5)
            body = {"key": key, "resource": lease.resource, "version": lease.version}
        except rasd_client.RasdError as exc:
            status, body = 503, {"key": key, "error": exc.code, "message": exc.message}
    elif scope["path"] == "/gc":
        body = {"collected": gc.collect()}
    elif scope["path"] != "/health":
        status = 404
    payload = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(payload))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


async def arrive(together: int) -> None:
    global all_in, arrived
    if all_in is None:
        all_in = asyncio.Event()
    arrived += 1
    if arrived >= together:
        all_in.set()
    await asyncio.wait_for(all_in.wait(), 60)  # bounded: a lost request fails the test
