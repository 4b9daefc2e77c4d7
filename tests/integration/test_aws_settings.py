"""The daemon as it meets real AWS: TLS with a private CA (AWS_CA_BUNDLE), through a CONNECT
proxy (HTTPS_PROXY, with and without credentials, over TLS, bypassed by NO_PROXY), plain HTTP
through a forwarding proxy (HTTP_PROXY), credentials from a credential_process that rotate,
and an expired token that forces a refresh: all against moto with IAM authentication on, so
every request's SigV4 signature is verified.

The pieces, all on loopback: moto in its own process (auth is a process-wide setting in
moto), a TLS-terminating front in front of it with a certificate from a CA made here (it can
answer ``ExpiredTokenException`` for access keys the test declares expired, as DynamoDB does
for an expired session token), and a small proxy (CONNECT tunnels, or forwarding).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import ssl
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
import requests

from rasd.config import Config
from rasd.devtools import motoserver
from rasd.server import Daemon
from rasd_client import aio as rasd_aio
from tests.helpers.tables import seed_pool

pytestmark = pytest.mark.integration

C, P = "demo", "default"
HOUR = timedelta(hours=1)
TABLE = "rasd-iam"


# ------------------------------------------------------------------------- certificates
@dataclass
class Pki:
    ca: Path
    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, self.key)
        return ctx


def make_pki(where: Path) -> Pki:
    """A private CA and a certificate for localhost / 127.0.0.1 signed by it."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rasd test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pki = Pki(where / "ca.pem", where / "cert.pem", where / "key.pem")
    pki.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pki.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return pki


# ------------------------------------------------------------------------------ HTTP bits
async def read_message(r: asyncio.StreamReader) -> tuple[bytes, dict[str, str], bytes]:
    """One HTTP/1.1 message framed by Content-Length: (head, lower-cased headers, body)."""
    head = await r.readuntil(b"\r\n\r\n")
    headers: dict[str, str] = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    body = await r.readexactly(int(headers.get("content-length", "0")))
    return head, headers, body


async def forward(request: bytes, host: str, port: int) -> bytes:
    """Send one whole request to host:port on a new connection; the whole response. A refused
    connect is tried again (a loaded machine's moto): nothing was sent, and rasd is not what
    this helper tests."""
    for delay in (0.05, 0.2, 0.5, None):
        try:
            r, w = await asyncio.open_connection(host, port)
            break
        except ConnectionError:
            if delay is None:
                raise
            await asyncio.sleep(delay)
    try:
        w.write(request)
        head, _, body = await read_message(r)
        return head + body
    finally:
        w.close()


async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    try:
        while data := await r.read(65536):
            w.write(data)
            await w.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        w.close()


@dataclass
class Front:
    """A TLS-terminating front of moto; records the access key of every request and answers
    ``ExpiredTokenException`` itself for the keys in ``expired``."""

    upstream: tuple[str, int]
    keys: list[str] = field(default_factory=list)
    expired: set[str] = field(default_factory=set)
    port: int = 0

    async def handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                head, headers, body = await read_message(r)
                key = headers.get("authorization", "").split("Credential=")[-1].split("/")[0]
                self.keys.append(key)
                if key in self.expired:
                    out = json.dumps(
                        {
                            "__type": "com.amazon.coral.service#ExpiredTokenException",
                            "message": "The security token included in the request is expired",
                        }
                    ).encode()
                    w.write(
                        b"HTTP/1.1 400 Bad Request\r\nx-amzn-RequestId: FRONT-EXPIRED\r\n"
                        b"Content-Type: application/x-amz-json-1.0\r\n"
                        + f"Content-Length: {len(out)}\r\n\r\n".encode()
                        + out
                    )
                else:
                    w.write(await forward(head + body, *self.upstream))
                await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            w.close()


@dataclass
class Proxy:
    """CONNECT tunnels, or plain HTTP forwarded from absolute-form requests. With ``auth``
    set, a request without that Proxy-Authorization gets 407."""

    auth: str | None = None
    connects: list[str] = field(default_factory=list)
    forwarded: list[str] = field(default_factory=list)
    port: int = 0

    async def handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                head, headers, body = await read_message(r)
                method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ")
                if self.auth is not None and headers.get("proxy-authorization") != self.auth:
                    w.write(b"HTTP/1.1 407 Proxy Authentication Required\r\n")
                    w.write(b"Content-Length: 0\r\n\r\n")
                    await w.drain()
                    return
                if method == "CONNECT":
                    self.connects.append(target)
                    host, port = target.rsplit(":", 1)
                    ur, uw = await asyncio.open_connection(host, int(port))
                    w.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    await w.drain()
                    await asyncio.gather(pipe(r, uw), pipe(ur, w))
                    return
                self.forwarded.append(target)
                rest = target.split("://", 1)[1]
                hostport, _, path = rest.partition("/")
                host, port = hostport.rsplit(":", 1)
                lines = head.split(b"\r\n")
                lines[0] = f"{method} /{path} HTTP/1.1".encode()
                kept = [ln for ln in lines if not ln.lower().startswith(b"proxy-authorization")]
                w.write(await forward(b"\r\n".join(kept) + body, host, int(port)))
                await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, ValueError):
            pass
        finally:
            w.close()


@asynccontextmanager
async def serving(handler: Any, ctx: ssl.SSLContext | None = None) -> AsyncIterator[int]:
    srv = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=ctx)
    try:
        yield srv.sockets[0].getsockname()[1]
    finally:
        srv.close()


# --------------------------------------------------------------------------- moto with IAM
@dataclass
class IamMoto:
    url: str
    port: int
    keys: dict[str, tuple[str, str]]  # "a", "b", "r1", "r2", "admin" -> (key id, secret)

    def admin(self, service: str = "dynamodb") -> Any:
        ak, sk = self.keys["admin"]
        return boto3.client(
            service,
            endpoint_url=self.url,
            region_name="us-east-1",
            aws_access_key_id=ak,
            aws_secret_access_key=sk,
            aws_session_token=None,
        )


@pytest.fixture(scope="module")
def iam_moto() -> Iterator[IamMoto]:
    """moto in its own process; users with access keys, the table and a pool, then IAM
    authentication switched on (signatures verified from then on)."""
    server = motoserver.spawn(fast=False)
    try:
        assert server.proc.stdout is not None
        # whatever moto prints later must not fill the pipe and block it
        threading.Thread(target=server.proc.stdout.read, daemon=True).start()
        port, url = server.port, server.endpoint
        iam = boto3.client("iam", endpoint_url=url, region_name="us-east-1")
        keys = {}
        users = (("rasd", ("a", "b")), ("rotating", ("r1", "r2")), ("admin", ("admin",)))
        for user, names in users:
            iam.create_user(UserName=user)
            iam.put_user_policy(
                UserName=user,
                PolicyName="all",
                PolicyDocument=json.dumps(
                    {
                        "Version": "2012-10-17",
                        "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
                    }
                ),
            )
            for name in names:
                k = iam.create_access_key(UserName=user)["AccessKey"]
                keys[name] = (k["AccessKeyId"], k["SecretAccessKey"])
        from rasd.core import schema

        moto = IamMoto(url, port, keys)
        requests.post(f"{url}/moto-api/reset-auth", data=b"0", timeout=10).raise_for_status()
        schema.create_table(moto.admin(), TABLE)
        seed_pool(moto.admin(), TABLE, count=20)
        yield moto
    finally:
        server.stop()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No AWS or proxy settings from outside; credentials come from what the test sets."""
    for var in list(os.environ):
        if var.startswith("AWS_") or var.lower() in ("https_proxy", "http_proxy", "no_proxy"):
            monkeypatch.delenv(var)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    (tmp_path / "config").write_text("")
    return tmp_path


def use_keys(monkeypatch: pytest.MonkeyPatch, moto: IamMoto, name: str) -> None:
    ak, sk = moto.keys[name]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ak)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", sk)


CREDS_SCRIPT = """\
import json, sys
print(open(sys.argv[1]).read())
"""


def credential_process(where: Path, ak: str, sk: str) -> None:
    """Point the default profile at a credential_process printing the keys in creds.json
    (rewritten to rotate them); they expire in a day, so nothing refreshes them unasked."""
    (where / "creds.py").write_text(CREDS_SCRIPT)
    expires = datetime.datetime.now(datetime.timezone.utc) + timedelta(days=1)
    (where / "creds.json").write_text(
        json.dumps(
            {
                "Version": 1,
                "AccessKeyId": ak,
                "SecretAccessKey": sk,
                "Expiration": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        )
    )
    (where / "config").write_text(
        "[default]\n"
        f"credential_process = {sys.executable} {where / 'creds.py'} {where / 'creds.json'}\n"
    )


@asynccontextmanager
async def daemon(tmp: Path, endpoint: str | None, **cfg: Any) -> AsyncIterator[Daemon]:
    d = Daemon(
        Config(
            clock_check="date",
            table=TABLE,
            endpoint_url=endpoint,
            socket=str(tmp / "d.sock"),
            ddb_warm_connections=1,
            **cfg,
        ).validate()
    )
    await d.startup()
    try:
        yield d
    finally:
        await d.shutdown(drain=2.0)


@asynccontextmanager
async def tls_front(moto: IamMoto, pki: Pki) -> AsyncIterator[Front]:
    front = Front(("127.0.0.1", moto.port))
    async with serving(front.handle, pki.server_context()) as port:
        front.port = port
        yield front


@asynccontextmanager
async def proxy(auth: str | None = None, ctx: ssl.SSLContext | None = None) -> AsyncIterator[Proxy]:
    p = Proxy(auth)
    async with serving(p.handle, ctx) as port:
        p.port = port
        yield p


@pytest.fixture
def short_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="rasd-aws-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------------- tests
async def test_connect_proxy_private_ca_and_verified_signatures(
    iam_moto: IamMoto, aws_env: Path, short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTPS_PROXY and AWS_CA_BUNDLE honoured: the daemon reaches a TLS endpoint whose
    certificate only the private CA vouches for, through a CONNECT tunnel, and moto verifies
    every signature (the endpoint name comes from AWS_ENDPOINT_URL_DYNAMODB)."""
    pki = make_pki(aws_env)
    use_keys(monkeypatch, iam_moto, "a")
    async with tls_front(iam_moto, pki) as front, proxy() as px:
        monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", f"https://localhost:{front.port}")
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{px.port}")
        monkeypatch.setenv("AWS_CA_BUNDLE", str(pki.ca))
        async with daemon(short_dir, None) as d:
            lease = await rasd_aio.get_lease(C, P, "k1", HOUR, socket_path=d.cfg.socket, timeout=5)
            assert lease.new
            assert d.store.aws is not None and d.store.aws.ca_bundle == str(pki.ca)
    assert px.connects and set(px.connects) == {f"localhost:{front.port}"}
    assert set(front.keys) == {iam_moto.keys["a"][0]}
    # moto verifies: the same call signed with a wrong secret is refused
    bad = boto3.client(
        "dynamodb",
        endpoint_url=iam_moto.url,
        region_name="us-east-1",
        aws_access_key_id=iam_moto.keys["a"][0],
        aws_secret_access_key="wrong",
    )
    with pytest.raises(Exception, match="Signature"):
        bad.describe_table(TableName=TABLE)


async def test_no_proxy_bypasses_the_proxy(
    iam_moto: IamMoto, aws_env: Path, short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pki = make_pki(aws_env)
    use_keys(monkeypatch, iam_moto, "a")
    async with tls_front(iam_moto, pki) as front, proxy() as px:
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{px.port}")
        monkeypatch.setenv("NO_PROXY", "localhost")
        monkeypatch.setenv("AWS_CA_BUNDLE", str(pki.ca))
        async with daemon(short_dir, f"https://localhost:{front.port}") as d:
            assert d.store.aws is not None and d.store.aws.proxy_url is None
            lease = await rasd_aio.get_lease(C, P, "k2", HOUR, socket_path=d.cfg.socket, timeout=5)
            assert lease.resource
    assert px.connects == [] and front.keys


async def test_proxy_credentials_and_a_tls_proxy(
    iam_moto: IamMoto, aws_env: Path, short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """user:password in the proxy URL becomes Proxy-Authorization; an https:// proxy is
    reached over TLS (verified with the same bundle), the endpoint's TLS inside the tunnel;
    a proxy that refuses CONNECT is named in the error."""
    pki = make_pki(aws_env)
    use_keys(monkeypatch, iam_moto, "a")
    monkeypatch.setenv("AWS_CA_BUNDLE", str(pki.ca))
    basic = "Basic dTpwQHNz"  # u:p@ss
    async with tls_front(iam_moto, pki) as front:
        async with proxy(basic, pki.server_context()) as px:
            monkeypatch.setenv("HTTPS_PROXY", f"https://u:p%40ss@localhost:{px.port}")
            async with daemon(short_dir, f"https://localhost:{front.port}") as d:
                got = await rasd_aio.get_lease(
                    C, P, "k3", HOUR, socket_path=d.cfg.socket, timeout=5
                )
                assert got.resource
            assert px.connects
        async with proxy(basic) as px:
            monkeypatch.setenv("HTTPS_PROXY", f"http://u:wrong@127.0.0.1:{px.port}")
            with pytest.raises(Exception, match="407"):
                async with daemon(short_dir, f"https://localhost:{front.port}"):
                    pass


async def test_http_endpoint_through_a_forwarding_proxy(
    iam_moto: IamMoto, aws_env: Path, short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP_PROXY for a plain-HTTP endpoint: requests go to the proxy in absolute form."""
    use_keys(monkeypatch, iam_moto, "a")
    async with proxy() as px:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{px.port}")
        async with daemon(short_dir, iam_moto.url) as d:
            got = await rasd_aio.get_lease(C, P, "k4", HOUR, socket_path=d.cfg.socket, timeout=5)
            assert got.resource
    assert px.forwarded and all(t == f"{iam_moto.url}/" for t in px.forwarded)


async def test_an_untrusted_certificate_is_named_as_such(
    iam_moto: IamMoto, aws_env: Path, short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the private CA in the bundle the failure says TLS verification failed and
    which bundle was used, not "could not connect"."""
    pki = make_pki(aws_env)
    use_keys(monkeypatch, iam_moto, "a")
    async with tls_front(iam_moto, pki) as front:
        with pytest.raises(Exception) as err:
            async with daemon(short_dir, f"https://localhost:{front.port}"):
                pass
    text = f"{err.value} {err.value.__cause__} {err.value.__context__}"
    assert "certificate verify failed" in text and "CA bundle" in text, text


async def test_rotated_credentials_and_an_expired_token(
    iam_moto: IamMoto, aws_env: Path, short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Credentials from a credential_process; the keys are rotated (the old key deleted in
    IAM) and DynamoDB calls the old session token expired: the daemon refreshes its
    credentials at once (off the event loop), retries once, and the lease is granted, signed
    with the new key and verified."""
    pki = make_pki(aws_env)
    (ak_a, sk_a), (ak_b, sk_b) = iam_moto.keys["r1"], iam_moto.keys["r2"]
    credential_process(aws_env, ak_a, sk_a)
    monkeypatch.setenv("AWS_CA_BUNDLE", str(pki.ca))
    async with (
        tls_front(iam_moto, pki) as front,
        daemon(short_dir, f"https://localhost:{front.port}") as d,
    ):
        first = await rasd_aio.get_lease(C, P, "r1", HOUR, socket_path=d.cfg.socket, timeout=5)
        assert first.new and set(front.keys) == {ak_a}
        credential_process(aws_env, ak_b, sk_b)  # rotation: B issued, A revoked
        iam = iam_moto.admin("iam")
        await asyncio.to_thread(iam.delete_access_key, UserName="rotating", AccessKeyId=ak_a)
        front.expired.add(ak_a)
        second = await rasd_aio.get_lease(C, P, "r2", HOUR, socket_path=d.cfg.socket, timeout=5)
        assert second.new
        assert front.keys[-1] == ak_b and ak_a in front.keys
        assert d.counters["ddb.expired_token"] >= 1
        assert d.store.client.credential_refreshes >= 1
    got = iam_moto.admin().get_item(
        TableName=TABLE,
        Key={"client_id": {"S": C}, "resource": {"S": second.resource}},
        ConsistentRead=True,
    )["Item"]
    assert got["key"]["S"] == "r2"


async def test_a_setting_rasd_cannot_honour_refuses_the_start(
    aws_env: Path, short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SOCKS proxy: the daemon logs startup_refused with the reason and ends with exit
    status 2 instead of connecting directly (or retrying forever, degraded)."""
    import structlog

    monkeypatch.setenv("HTTPS_PROXY", "socks5h://127.0.0.1:1080")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "b")
    cfg = Config(table=TABLE, socket=str(short_dir / "d.sock"), clock_check="date").validate()
    d = Daemon(cfg)
    with structlog.testing.capture_logs() as logs:
        await asyncio.wait_for(d.run(), 30)
    assert d.exit_status == 2
    refused = [e for e in logs if e["event"] == "startup_refused"]
    assert refused and "SOCKS" in refused[0]["cause"], logs


# ------------------------------------------------------------ settings from the cache
@asynccontextmanager
async def running(cfg: Config) -> AsyncIterator[tuple[Daemon, asyncio.Task[None], list[Any]]]:
    """The daemon's whole life (``Daemon.run``), its log lines captured."""
    import structlog

    d = Daemon(cfg)
    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(d.run())
        try:
            yield d, task, logs
        finally:
            d.stop()
            await asyncio.wait_for(task, 30)


async def until(pred: Any, what: str) -> None:
    for _ in range(600):  # bounded poll, not a timing assertion
        if pred():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


def cache_config(
    monkeypatch: pytest.MonkeyPatch, where: Path, endpoint: str, table: str
) -> tuple[Config, str]:
    """A daemon's config on moto, the cache in ``where``, and the digest of its AWS inputs
    (the tests ask for moto's fixtures before ``aws_env``, which removes their credentials)."""
    from rasd.dynamo import awscache

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "b")
    monkeypatch.setenv("CACHE_DIRECTORY", str(where / "cache"))
    cfg = Config(
        clock_check="date",
        table=table,
        endpoint_url=endpoint,
        socket=str(where / "d.sock"),
        ddb_warm_connections=1,
    ).validate()
    key = awscache.inputs_key(endpoint, cfg.region, None)
    assert key is not None
    return cfg, key


async def test_a_restart_serves_on_the_cached_settings_and_botocore_confirms_them(
    moto_endpoint: str,
    ddb: Any,
    table: str,
    aws_env: Path,
    short_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seed_pool(ddb, table, count=3)
    cfg, _ = cache_config(monkeypatch, short_dir, moto_endpoint, table)
    for n, origin in enumerate(["botocore", "cache"]):
        async with running(cfg) as (d, task, logs):
            lease = await rasd_aio.get_lease(
                C, P, f"c{n}", HOUR, socket_path=cfg.socket, timeout=30
            )
            assert lease.new
            ready = next(e for e in logs if e["event"] == "ready")
            assert ready["aws"]["origin"] == origin
            if origin == "cache":
                await until(
                    lambda: any(e["event"] == "aws_settings_confirmed" for e in logs),
                    "botocore's check of the cached settings",
                )
            assert not task.done() and d.exit_status == 0


async def test_cached_settings_botocore_refuses_stop_the_daemon(
    moto_endpoint: str,
    ddb: Any,
    table: str,
    aws_env: Path,
    short_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An entry for inputs botocore refuses (written by hand: a refusal is never cached; an
    input that escaped the digest would do the same): the daemon starts on it, and stops as a
    refused start (exit 2) once botocore's check refuses; the entry is gone."""
    from rasd.dynamo import aws, awscache

    seed_pool(ddb, table, count=3)
    monkeypatch.setenv("HTTP_PROXY", "socks5h://127.0.0.1:1080")
    cfg, key = cache_config(monkeypatch, short_dir, moto_endpoint, table)
    awscache.save(key, aws.AwsSettings(region=cfg.region, endpoint_url=moto_endpoint))
    async with running(cfg) as (d, task, logs):
        await until(lambda: task.done(), "the daemon stops")
    assert d.exit_status == 2
    refused = [e for e in logs if e["event"] == "startup_refused"]
    assert refused and "SOCKS" in refused[0]["cause"], logs
    assert awscache.load(key) is None


async def test_cached_settings_botocore_decides_otherwise_stop_the_daemon(
    moto_endpoint: str,
    ddb: Any,
    table: str,
    aws_env: Path,
    short_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An entry that disagrees with botocore (max_attempts 9, botocore's default is 3): the
    daemon stops (exit 1: the service manager restarts it), naming both; the next start is
    botocore's."""
    from rasd.dynamo import aws, awscache

    seed_pool(ddb, table, count=3)
    cfg, key = cache_config(monkeypatch, short_dir, moto_endpoint, table)
    stale = aws.AwsSettings(region=cfg.region, endpoint_url=moto_endpoint, max_attempts=9)
    awscache.save(key, stale)
    async with running(cfg) as (d, task, logs):
        await until(lambda: task.done(), "the daemon stops")
    assert d.exit_status == 1
    (changed,) = [e for e in logs if e["event"] == "aws_settings_changed"]
    assert changed["cached"]["max_attempts"] == 9 and changed["botocore"]["max_attempts"] == 3
    assert awscache.load(key) is None
    async with running(cfg) as (d, task, logs):
        await rasd_aio.get_lease(C, P, "k", HOUR, socket_path=cfg.socket, timeout=30)
        ready = next(e for e in logs if e["event"] == "ready")
        assert ready["aws"]["origin"] == "botocore" and ready["aws"]["max_attempts"] == 3
