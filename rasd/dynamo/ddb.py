"""A lean DynamoDB client for the daemon's hot path: JSON over HTTP/1.1, SigV4 by hand.

:class:`LeanDynamoDB` has the aiobotocore client's interface, answers and exceptions, so the
store's retries and ambiguous-write handling work unchanged. Which failure raises what, and
what it leaves to botocore: docs/design.md, "Talking to DynamoDB".
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import httptools
import orjson
from botocore.exceptions import (
    ChecksumError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
    SSLError,
)

from .aws import AwsSettings
from .http1 import Conn, ConnectFailed, ProxyRefused, ReadTimedOut, Tunnel, expire
from .sigv4 import (
    CONTENT_TYPE,
    AmzDate,
    Credentials,
    Signer,
    resolve_credentials,
    user_agent,
)

TARGET_PREFIX = "DynamoDB_20120810."
#: A pooled connection older than this is closed rather than reused: the next one resolves
#: the endpoint's name again (``ddb_connection_max_age``).
MAX_AGE = 60.0
#: An idle connection that will not be usable this many seconds from now (too old, or idle
#: too long) is replaced in the background: a request never waits for a new connection's
#: handshakes because an old one aged out (:meth:`LeanDynamoDB.renew`).
RENEW_AHEAD = 3.0
KEEP_EVERY = 1.0  # seconds between the keeper's rounds


class LeanDynamoDB:
    """The daemon's DynamoDB client (see the module docstring). Make it with :meth:`create`."""

    def __init__(
        self,
        endpoint_url: str,
        region: str,
        credentials: Credentials,
        *,
        max_connections: int = 32,
        connect_timeout: float = 1.0,
        read_timeout: float = 2.0,
        max_age: float = MAX_AGE,
        settings: AwsSettings | None = None,
        asked_endpoint: str | None = None,
        on_date: Callable[[bytes, float], None] | None = None,
    ) -> None:
        u = urlsplit(endpoint_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"endpoint_url must be http(s)://host[:port]: {endpoint_url!r}")
        self.endpoint_url = endpoint_url
        self.region = region
        self._tls = u.scheme == "https"
        self._host = u.hostname
        self._port = u.port or (443 if self._tls else 80)
        default_port = 443 if self._tls else 80
        host_header = self._host if self._port == default_port else f"{self._host}:{self._port}"
        if ":" in self._host and self._port == default_port:  # IPv6 literal
            host_header = f"[{self._host}]"
        elif ":" in self._host:
            host_header = f"[{self._host}]:{self._port}"
        self._signer = Signer(region, host_header)
        self._creds = credentials
        self._refreshing: asyncio.Future[None] | None = None
        #: forced credential refreshes (after an expired token)
        self.credential_refreshes = 0
        if settings is None:
            settings = AwsSettings(region=region, endpoint_url=endpoint_url)
            self._ssl = ssl.create_default_context() if self._tls else None
        else:
            self._ssl = settings.ssl_context()
        self.settings = settings
        #: the endpoint_url :meth:`create` was asked for (None: botocore's choice), for
        #: confirm_settings()
        self._asked_endpoint = asked_endpoint
        self._proxy: tuple[str, int] | None = None
        self._proxy_ssl = settings.proxy_ssl_context()
        #: every answer's Date header, with when its request left (monotonic): the daemon's
        #: clock watch (``rasd.server.clockwatch``)
        self.on_date = on_date
        target = "/"
        proxy_head = "".join(f"{k}: {v}\r\n" for k, v in settings.proxy_headers)
        if settings.proxy_url:
            p = urlsplit(settings.proxy_url)
            assert p.hostname is not None and p.port is not None
            self._proxy = (p.hostname, p.port)
            if not self._tls:  # plain HTTP through the proxy: absolute-form requests
                target = f"http://{host_header}/"
        #: the CONNECT request that opens a tunnel to the endpoint (https through a proxy)
        authority = f"[{self._host}]" if ":" in self._host else self._host
        authority = f"{authority}:{self._port}"
        self._connect_head = (
            f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{proxy_head}\r\n"
        ).encode()
        self._keepalive = settings.tcp_keepalive
        self._max = max_connections
        self._max_age = max_age
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._idle: deque[Conn] = deque()
        self._open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False
        #: idle connections the keeper keeps usable (:meth:`keep_warm`), and its task
        self._keep = 0
        self._keeper: asyncio.Task[None] | None = None
        #: connections the keeper opened in place of aging ones
        self.renewed = 0
        self._date = AmzDate()
        #: the part of every request head that never changes
        self._head_fixed = (
            f"POST {target} HTTP/1.1\r\nHost: {host_header}\r\nUser-Agent: {user_agent()}\r\n"
            f"Content-Type: {CONTENT_TYPE}\r\nAccept-Encoding: identity\r\n"
            + (proxy_head if target != "/" else "")
        ).encode()

    @classmethod
    async def create(
        cls,
        endpoint_url: str | None,
        region: str,
        *,
        settings: AwsSettings | None = None,
        max_connections: int = 32,
        connect_timeout: float = 1.0,
        read_timeout: float = 2.0,
        max_age: float = MAX_AGE,
        on_date: Callable[[bytes, float], None] | None = None,
    ) -> LeanDynamoDB:
        """Resolve the credentials (in a thread: they read files, run credential processes or
        ask IMDS), then the AWS settings unless given (``rasd.dynamo.awscache``: from an earlier
        start with the same inputs, else botocore's; the endpoint may depend on the
        credentials' account). Settings from the cache: see :meth:`confirm_settings`."""
        from . import awscache

        creds = await asyncio.to_thread(resolve_credentials)
        s = settings or await awscache.settings(endpoint_url, region, creds.account_id)
        return cls(
            s.endpoint_url,
            region,
            creds,
            max_connections=max_connections,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_age=max_age,
            settings=s,
            asked_endpoint=endpoint_url,
            on_date=on_date,
        )

    async def confirm_settings(self) -> AwsSettings | None:
        """Settings that came from the cache, resolved again by botocore (in a child process at
        low priority): None when it agrees, else what botocore decided. Raises
        ``AwsSettingsError`` when botocore refuses them, ``awscache.Unconfirmed`` without a
        verdict."""
        from . import awscache

        if self.settings.cache_key is None:
            return None
        return await awscache.confirm(
            self.settings, self._asked_endpoint, self.region, self._creds.account_id
        )

    async def refresh_credentials(self) -> None:
        """Fresh credentials, whatever their expiry says (DynamoDB answered that the token
        expired): botocore's chain is resolved again in a thread (refreshable credentials
        fetched anew: credential_process, IMDS, SSO...). Concurrent callers share one refresh."""
        fut = self._refreshing
        if fut is None:
            fut = self._refreshing = asyncio.ensure_future(self._refresh())
        try:
            await asyncio.shield(fut)
        finally:
            if fut.done():
                self._refreshing = None

    async def _refresh(self) -> None:
        self._creds = await asyncio.to_thread(resolve_credentials)
        self.credential_refreshes += 1

    # ---------------------------------------------------------------------- operations
    async def get_item(self, **params: Any) -> dict[str, Any]:
        return await self._call("GetItem", params)

    async def query(self, **params: Any) -> dict[str, Any]:
        return await self._call("Query", params)

    async def update_item(self, **params: Any) -> dict[str, Any]:
        return await self._call("UpdateItem", params)

    async def put_item(self, **params: Any) -> dict[str, Any]:
        return await self._call("PutItem", params)

    async def delete_item(self, **params: Any) -> dict[str, Any]:
        return await self._call("DeleteItem", params)

    def build(self, op: str, params: dict[str, Any]) -> tuple[bytes, bytes]:
        """The request's head and body, signed (no I/O)."""
        body = orjson.dumps(params)
        target = TARGET_PREFIX + op
        amz_date = self._date()
        ak, sk, token = self._creds.current()
        auth = self._signer.authorization(target, body, amz_date, ak, sk, token)
        tok = f"X-Amz-Security-Token: {token}\r\n" if token is not None else ""
        head = (
            self._head_fixed
            + (
                f"X-Amz-Target: {target}\r\nX-Amz-Date: {amz_date}\r\n{tok}"
                f"Authorization: {auth}\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode()
        )
        return head, body

    async def _call(self, op: str, params: dict[str, Any]) -> dict[str, Any]:
        head, body = self.build(op, params)
        conn = await self._acquire()
        done = False
        timer: asyncio.TimerHandle | None = None
        try:
            try:
                sent = time.monotonic()
                fut = conn.round_trip(head + body)
                timer = asyncio.get_running_loop().call_later(self._read_timeout, expire, fut)
                status, headers, data = await fut
            except ReadTimedOut:
                raise ReadTimeoutError(endpoint_url=self.endpoint_url) from None
            except (OSError, httptools.HttpParserError) as exc:
                raise ConnectionClosedError(endpoint_url=self.endpoint_url, error=exc) from exc
            done = True
        finally:
            if timer is not None:
                timer.cancel()
            self._release(conn, reuse=done)
        return self._parse(op, status, headers, data, sent)

    def _parse(
        self,
        op: str,
        status: int,
        headers: Sequence[tuple[bytes, bytes]],
        data: bytes,
        sent: float = 0.0,
    ) -> dict[str, Any]:
        crc = rid = date = None
        for name, value in headers:
            if name == b"x-amz-crc32":
                crc = value
            elif name == b"x-amzn-requestid":
                rid = value
            elif name == b"date":
                date = value
        if date is not None and self.on_date is not None:
            self.on_date(date, sent)
        if crc is not None and int(crc) != zlib.crc32(data):
            raise ChecksumError(
                checksum_type="crc32",
                expected_checksum=crc.decode(),
                actual_checksum=str(zlib.crc32(data)),
            )
        try:
            parsed: dict[str, Any] = orjson.loads(data) if data else {}
        except orjson.JSONDecodeError:  # e.g. a proxy's HTML page: the text is the message
            parsed = {} if status < 300 else {"message": data.decode(errors="replace")}
        meta = {
            "RequestId": rid.decode() if rid else "",
            "HTTPStatusCode": status,
            "RetryAttempts": 0,
        }
        if status < 300:
            parsed["ResponseMetadata"] = meta
            return parsed
        meta["HTTPHeaders"] = {k.decode(): v.decode() for k, v in headers}
        code = str(parsed.pop("__type", "") or "").rpartition("#")[2]
        message = parsed.pop("message", None) or parsed.pop("Message", None) or ""
        if not code:
            code = str(status)  # as botocore: no __type, the HTTP status is the code
        error: dict[str, Any] = {"Error": {"Code": code, "Message": message}}
        error.update(parsed)  # modelled fields (Item, CancellationReasons...)
        error["ResponseMetadata"] = meta
        raise ClientError(error, op)  # type: ignore[arg-type]

    # ----------------------------------------------------------------------------- pool
    async def _acquire(self) -> Conn:
        while True:
            idle = self._idle
            now = time.monotonic()
            while idle:
                conn = idle.pop()  # the most recently used: least likely to have been dropped
                if conn.usable(now, self._max_age):
                    return conn
                conn.close()
                self._open -= 1
            if self._closed:
                raise EndpointConnectionError(
                    endpoint_url=self.endpoint_url, error=ConnectFailed("client closed")
                )
            if self._open < self._max:
                self._open += 1
                try:
                    return await self._connect()
                except BaseException:
                    self._open -= 1
                    self._wake_one()
                    raise
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            except BaseException:
                if fut in self._waiters:
                    self._waiters.remove(fut)
                elif fut.done() and not fut.cancelled():
                    self._wake_one()  # pass on the wake-up this waiter will not use
                raise

    async def _connect(self) -> Conn:
        loop = asyncio.get_running_loop()
        conn: Conn
        try:
            async with asyncio.timeout(self._connect_timeout):
                if self._proxy is not None and self._tls:
                    conn = await self._tunnel(loop, self._proxy)
                else:  # direct, or plain HTTP to the proxy
                    host, port = self._proxy or (self._host, self._port)
                    sslctx = self._proxy_ssl if self._proxy else self._ssl
                    _, conn = await loop.create_connection(
                        Conn,
                        host,
                        port,
                        ssl=sslctx,
                        server_hostname=host if sslctx else None,
                    )
        except TimeoutError:
            raise ConnectTimeoutError(endpoint_url=self.endpoint_url) from None
        except ssl.SSLCertVerificationError as exc:
            # what failed and against which bundle: a wrong CA bundle is a setting to fix
            bundles = f"CA bundle: {self.settings.ca_bundle}"
            if self._proxy_ssl is not None:
                bundles += f"; proxy CA bundle: {self.settings.proxy_ca_bundle or 'the same'}"
            bad = ConnectFailed(exc.errno, f"{exc} ({bundles})")
            raise SSLError(endpoint_url=self.endpoint_url, error=bad) from exc
        except OSError as exc:  # refused, unreachable, DNS (gaierror), TLS handshake...
            known = isinstance(exc, ConnectionRefusedError | socket.gaierror | ConnectFailed)
            cause = exc if known else ConnectFailed(exc.errno, str(exc))
            raise EndpointConnectionError(endpoint_url=self.endpoint_url, error=cause) from exc
        conn.born = time.monotonic()
        if self._keepalive:
            sock = conn.transport.get_extra_info("socket") if conn.transport else None
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        return conn

    async def _tunnel(self, loop: asyncio.AbstractEventLoop, proxy: tuple[str, int]) -> Conn:
        """A CONNECT tunnel through the proxy, then TLS with the endpoint inside it."""
        host, port = proxy
        transport, tunnel = await loop.create_connection(
            Tunnel,
            host,
            port,
            ssl=self._proxy_ssl,
            server_hostname=host if self._proxy_ssl else None,
        )
        try:
            transport.write(self._connect_head)
            head = await tunnel.done
            status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            parts = status_line.split(" ", 2)
            if len(parts) < 2 or not parts[1].isdigit() or not 200 <= int(parts[1]) < 300:
                raise ProxyRefused(f"proxy {host}:{port} answered CONNECT with {status_line!r}")
            conn = Conn()
            assert self._ssl is not None  # a tunnel is for https endpoints only
            tls = await loop.start_tls(transport, conn, self._ssl, server_hostname=self._host)
            if tls is None:
                raise ConnectFailed("TLS through the proxy's tunnel could not start")
            conn.connection_made(tls)
            return conn
        except BaseException:
            transport.close()
            raise

    def _release(self, conn: Conn, reuse: bool) -> None:
        if reuse and not self._closed and conn.keep_alive and not conn.busy and not conn.lost:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.close()
            self._open -= 1
        self._wake_one()

    # --------------------------------------------------------------------- the keeper
    def keep_warm(self, n: int) -> None:
        """Keep up to ``n`` idle connections usable from now on: each round (every
        ``KEEP_EVERY`` s) :meth:`renew`. Needs a running event loop; :meth:`close` stops it."""
        self._keep = n
        if n > 0 and self._keeper is None and not self._closed:
            self._keeper = asyncio.get_running_loop().create_task(self._keep_loop())

    async def _keep_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(KEEP_EVERY)
            await self.renew(time.monotonic())

    async def renew(self, now: float) -> int:
        """Close the idle connections that will not be usable ``RENEW_AHEAD`` s after ``now``
        (older than ``max_age``, or idle too long by then) and open new ones in place of
        those that aged, as many as keep ``keep_warm``'s number usable. A connection the
        server closed is dropped, not replaced: a server that closes every connection gets
        no spares. Returns how many were opened."""
        later = now + RENEW_AHEAD
        kept: list[Conn] = []
        aging = 0
        for conn in self._idle:
            if conn.usable(later, self._max_age):
                kept.append(conn)
                continue
            aging += conn.usable(now, self._max_age)
            conn.close()
            self._open -= 1
        if len(kept) != len(self._idle):
            self._idle.clear()
            self._idle.extend(kept)
        want = min(aging, self._keep - len(kept), self._max - self._open)
        if want <= 0:
            return 0
        got = await asyncio.gather(*(self._spare() for _ in range(want)))
        opened = sum(got)
        self.renewed += opened
        return opened

    async def _spare(self) -> bool:
        """Open a connection into the idle pool; False if that failed (the next round tries)."""
        self._open += 1
        try:
            conn = await self._connect()
        except Exception:  # noqa: BLE001 - a request that needs one will say why
            self._open -= 1
            self._wake_one()
            return False
        if self._closed:
            conn.close()
            self._open -= 1
            return False
        conn.keep_alive = True  # no answer yet to say otherwise
        conn.idle_since = time.monotonic()
        self._idle.appendleft(conn)  # below the recently used: those go first
        self._wake_one()
        return True

    def _wake_one(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    async def close(self) -> None:
        self._closed = True
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
            self._keeper = None
        while self._idle:
            self._idle.pop().close()
            self._open -= 1
        for fut in self._waiters:
            if not fut.done():
                fut.set_result(None)
        self._waiters.clear()
        await asyncio.sleep(0)  # let the transports' connection_lost run

    async def __aenter__(self) -> LeanDynamoDB:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
