"""botocore's AWS settings from an earlier start, reused while their inputs are unchanged.

:func:`inputs_key` digests the inputs, :func:`settings` decides hit or miss, :func:`confirm`
has botocore check a hit once the daemon is up, :func:`prefetch` starts botocore's child
early. What is cached and when: docs/operations.md, "AWS settings"; why: docs/design.md,
"Talking to DynamoDB".
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import structlog

from . import aws
from .aws import AwsSettings, AwsSettingsError

log = structlog.get_logger("rasd.dynamo")

#: Changes when an entry's layout or the digest's inputs change.
FORMAT = "rasd-aws-settings/1"
#: Entries kept (the newest used or written); one per set of inputs.
KEEP = 8
#: The resolving child's bound; past it the daemon resolves in-process (miss) or goes on
#: unchecked (hit).
CHILD_TIMEOUT = 60.0

#: Environment variables botocore reads that the settings do not depend on: credentials
#: (:func:`aws.resolve` signs with placeholders; the account id is an argument). Leaving them
#: out keeps rotating session credentials from missing the cache at every start.
_CREDENTIAL_VARS = frozenset(
    {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_CREDENTIAL_EXPIRATION",
    }
)
#: Other variables botocore or urllib read: the home directory (``~``), urllib's CGI guard on
#: HTTP_PROXY, a CA bundle botocore may honour.
_OTHER_VARS = frozenset({"HOME", "REQUEST_METHOD", "REQUESTS_CA_BUNDLE"})

#: The child's program (``aws.child``): rasd from the daemon's own tree, whatever the
#: working directory; nothing of the daemon's is imported but the resolver.
_CHILD = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from rasd.dynamo.aws import child; child(sys.argv[2:])"
)


#: Children started by :func:`prefetch` for :func:`settings`, by (endpoint_url, region,
#: account_id): the digest of the inputs when each started, and the child.
_early: dict[tuple[str | None, str, str | None], tuple[str | None, subprocess.Popen[bytes]]] = {}


class Unconfirmed(Exception):
    """botocore's check of cached settings gave no verdict."""


class ChildFailed(Unconfirmed):
    """The resolving child did not answer (crashed, timed out, could not start)."""


# -------------------------------------------------------------------------- the inputs
def _env_inputs(env: dict[str, str] | os._Environ[str]) -> list[tuple[str, str]]:
    """Every variable botocore's settings can depend on: all of AWS_* and BOTO* (but the
    credentials), every *_proxy as urllib reads them (NO_PROXY too), and a few others."""
    return sorted(
        (k, v)
        for k, v in env.items()
        if (k.startswith(("AWS_", "BOTO")) and k not in _CREDENTIAL_VARS)
        or k.lower().endswith("_proxy")
        or k in _OTHER_VARS
    )


@functools.cache
def _code_inputs() -> tuple[str, ...]:
    """rasd's resolver (its version and source), botocore (version and where), Python."""
    import botocore

    from .. import __version__

    source = hashlib.sha256(Path(aws.__file__).read_bytes()).hexdigest()
    return (__version__, source, botocore.__version__, botocore.__file__ or "", sys.version)


def inputs_key(endpoint_url: str | None, region: str, account_id: str | None) -> str | None:
    """The digest of everything :func:`aws.resolve` depends on, or None when the settings
    must not be cached (botocore data of one's own). Blocking: reads the config files."""
    env = os.environ
    if env.get("AWS_DATA_PATH") or os.path.isdir(os.path.expanduser("~/.aws/models")):
        return None
    files: list[tuple[str, str]] = []
    # the paths as botocore's config chain and configloader spell them
    for var, default in (
        ("AWS_CONFIG_FILE", "~/.aws/config"),
        ("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"),
    ):
        path = os.path.expanduser(os.path.expandvars(env.get(var, default)))
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            files.append((path, f"unreadable: errno {exc.errno}"))
            continue
        if b"data_path" in data:
            return None
        files.append((path, hashlib.sha256(data).hexdigest()))
    inputs = [
        FORMAT,
        _code_inputs(),
        [endpoint_url, region, account_id],
        _env_inputs(env),
        files,
    ]
    return hashlib.sha256(json.dumps(inputs).encode()).hexdigest()


# ------------------------------------------------------------------------------ entries
def cache_dir() -> Path | None:
    if d := os.environ.get("CACHE_DIRECTORY"):  # systemd's: the first when several
        return Path(d.split(":")[0])
    if d := os.environ.get("XDG_CACHE_HOME"):
        return Path(d) / "rasd"
    home = os.path.expanduser("~")
    return None if home == "~" else Path(home) / ".cache" / "rasd"


def _path(key: str) -> Path | None:
    d = cache_dir()
    return None if d is None else d / f"aws-{key[:32]}.json"


def load(key: str) -> AwsSettings | None:
    """The entry for ``key``, if there is a usable one."""
    path = _path(key)
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                return None  # another user could have written it
            doc = json.loads(fh.read())
        if doc.get("key") != key:
            return None
        s = AwsSettings.from_doc(doc["settings"], cache_key=key)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if any(p and not os.path.isfile(p) for p in (s.ca_bundle, s.proxy_ca_bundle)):
        return None  # a bundle moved (certifi upgraded...): botocore decides again
    return s


def save(key: str, s: AwsSettings) -> bool:
    """Write the entry (atomically, readable by the daemon's user only); False if it was not
    written (a proxy password, or no writable directory). Drops the oldest entries."""
    path = _path(key)
    if path is None or s.proxy_headers:
        return False
    tmp = None
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".aws-", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump({"key": key, "settings": s.to_doc()}, fh)
        os.replace(tmp, path)
        tmp = None
        entries = sorted(path.parent.glob("aws-*.json"), key=_mtime, reverse=True)
        for old in entries[KEEP:]:
            old.unlink(missing_ok=True)
    except OSError:
        return False
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return True


def forget(key: str) -> None:
    path = _path(key)
    if path is not None:
        path.unlink(missing_ok=True)


def _touch(key: str) -> None:
    path = _path(key)
    try:
        if path is not None:
            os.utime(path)
    except OSError:
        pass


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


# ------------------------------------------------------------------------ resolution
async def settings(endpoint_url: str | None, region: str, account_id: str | None) -> AwsSettings:
    """The daemon's AWS settings: the cached ones if the inputs are unchanged (``cache_key``
    set: confirm them with :func:`confirm` once up), else botocore's, now. Raises
    :class:`AwsSettingsError` for a setting rasd cannot honour."""

    def lookup() -> tuple[str | None, AwsSettings | None]:
        key = inputs_key(endpoint_url, region, account_id)
        return key, None if key is None else load(key)

    key, hit = await asyncio.to_thread(lookup)
    early_key, early = _early.pop((endpoint_url, region, account_id), (None, None))
    if early is not None and (hit is not None or early_key != key):
        # an entry written meanwhile (another daemon), or inputs changed since it started
        early.kill()
        await asyncio.to_thread(early.wait)
        early = None
    if hit is not None:
        return hit
    try:
        if early is not None:
            s = await _answer_of(early)
        else:
            s = await botocore_settings(endpoint_url, region, account_id, background=False)
    except ChildFailed as exc:
        log.warning("aws_settings_child_failed", cause=str(exc), fallback="in-process")
        s = await asyncio.to_thread(aws.resolve, endpoint_url, region, account_id)
    if key is not None and key == await asyncio.to_thread(
        inputs_key, endpoint_url, region, account_id
    ):  # the inputs did not change while botocore read them
        await asyncio.to_thread(save, key, s)
    return s


async def confirm(
    cached: AwsSettings, endpoint_url: str | None, region: str, account_id: str | None
) -> AwsSettings | None:
    """botocore's own resolution of settings that came from the cache (in a child process at
    low priority): None when it agrees, else botocore's settings (the entry dropped). Raises
    :class:`AwsSettingsError` when botocore refuses them (the entry dropped too), and
    :class:`Unconfirmed` without a verdict: the child failed, or the inputs changed since the
    start (the daemon runs on what it started with, as always; the change applies at the
    next start)."""
    key = cached.cache_key
    if key is None:
        return None

    async def same_inputs() -> None:
        if await asyncio.to_thread(inputs_key, endpoint_url, region, account_id) != key:
            raise Unconfirmed("the AWS settings' inputs changed since the start")

    await same_inputs()
    try:
        fresh = await botocore_settings(endpoint_url, region, account_id, background=True)
    except AwsSettingsError:
        await same_inputs()
        await asyncio.to_thread(forget, key)
        raise
    await same_inputs()
    if fresh == cached:
        await asyncio.to_thread(_touch, key)
        return None
    await asyncio.to_thread(forget, key)
    return fresh


async def botocore_settings(
    endpoint_url: str | None, region: str, account_id: str | None, *, background: bool
) -> AwsSettings:
    """:func:`aws.resolve` in a child process with the daemon's environment (``background``:
    at low priority). Raises :class:`AwsSettingsError` as it does, :class:`ChildFailed` when
    the child gives no answer."""
    if not sys.executable:
        raise ChildFailed("no Python executable to run")
    try:
        proc = await asyncio.create_subprocess_exec(
            *_child_argv(endpoint_url, region, account_id, background),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except OSError as exc:
        raise ChildFailed(f"cannot start: {exc}") from exc
    try:
        async with asyncio.timeout(CHILD_TIMEOUT):
            out, err = await proc.communicate()
    except TimeoutError:
        raise ChildFailed(f"no answer within {CHILD_TIMEOUT:.0f} s") from None
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    return _parse(out, err, proc.returncode)


def _child_argv(
    endpoint_url: str | None, region: str, account_id: str | None, background: bool
) -> list[str]:
    root = str(Path(__file__).resolve().parents[2])
    args = [endpoint_url or "", region, account_id or "", "1" if background else "0"]
    return [sys.executable, "-P", "-c", _CHILD, root, *args]


def _parse(out: bytes, err: bytes, status: int | None) -> AwsSettings:
    """The child's answer: its settings, or its refusal raised as :class:`AwsSettingsError`."""
    try:
        answer = json.loads(out)
        refused = answer.get("refused")
        got = None if refused is not None else AwsSettings.from_doc(answer["settings"])
    except (ValueError, KeyError, TypeError, AttributeError):
        tail = err.decode(errors="replace").strip()[-500:]
        raise ChildFailed(f"exit status {status}: {tail or 'no output'}") from None
    if got is None:
        raise AwsSettingsError(str(refused))
    return got


def prefetch(endpoint_url: str | None, region: str) -> bool:
    """Start botocore's resolution in a child now, for :func:`settings` to collect, when the
    settings are not cached and the credentials' account id is known without botocore (static
    keys in the environment). Call before anything else is imported: the child runs beside
    the daemon's start-up. True if a child was started."""
    from .sigv4 import env_credentials

    creds = env_credentials()
    if creds is None or not sys.executable:
        return False
    account_id = creds.account_id
    key = inputs_key(endpoint_url, region, account_id)
    if key is not None and load(key) is not None:
        return False
    argv = _child_argv(endpoint_url, region, account_id, background=False)
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    except OSError:
        return False  # settings() starts its own, or resolves in-process
    _early[(endpoint_url, region, account_id)] = (key, proc)
    return True


async def _answer_of(proc: subprocess.Popen[bytes]) -> AwsSettings:
    """The answer of a child :func:`prefetch` started (waited for in a thread)."""

    def wait() -> tuple[bytes, bytes]:
        try:
            return proc.communicate(timeout=CHILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise ChildFailed(f"no answer within {CHILD_TIMEOUT:.0f} s") from None

    out, err = await asyncio.to_thread(wait)
    return _parse(out, err, proc.returncode)
