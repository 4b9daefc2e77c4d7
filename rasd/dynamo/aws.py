"""The AWS settings the daemon's DynamoDB client honours, resolved once at start-up by botocore.

:func:`resolve` makes a botocore DynamoDB client for the region and reads what it decided
(endpoint, proxy, CA bundle, retries, keep-alive); what rasd cannot honour raises
:class:`AwsSettingsError`. Resolution reads files: call it in a thread. Each setting, and
what is refused: docs/operations.md, "AWS settings".
"""

from __future__ import annotations

import json
import os
import ssl
import sys
from base64 import b64encode
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import unquote, urlsplit

from ..config import ConfigError
from .retry import DEFAULT_MAX_ATTEMPTS


class AwsSettingsError(ConfigError):
    """An AWS setting the daemon cannot honour, or cannot use (a CA bundle that does not load)."""


@dataclass(frozen=True)
class AwsSettings:
    """What the DynamoDB client connects to and how (see the module docstring)."""

    region: str
    endpoint_url: str
    #: proxy to go through (``http://host:port`` or ``https://...``), credentials removed
    proxy_url: str | None = None
    #: headers for the proxy (``Proxy-Authorization`` from the proxy URL's user and password)
    proxy_headers: tuple[tuple[str, str], ...] = ()
    #: CA bundle verifying an ``https://`` proxy (the profile's ``proxy_ca_bundle``)
    proxy_ca_bundle: str | None = None
    #: CA bundle verifying the endpoint's certificate (None: not TLS)
    ca_bundle: str | None = None
    #: where each value came from, for ``rasd check-config``
    sources: dict[str, str] = field(default_factory=dict)
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    tcp_keepalive: bool = False
    #: the digest of the inputs when these settings came from an earlier start's resolution
    #: (``rasd.dynamo.awscache``), else None: resolved by botocore in this start
    cache_key: str | None = field(default=None, compare=False, repr=False)

    @property
    def tls(self) -> bool:
        return self.endpoint_url.startswith("https:")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The endpoint's TLS context: verifies against ``ca_bundle`` only, as botocore."""
        return _context(self.ca_bundle, "CA bundle") if self.tls else None

    def proxy_ssl_context(self) -> ssl.SSLContext | None:
        if self.proxy_url is None or not self.proxy_url.startswith("https:"):
            return None
        return _context(self.proxy_ca_bundle or self.ca_bundle, "proxy CA bundle")

    def public(self) -> dict[str, Any]:
        """For ``rasd check-config`` and the ``ready`` log line (no secrets: the proxy's
        password is never kept here)."""
        return {
            "region": self.region,
            "endpoint_url": self.endpoint_url,
            "proxy": self.proxy_url,
            "proxy_auth": bool(self.proxy_headers),
            "ca_bundle": self.ca_bundle,
            "retry_mode": "standard",
            "max_attempts": self.max_attempts,
            "tcp_keepalive": self.tcp_keepalive,
            "sources": dict(self.sources),
            "origin": "botocore" if self.cache_key is None else "cache",
        }

    def to_doc(self) -> dict[str, Any]:
        """As JSON (``rasd.dynamo.awscache``): what is compared, not ``cache_key``."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.compare}

    @classmethod
    def from_doc(cls, doc: dict[str, Any], cache_key: str | None = None) -> AwsSettings:
        headers = tuple((str(k), str(v)) for k, v in doc["proxy_headers"])
        return cls(**{**doc, "proxy_headers": headers}, cache_key=cache_key)


def _context(cafile: str | None, what: str) -> ssl.SSLContext:
    try:
        return ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        raise AwsSettingsError(f"{what} {cafile!r} cannot be loaded: {exc}") from exc


def _source(env_var: str, profile_key: str, profile: dict[str, Any], default: str) -> str:
    if os.environ.get(env_var):
        return env_var
    if profile.get(profile_key) is not None:
        return f"profile {profile_key}"
    return default


def _sent_to(client: Any) -> str:
    """Where botocore sends a GetItem: a request is built and signed as for real, and
    answered before anything is sent (``before-send``). Per-request endpoint rules (the
    account-based endpoint of credentials that carry an account id) are applied this way."""
    from botocore.awsrequest import AWSResponse

    urls: list[str] = []

    class _Body:
        def stream(self, **_: Any) -> Any:
            yield b"{}"

    def answer(request: Any, **_: Any) -> AWSResponse:
        urls.append(request.url)
        return AWSResponse(request.url, 200, {}, _Body())  # type: ignore[arg-type]

    client.meta.events.register("before-send.dynamodb", answer)
    client.get_item(TableName="rasd", Key={"client_id": {"S": "#"}, "resource": {"S": "#"}})
    p = urlsplit(urls[-1])
    return f"{p.scheme}://{p.netloc}"


def resolve(endpoint_url: str | None, region: str, account_id: str | None = None) -> AwsSettings:
    """botocore's decisions for a DynamoDB client in ``region`` (``endpoint_url``: rasd's own
    setting, which wins as botocore's ``endpoint_url=`` argument does; ``account_id``: the
    credentials' account, for botocore's account-based endpoints). Blocking: reads the shared
    config file. Raises :class:`AwsSettingsError` for what rasd cannot honour."""
    import botocore.session
    from botocore.exceptions import BotoCoreError
    from botocore.httpsession import get_cert_path
    from botocore.utils import get_environ_proxies

    try:
        session = botocore.session.Session()
        profile: dict[str, Any] = session.get_scoped_config()
        # keys are not needed to resolve anything (rasd.dynamo.ddb resolves them); the account is
        if str(session.get_config_variable("endpoint_discovery_enabled")).lower() == "true":
            raise AwsSettingsError(
                "AWS settings rasd cannot honour: endpoint_discovery_enabled = true (rasd does "
                "not discover endpoints with DescribeEndpoints); unset it"
            )
        mode = session.get_config_variable("account_id_endpoint_mode") or "preferred"
        if mode == "required" and not account_id:
            raise AwsSettingsError(
                "account_id_endpoint_mode = required, and the credentials carry no account id"
            )
        client = session.create_client(
            "dynamodb",
            region_name=region,
            endpoint_url=endpoint_url or None,
            aws_access_key_id="unused",
            aws_secret_access_key="unused",
            aws_account_id=account_id,
        )
        url = _sent_to(client)
    except (BotoCoreError, ValueError) as exc:
        raise AwsSettingsError(f"AWS settings: {exc}") from exc
    problems: list[str] = []
    conf: Any = client.meta.config
    sources: dict[str, str] = {}
    if endpoint_url:
        sources["endpoint_url"] = "rasd endpoint_url"
    elif os.environ.get("AWS_ENDPOINT_URL_DYNAMODB") and url == os.environ.get(
        "AWS_ENDPOINT_URL_DYNAMODB"
    ):
        sources["endpoint_url"] = "AWS_ENDPOINT_URL_DYNAMODB"
    elif os.environ.get("AWS_ENDPOINT_URL") and url == os.environ.get("AWS_ENDPOINT_URL"):
        sources["endpoint_url"] = "AWS_ENDPOINT_URL"
    elif account_id and url.startswith(f"https://{account_id}."):
        sources["endpoint_url"] = "botocore (the credentials' account id)"
    else:
        sources["endpoint_url"] = "botocore (region, profile, FIPS/dual-stack settings)"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        problems.append(f"endpoint {url!r}: must be http(s)://host[:port]")
    if parts.path not in ("", "/") or parts.query:
        problems.append(f"endpoint {url!r}: a path or query is not supported")

    # retries
    mode = os.environ.get("AWS_RETRY_MODE") or profile.get("retry_mode")
    if mode and mode != "standard":
        problems.append(
            f"retry_mode {mode!r} ({_source('AWS_RETRY_MODE', 'retry_mode', profile, '')}): "
            "rasd retries in botocore's standard mode only; set it to 'standard' or unset it"
        )
    retries = conf.retries or {}
    max_attempts = int(retries.get("total_max_attempts") or DEFAULT_MAX_ATTEMPTS)
    sources["max_attempts"] = _source(
        "AWS_MAX_ATTEMPTS", "max_attempts", profile, "botocore default (3)"
    )
    if max_attempts < 1:
        problems.append(f"max_attempts {max_attempts}: must be >= 1")
    if getattr(conf, "client_cert", None):
        problems.append("client_cert: rasd does not present client certificates")

    # TLS
    ca: str | None = None
    if parts.scheme == "https":
        configured = session.get_config_variable("ca_bundle")
        ca = configured or get_cert_path(True)
        sources["ca_bundle"] = _source(
            "AWS_CA_BUNDLE", "ca_bundle", profile, "botocore default bundle"
        )

    # proxy
    proxy_url: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    proxies = conf.proxies or get_environ_proxies(url)
    raw = proxies.get(parts.scheme) if proxies else None
    # the profile's proxies_config section (the AWS CLI applies it), then the client's
    pconf: dict[str, Any] = {
        **(session.get_config_variable("proxies_config") or {}),
        **(conf.proxies_config or {}),
    }
    proxy_ca: str | None = None
    if raw:
        sources["proxy"] = next(
            (
                v
                for v in (f"{parts.scheme.upper()}_PROXY", f"{parts.scheme}_proxy")
                if os.environ.get(v) == raw
            ),
            f"{parts.scheme} proxy (system settings)",
        )
        if "://" in raw and not raw.startswith(("http://", "https://")):
            problems.append(
                f"proxy {_redact(raw)!r} ({sources['proxy']}): only http:// and https:// "
                "proxies are supported (SOCKS is not)"
            )
        else:
            fixed = raw if "://" in raw else "http://" + raw.removeprefix("//")
            p = urlsplit(fixed)
            if not p.hostname:
                problems.append(f"proxy {_redact(raw)!r}: no host")
            else:
                host = f"[{p.hostname}]" if ":" in p.hostname else p.hostname
                default = 443 if p.scheme == "https" else 80
                proxy_url = f"{p.scheme}://{host}:{p.port or default}"
                if p.username and p.password:
                    auth = f"{unquote(p.username)}:{unquote(p.password)}"
                    headers = (
                        ("Proxy-Authorization", f"Basic {b64encode(auth.encode()).decode()}"),
                    )
        if pconf.get("proxy_client_cert"):
            problems.append("proxies_config proxy_client_cert: not supported by rasd")
        if str(pconf.get("proxy_use_forwarding_for_https", "")).lower() == "true":
            problems.append(
                "proxies_config proxy_use_forwarding_for_https: not supported by rasd "
                "(it tunnels HTTPS with CONNECT)"
            )
        proxy_ca = pconf.get("proxy_ca_bundle") or None
    else:
        sources["proxy"] = "none (no proxy setting, or NO_PROXY matches the endpoint)"
    if problems:
        raise AwsSettingsError("AWS settings rasd cannot honour:\n  " + "\n  ".join(problems))
    settings = AwsSettings(
        region=region,
        endpoint_url=url,
        proxy_url=proxy_url,
        proxy_headers=headers,
        proxy_ca_bundle=proxy_ca,
        ca_bundle=ca,
        sources=sources,
        max_attempts=max_attempts,
        tcp_keepalive=bool(getattr(conf, "tcp_keepalive", False)),
    )
    settings.ssl_context()  # a bundle that does not load stops start-up here
    settings.proxy_ssl_context()
    return settings


def _redact(url: str) -> str:
    """A proxy URL without its password."""
    p = urlsplit(url)
    if p.password is None:
        return url
    return url.replace(f":{p.password}@", ":***@", 1)


def child(argv: list[str]) -> None:
    """A process of its own that resolves for the daemon (``rasd.dynamo.awscache``), with the
    daemon's environment: ``endpoint_url region account_id background`` (empty: none;
    ``background`` "1": at low priority). Prints ``{"settings": ...}`` or ``{"refused":
    reason}``."""
    endpoint_url, region, account_id, background = argv
    if background == "1":
        try:
            os.nice(10)  # the daemon serves meanwhile
        except OSError:
            pass  # refused (the unit's SystemCallFilter=~@resources): at the daemon's priority
    try:
        got = resolve(endpoint_url or None, region, account_id or None)
        out: dict[str, Any] = {"settings": got.to_doc()}
    except AwsSettingsError as exc:
        out = {"refused": str(exc)}
    sys.stdout.write(json.dumps(out))
