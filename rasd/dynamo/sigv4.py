"""SigV4 for DynamoDB's JSON protocol (:class:`Signer`: a signing key derived once per secret,
date and region), and the credentials, botocore's chain refreshed in a thread
(:func:`resolve_credentials`, :class:`BotocoreCredentials`).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import sys
import time
from typing import Any, NamedTuple

SERVICE = "dynamodb"
CONTENT_TYPE = "application/x-amz-json-1.0"
#: Refreshable credentials are looked at (cheaply) at most this often.
CREDS_CHECK = 1.0


# ---------------------------------------------------------------------------- credentials
class Frozen(NamedTuple):
    """One frozen set of signing credentials (held until the next refresh)."""

    access_key: str
    secret_key: str
    token: str | None


class Credentials:
    """Where the signing credentials come from. ``current()`` is called once per request and
    returns the :class:`Frozen` set in use."""

    def __init__(
        self, access_key: str, secret_key: str, token: str | None, account_id: str | None = None
    ) -> None:
        self._frozen = Frozen(access_key, secret_key, token)
        #: the AWS account the credentials belong to, when they say (botocore then uses the
        #: account-based endpoint)
        self.account_id = account_id

    def current(self) -> Frozen:
        return self._frozen


class BotocoreCredentials(Credentials):
    """botocore credentials (possibly refreshable): frozen once per CREDS_CHECK seconds;
    a refresh that botocore asks for (advisory or mandatory) runs in a thread."""

    def __init__(self, creds: Any) -> None:
        f = creds.get_frozen_credentials()
        super().__init__(f.access_key, f.secret_key, f.token, getattr(f, "account_id", None))
        self._creds = creds
        self._next = time.monotonic() + CREDS_CHECK
        self._refreshing: asyncio.Future[Any] | None = None

    def current(self) -> Frozen:
        now = time.monotonic()
        if now >= self._next and self._refreshing is None:
            self._next = now + CREDS_CHECK
            needed = getattr(self._creds, "refresh_needed", None)
            if needed is not None and needed():
                loop = asyncio.get_running_loop()
                fut = loop.run_in_executor(None, self._creds.get_frozen_credentials)
                fut.add_done_callback(self._refreshed)
                self._refreshing = fut
            else:
                self._take(self._creds.get_frozen_credentials())
        return self._frozen

    def _take(self, f: Any) -> None:
        self._frozen = Frozen(f.access_key, f.secret_key, f.token)

    def _refreshed(self, fut: asyncio.Future[Any]) -> None:
        self._refreshing = None
        if not fut.cancelled() and fut.exception() is None:
            self._take(fut.result())
        # a failed refresh: keep the old credentials; the next check tries again


def env_credentials() -> Credentials | None:
    """The static keys in the environment, when botocore's chain would take them (its first
    provider), else None. Reads nothing but the environment."""
    env = os.environ
    ak, sk = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if ak and sk and not env.get("AWS_CREDENTIAL_EXPIRATION"):
        token = env.get("AWS_SESSION_TOKEN") or env.get("AWS_SECURITY_TOKEN")
        return Credentials(ak, sk, token, env.get("AWS_ACCOUNT_ID") or None)
    return None


def resolve_credentials() -> Credentials:
    """botocore's standard chain. Its first provider reads the environment; when that has
    static keys they are used without loading botocore's session (a start-up saving of about
    half a second). Blocking (profiles, IMDS): call it in a thread."""
    static = env_credentials()
    if static is not None:
        return static
    import botocore.session
    from botocore.exceptions import NoCredentialsError

    creds = botocore.session.get_session().get_credentials()
    if creds is None:
        raise NoCredentialsError()
    return BotocoreCredentials(creds)


# -------------------------------------------------------------------------------- signing
class Signer:
    """SigV4 for DynamoDB's JSON protocol (POST /, no query string): the signing key is
    derived once per (secret, date, region) and cached; each request costs two SHA-256 and
    one HMAC. Equal to botocore's ``SigV4Auth`` (tests/unit/test_ddb.py)."""

    def __init__(self, region: str, host: str) -> None:
        self.region = region
        self.host = host
        self._key_for: tuple[str, str] | None = None
        self._key = b""
        self._scope = ""

    def signing_key(self, secret: str, date: str) -> bytes:
        if self._key_for != (secret, date):
            k = hmac.digest(f"AWS4{secret}".encode(), date.encode(), "sha256")
            k = hmac.digest(k, self.region.encode(), "sha256")
            k = hmac.digest(k, SERVICE.encode(), "sha256")
            self._key = hmac.digest(k, b"aws4_request", "sha256")
            self._key_for = (secret, date)
            self._scope = f"{date}/{self.region}/{SERVICE}/aws4_request"
        return self._key

    def authorization(
        self,
        target: str,
        body: bytes,
        amz_date: str,
        access_key: str,
        secret_key: str,
        token: str | None,
    ) -> str:
        """The Authorization header of a request carrying exactly the headers content-type,
        host, x-amz-date, x-amz-target (and x-amz-security-token with ``token``)."""
        key = self.signing_key(secret_key, amz_date[:8])
        if token is None:
            signed = "content-type;host;x-amz-date;x-amz-target"
            headers = (
                f"content-type:{CONTENT_TYPE}\nhost:{self.host}\nx-amz-date:{amz_date}\n"
                f"x-amz-target:{target}\n"
            )
        else:
            signed = "content-type;host;x-amz-date;x-amz-security-token;x-amz-target"
            headers = (
                f"content-type:{CONTENT_TYPE}\nhost:{self.host}\nx-amz-date:{amz_date}\n"
                f"x-amz-security-token:{token}\nx-amz-target:{target}\n"
            )
        canonical = f"POST\n/\n\n{headers}\n{signed}\n{hashlib.sha256(body).hexdigest()}"
        to_sign = (
            f"AWS4-HMAC-SHA256\n{amz_date}\n{self._scope}\n"
            f"{hashlib.sha256(canonical.encode()).hexdigest()}"
        )
        sig = hmac.digest(key, to_sign.encode(), "sha256").hex()  # one-shot, in C
        return (
            f"AWS4-HMAC-SHA256 Credential={access_key}/{self._scope}, "
            f"SignedHeaders={signed}, Signature={sig}"
        )


class AmzDate:
    """The X-Amz-Date value, formatted once per second."""

    __slots__ = ("_sec", "_val")

    def __init__(self) -> None:
        self._sec = -1
        self._val = ""

    def __call__(self) -> str:
        sec = int(time.time())
        if sec != self._sec:
            self._val = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(sec))
            self._sec = sec
        return self._val


def user_agent() -> str:
    from .. import __version__

    py = ".".join(map(str, sys.version_info[:3]))
    return f"rasd/{__version__} md/lean-ddb lang/python#{py} os/{os.uname().sysname.lower()}"
