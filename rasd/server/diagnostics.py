"""Start-up diagnostics: what to say when the daemon cannot reach DynamoDB.

An operator reading ``journalctl -u rasd`` after a failed start wants one line naming the
endpoint and the real cause, not a traceback of the retry layers. :func:`describe_cause`
finds the root of an exception chain; :func:`probe_endpoint` asks the network directly when
the store's own error (an open circuit breaker, a timeout) hides it; :func:`loop_exception`
turns unhandled errors on the event loop into one structured line.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

log = structlog.get_logger("rasd.server")


def is_boto(exc: BaseException) -> bool:
    """An error of botocore, aiobotocore or aiohttp: expected while DynamoDB is unreachable
    (logged without a traceback)."""
    return type(exc).__module__.split(".")[0] in ("botocore", "aiobotocore", "aiohttp")


def describe_cause(exc: BaseException) -> str:
    """One line for the root cause of a start-up failure: the innermost exception of the
    chain (``Unavailable: circuit breaker open`` says nothing; the connect error under it
    does), with the outer message when it adds something."""
    chain = [exc]
    seen = {id(exc)}
    cur: BaseException | None = exc
    while cur is not None:
        cur = cur.__cause__ or cur.__context__
        if cur is None or id(cur) in seen:
            break
        seen.add(id(cur))
        chain.append(cur)
    # A cancelled or bare timeout at the bottom says nothing: take the deepest link that does.
    informative = [e for e in chain if not isinstance(e, asyncio.CancelledError) and str(e)]
    root = informative[-1] if informative else chain[-1]
    text = f"{type(root).__name__}: {root}".strip().rstrip(":")
    if root is not exc:
        text = f"{text} ({type(exc).__name__}: {exc})"
    return " ".join(text.split())[:500]


async def probe_endpoint(url: str, timeout: float = 1.0) -> str:
    """What a plain TCP connect to the endpoint says (refused, DNS failure, timeout, ok)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host = parts.hostname or url
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        async with asyncio.timeout(timeout):
            _reader, writer = await asyncio.open_connection(host, port)
    except TimeoutError:
        return f"TCP connect to {host}:{port}: no answer within {timeout:.1f}s"
    except OSError as exc:
        return f"TCP connect to {host}:{port}: {type(exc).__name__}: {exc.strerror or exc}"
    writer.close()
    return f"TCP connect to {host}:{port} works (DynamoDB itself is failing)"


async def close_quietly(store: Any) -> None:
    """Close a store whose start failed, so aiohttp reports no "Unclosed client session"."""
    try:
        await store.close()
    except Exception as exc:  # noqa: BLE001 - best effort on a failure path
        log.debug("store_close_failed", error=repr(exc))


def loop_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Unhandled errors on the loop as one structured line (not asyncio's multi-line dump).
    aiohttp's "Unclosed client session/connector" notices come from the garbage collector
    after a failed start-up attempt was already closed and logged: debug level only."""
    message = str(context.get("message", "unhandled error on the event loop"))
    exc = context.get("exception")
    if message.startswith(("Unclosed client session", "Unclosed connector")):
        log.debug("aiohttp_unclosed", message=message)
        return
    log.error(
        "loop_error",
        message=message,
        error=describe_cause(exc) if isinstance(exc, BaseException) else None,
        **({"exc_info": exc} if isinstance(exc, BaseException) else {}),
    )
