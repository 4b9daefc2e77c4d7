"""rasd.dynamo.awscache: a start reuses botocore's AWS settings from an earlier start only while
every input is the same (a changed variable or config file is a miss and resolves anew), a
setting rasd cannot honour still refuses the start, botocore's check in the background catches
an entry that no longer holds, and no secret is written to disk."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rasd.dynamo import aws, awscache
from tests.helpers.aws import AWS_VARS

EP = "http://ddb.local:8000"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No AWS or proxy settings from outside; an empty config file; a cache of the test's own."""
    for var in AWS_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("AWS_DATA_PATH", raising=False)
    monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)
    cfg = tmp_path / "config"
    cfg.write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(cfg))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("CACHE_DIRECTORY", str(tmp_path / "cache"))
    return cfg


@pytest.fixture(autouse=True)
def no_early_children() -> Iterator[None]:
    yield
    for _, proc in awscache._early.values():
        proc.kill()
        proc.wait()
    awscache._early.clear()


@pytest.fixture
def botocore_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """botocore's resolution in-process instead of in a child (quicker; the child itself is
    tested below): the calls made."""
    calls: list[tuple[Any, ...]] = []

    async def in_process(
        endpoint_url: str | None, region: str, account_id: str | None, *, background: bool
    ) -> aws.AwsSettings:
        calls.append((endpoint_url, region, account_id, background))
        return await asyncio.to_thread(aws.resolve, endpoint_url, region, account_id)

    monkeypatch.setattr(awscache, "botocore_settings", in_process)
    return calls


def entries(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache").glob("aws-*.json"))


async def test_a_second_start_uses_the_first_starts_settings(
    tmp_path: Path, botocore_calls: list[tuple[Any, ...]]
) -> None:
    first = await awscache.settings(None, "eu-west-1", None)
    assert first.cache_key is None and first.public()["origin"] == "botocore"
    assert len(botocore_calls) == 1 and len(entries(tmp_path)) == 1
    second = await awscache.settings(None, "eu-west-1", None)
    assert len(botocore_calls) == 1  # botocore not asked
    assert second == first == aws.resolve(None, "eu-west-1")
    assert second.cache_key is not None and second.public()["origin"] == "cache"
    # other arguments are other inputs
    assert (await awscache.settings(EP, "eu-west-1", None)).endpoint_url == EP
    acct = await awscache.settings(None, "eu-west-1", "123456789012")
    assert acct.endpoint_url == "https://123456789012.ddb.eu-west-1.amazonaws.com"
    assert len(botocore_calls) == 3 and len(entries(tmp_path)) == 3


@pytest.mark.parametrize(
    ("var", "value", "field", "expected"),
    [
        ("AWS_USE_FIPS_ENDPOINT", "true", "endpoint_url", "https://dynamodb-fips.us-west-2.amazonaws.com"),
        ("AWS_USE_DUALSTACK_ENDPOINT", "true", "endpoint_url", "https://dynamodb.us-west-2.api.aws"),
        ("AWS_ENDPOINT_URL_DYNAMODB", "http://ddb:1", "endpoint_url", "http://ddb:1"),
        ("AWS_MAX_ATTEMPTS", "6", "max_attempts", 6),
        ("HTTPS_PROXY", "http://proxy.example:3128", "proxy_url", "http://proxy.example:3128"),
        ("https_proxy", "http://proxy.example:3128", "proxy_url", "http://proxy.example:3128"),
    ],
)  # fmt: skip
async def test_a_changed_variable_is_a_miss(
    monkeypatch: pytest.MonkeyPatch,
    botocore_calls: list[tuple[Any, ...]],
    var: str,
    value: str,
    field: str,
    expected: Any,
) -> None:
    before = await awscache.settings(None, "us-west-2", None)
    assert (await awscache.settings(None, "us-west-2", None)).cache_key is not None
    monkeypatch.setenv(var, value)
    after = await awscache.settings(None, "us-west-2", None)
    assert after.cache_key is None, "a changed input must be resolved anew"
    assert getattr(after, field) == expected != getattr(before, field)
    assert after == aws.resolve(None, "us-west-2")
    # and back: the first entry is still there
    monkeypatch.delenv(var)
    assert await awscache.settings(None, "us-west-2", None) == before
    assert len(botocore_calls) == 2


async def test_no_proxy_is_an_input(
    monkeypatch: pytest.MonkeyPatch, botocore_calls: list[tuple[Any, ...]]
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert (await awscache.settings(None, "us-east-1", None)).proxy_url
    monkeypatch.setenv("NO_PROXY", ".amazonaws.com")
    assert (await awscache.settings(None, "us-east-1", None)).proxy_url is None


async def test_a_changed_config_file_is_a_miss_whatever_its_mtime(
    monkeypatch: pytest.MonkeyPatch, clean_env: Path, botocore_calls: list[tuple[Any, ...]]
) -> None:
    """The digest covers the file's content: an edit that keeps its size and mtime (within
    the file system's timestamp granularity) still counts."""
    clean_env.write_text("[default]\nmax_attempts = 4\n")
    st = clean_env.stat()
    assert (await awscache.settings(None, "us-east-1", None)).max_attempts == 4
    assert (await awscache.settings(None, "us-east-1", None)).cache_key is not None
    clean_env.write_text("[default]\nmax_attempts = 5\n")
    os.utime(clean_env, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (await awscache.settings(None, "us-east-1", None)).max_attempts == 5
    # the profile's endpoint, in the credentials file botocore merges into the profiles
    creds = Path(os.environ["AWS_SHARED_CREDENTIALS_FILE"])
    creds.write_text("[default]\nendpoint_url = http://from-credentials-file:1\n")
    got = await awscache.settings(None, "us-east-1", None)
    assert got.endpoint_url == aws.resolve(None, "us-east-1").endpoint_url
    assert got.cache_key is None
    # another profile: another input
    clean_env.write_text("[default]\nmax_attempts = 5\n[profile other]\nmax_attempts = 7\n")
    monkeypatch.setenv("AWS_PROFILE", "other")
    assert (await awscache.settings(None, "us-east-1", None)).max_attempts == 7


async def test_rotating_credentials_keep_the_entry(
    monkeypatch: pytest.MonkeyPatch, botocore_calls: list[tuple[Any, ...]]
) -> None:
    """Credentials are not inputs of the settings (botocore resolves them with placeholders)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ASIA1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s1")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "t1")
    await awscache.settings(None, "us-east-1", None)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ASIA2")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s2")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "t2")
    assert (await awscache.settings(None, "us-east-1", None)).cache_key is not None
    assert len(botocore_calls) == 1


@pytest.mark.parametrize(
    ("env", "config", "match"),
    [
        ({"HTTPS_PROXY": "socks5://proxy.example:1080"}, "", "SOCKS"),
        ({"AWS_RETRY_MODE": "adaptive"}, "", "retry_mode 'adaptive'"),
        ({}, "[default]\nretry_mode = legacy\n", "retry_mode 'legacy'"),
        ({"AWS_ENDPOINT_DISCOVERY_ENABLED": "true"}, "", "endpoint_discovery_enabled"),
    ],
    ids=["socks", "adaptive", "legacy-in-profile", "endpoint-discovery"],
)
async def test_a_setting_rasd_cannot_honour_still_refuses(
    monkeypatch: pytest.MonkeyPatch,
    clean_env: Path,
    tmp_path: Path,
    botocore_calls: list[tuple[Any, ...]],
    env: dict[str, str],
    config: str,
    match: str,
) -> None:
    """An entry for the good settings does not hide a refused one, and a refusal is never
    written: each start asks botocore again, and refuses again."""
    await awscache.settings(None, "us-east-1", None)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    clean_env.write_text(config)
    for _ in range(2):
        with pytest.raises(aws.AwsSettingsError, match=match):
            await awscache.settings(None, "us-east-1", None)
    assert len(botocore_calls) == 3 and len(entries(tmp_path)) == 1


async def test_confirm_agrees_or_drops_the_entry(
    tmp_path: Path, botocore_calls: list[tuple[Any, ...]]
) -> None:
    """botocore's check after a hit: None when it agrees (in the background); botocore's
    settings, and the entry dropped, when an entry says otherwise (an input that escaped the
    digest: here, an entry written by hand)."""
    await awscache.settings(None, "us-east-1", None)
    hit = await awscache.settings(None, "us-east-1", None)
    assert await awscache.confirm(hit, None, "us-east-1", None) is None
    assert botocore_calls[-1][3] is True  # at low priority
    assert len(entries(tmp_path)) == 1
    key = hit.cache_key
    assert key is not None
    stale = aws.AwsSettings(region="us-east-1", endpoint_url="https://elsewhere.example")
    assert awscache.save(key, stale)
    planted = await awscache.settings(None, "us-east-1", None)
    assert planted.endpoint_url == "https://elsewhere.example"
    fresh = await awscache.confirm(planted, None, "us-east-1", None)
    assert fresh is not None and fresh.endpoint_url == "https://dynamodb.us-east-1.amazonaws.com"
    assert entries(tmp_path) == []
    # botocore's settings, not the cache's, are not confirmed again
    assert await awscache.confirm(fresh, None, "us-east-1", None) is None


async def test_confirm_refusal_drops_the_entry(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, botocore_calls: list[tuple[Any, ...]]
) -> None:
    """An entry under the digest of inputs botocore refuses (written by hand: a refusal is
    never cached) is used, and botocore's check refuses it."""
    monkeypatch.setenv("AWS_RETRY_MODE", "legacy")
    key = awscache.inputs_key(None, "us-east-1", None)
    assert key is not None
    awscache.save(key, aws.AwsSettings(region="us-east-1", endpoint_url=EP))
    planted = await awscache.settings(None, "us-east-1", None)
    assert planted.cache_key == key and botocore_calls == []
    with pytest.raises(aws.AwsSettingsError, match="retry_mode 'legacy'"):
        await awscache.confirm(planted, None, "us-east-1", None)
    assert entries(tmp_path) == []


async def test_no_verdict_when_the_inputs_changed_since_the_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, botocore_calls: list[tuple[Any, ...]]
) -> None:
    await awscache.settings(None, "us-east-1", None)
    hit = await awscache.settings(None, "us-east-1", None)
    monkeypatch.setenv("AWS_USE_FIPS_ENDPOINT", "true")  # after the start: for the next one
    with pytest.raises(awscache.Unconfirmed, match="changed since the start"):
        await awscache.confirm(hit, None, "us-east-1", None)
    assert len(botocore_calls) == 1
    assert len(entries(tmp_path)) == 1


async def test_a_proxy_password_is_never_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, botocore_calls: list[tuple[Any, ...]]
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://user:s3cret@proxy.example:3128")
    got = await awscache.settings(None, "us-east-1", None)
    assert got.proxy_headers and got.cache_key is None
    assert entries(tmp_path) == []
    assert (await awscache.settings(None, "us-east-1", None)).cache_key is None
    assert len(botocore_calls) == 2


async def test_what_is_written(tmp_path: Path, botocore_calls: list[tuple[Any, ...]]) -> None:
    """The settings and the digest only, readable by the daemon's user only."""
    await awscache.settings(EP, "us-east-1", None)
    (path,) = entries(tmp_path)
    assert path.stat().st_mode & 0o077 == 0
    assert (tmp_path / "cache").stat().st_mode & 0o077 == 0
    doc = json.loads(path.read_text())
    assert set(doc) == {"key", "settings"}
    assert aws.AwsSettings.from_doc(doc["settings"]) == aws.resolve(EP, "us-east-1")


async def test_an_entry_others_may_write_is_not_read(
    tmp_path: Path, botocore_calls: list[tuple[Any, ...]]
) -> None:
    await awscache.settings(EP, "us-east-1", None)
    (path,) = entries(tmp_path)
    path.chmod(0o666)
    assert (await awscache.settings(EP, "us-east-1", None)).cache_key is None
    assert path.stat().st_mode & 0o077 == 0  # written anew by the miss
    path.write_text("{not json")
    assert (await awscache.settings(EP, "us-east-1", None)).cache_key is None
    assert (await awscache.settings(EP, "us-east-1", None)).cache_key is not None
    assert len(botocore_calls) == 3


async def test_a_ca_bundle_that_moved_is_a_miss(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, botocore_calls: list[tuple[Any, ...]]
) -> None:
    import certifi

    bundle = tmp_path / "ca.pem"
    bundle.write_bytes(Path(certifi.where()).read_bytes())
    monkeypatch.setenv("AWS_CA_BUNDLE", str(bundle))
    assert (await awscache.settings(None, "us-east-1", None)).ca_bundle == str(bundle)
    bundle.unlink()
    with pytest.raises(aws.AwsSettingsError, match=r"ca\.pem"):
        await awscache.settings(None, "us-east-1", None)  # botocore's verdict, not the cache's
    assert len(botocore_calls) == 2


def test_botocore_data_of_ones_own_is_not_cached(
    monkeypatch: pytest.MonkeyPatch, clean_env: Path, tmp_path: Path
) -> None:
    assert awscache.inputs_key(None, "us-east-1", None) is not None
    monkeypatch.setenv("AWS_DATA_PATH", str(tmp_path))
    assert awscache.inputs_key(None, "us-east-1", None) is None
    monkeypatch.delenv("AWS_DATA_PATH")
    clean_env.write_text(f"[default]\ndata_path = {tmp_path}\n")
    assert awscache.inputs_key(None, "us-east-1", None) is None
    clean_env.write_text("")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert awscache.inputs_key(None, "us-east-1", None) is not None
    (tmp_path / ".aws" / "models").mkdir(parents=True)
    assert awscache.inputs_key(None, "us-east-1", None) is None


def test_the_cache_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CACHE_DIRECTORY", "/var/cache/rasd:/var/cache/other")
    assert awscache.cache_dir() == Path("/var/cache/rasd")  # systemd's CacheDirectory=
    monkeypatch.delenv("CACHE_DIRECTORY")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert awscache.cache_dir() == tmp_path / "rasd"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert awscache.cache_dir() == tmp_path / ".cache" / "rasd"


async def test_old_entries_are_dropped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, botocore_calls: list[tuple[Any, ...]]
) -> None:
    for n in range(awscache.KEEP + 3):
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", str(n + 1))
        await awscache.settings(EP, "us-east-1", None)
    assert len(entries(tmp_path)) == awscache.KEEP


# ------------------------------------------------------------------------- the child
async def test_the_child_resolves_as_botocore_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """In a process of its own, with the daemon's environment; its refusals are the same."""
    monkeypatch.setenv("AWS_USE_FIPS_ENDPOINT", "true")
    monkeypatch.setenv("HTTPS_PROXY", "http://u:p@proxy.example:3128")
    got = await awscache.botocore_settings(None, "us-west-2", None, background=False)
    assert got == aws.resolve(None, "us-west-2")
    assert got.proxy_headers  # over the pipe, never to disk
    monkeypatch.setenv("AWS_RETRY_MODE", "adaptive")
    with pytest.raises(aws.AwsSettingsError, match="retry_mode 'adaptive'") as err:
        await awscache.botocore_settings(None, "us-west-2", None, background=True)
    with pytest.raises(aws.AwsSettingsError) as same:
        aws.resolve(None, "us-west-2")
    assert str(err.value) == str(same.value)


async def test_a_child_that_cannot_run_falls_back_to_botocore_in_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    got = await awscache.settings(EP, "us-east-1", None)
    assert got == aws.resolve(EP, "us-east-1") and got.cache_key is None
    assert len(entries(tmp_path)) == 1
    with pytest.raises(awscache.ChildFailed):
        await awscache.confirm(
            await awscache.settings(EP, "us-east-1", None), EP, "us-east-1", None
        )


def test_the_daemons_process_loads_no_botocore_session(tmp_path: Path) -> None:
    """A start that finds its entry asks botocore nothing before it serves; one that does not
    asks it in the child: the daemon's own process never loads botocore's session, client
    or endpoint machinery (about 22 MB)."""
    code = (
        "import asyncio, sys; from rasd.dynamo import awscache; "
        "s = asyncio.run(awscache.settings(None, 'us-east-1', None)); "
        "print(s.cache_key is not None, sorted(m for m in sys.modules "
        "if m in ('botocore.session', 'botocore.client', 'botocore.regions')))"
    )

    def run() -> str:
        return subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()

    assert run() == "False []"
    assert run() == "True []"


def test_the_child_runs_where_it_may_not_lower_its_priority(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under the unit's SystemCallFilter=~@resources, nice() fails with EPERM: the child
    resolves all the same, at the daemon's priority."""

    def refused(_: int) -> int:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "nice", refused)
    aws.child([EP, "us-east-1", "", "1"])
    got = aws.AwsSettings.from_doc(json.loads(capsys.readouterr().out)["settings"])
    assert got == aws.resolve(EP, "us-east-1")


# ------------------------------------------------------------- the child started early
async def test_rasd_serve_starts_botocore_before_its_imports(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """prefetch() (the top of `rasd serve`) starts the child on a miss when the credentials
    are static keys in the environment; settings() then collects its answer rather than
    starting one."""

    async def not_again(*_: Any, **__: Any) -> aws.AwsSettings:
        raise AssertionError("a second child")

    monkeypatch.setattr(awscache, "botocore_settings", not_again)
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    assert not awscache.prefetch(EP, "us-east-1")  # no credentials known without botocore
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "b")
    monkeypatch.setenv("AWS_ACCOUNT_ID", "123456789012")
    assert awscache.prefetch(None, "us-east-1")
    got = await awscache.settings(None, "us-east-1", "123456789012")
    assert got == aws.resolve(None, "us-east-1", "123456789012") and got.cache_key is None
    assert got.endpoint_url == "https://123456789012.ddb.us-east-1.amazonaws.com"
    assert len(entries(tmp_path)) == 1
    assert not awscache.prefetch(None, "us-east-1")  # a hit: nothing to start
    assert awscache._early == {}


async def test_an_early_child_for_other_inputs_is_not_used(
    monkeypatch: pytest.MonkeyPatch, botocore_calls: list[tuple[Any, ...]]
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "b")
    assert awscache.prefetch(EP, "us-east-1")
    ((_, proc),) = awscache._early.values()
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "7")  # after the child started
    assert (await awscache.settings(EP, "us-east-1", None)).max_attempts == 7
    assert len(botocore_calls) == 1 and proc.poll() is not None and awscache._early == {}
