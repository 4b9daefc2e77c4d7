"""rasd.dynamo.aws: the endpoint, proxy, CA bundle and retry settings are botocore's own decisions
(compared with ``boto3.client('dynamodb', ...)`` under the same environment), and a setting
rasd cannot honour stops it with a clear error instead of being ignored."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import boto3
import pytest

from rasd import cli
from rasd.dynamo import aws
from tests.helpers.aws import AWS_VARS

pytestmark = pytest.mark.usefixtures("one_botocore_loader")

#: Every variable that changes what botocore resolves; each test starts without them.


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for var in AWS_VARS:
        monkeypatch.delenv(var, raising=False)
    cfg = tmp_path / "config"
    cfg.write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(cfg))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    return cfg


def _boto_url(region: str) -> str:
    url: str = boto3.session.Session().client("dynamodb", region_name=region).meta.endpoint_url
    return url


def _boto_sends_to(region: str, account_id: str | None = None) -> str:
    """Where boto3 sends a GetItem (its before-send hook answers instead of the network):
    per-request endpoint rules included, which ``meta.endpoint_url`` does not show."""
    from botocore.awsrequest import AWSResponse

    client = boto3.session.Session().client(
        "dynamodb",
        region_name=region,
        aws_access_key_id="k",
        aws_secret_access_key="s",
        aws_account_id=account_id,
    )
    sent: list[str] = []

    class Body:
        def stream(self, **_: Any) -> Any:
            yield b"{}"

    def answer(request: Any, **_: Any) -> AWSResponse:
        sent.append(request.url)
        return AWSResponse(request.url, 200, {}, Body())  # type: ignore[arg-type]

    client.meta.events.register("before-send.dynamodb", answer)
    client.get_item(TableName="t", Key={"k": {"S": "v"}})
    return sent[0].rstrip("/")


REGIONS = [
    "us-east-1",
    "us-gov-west-1",
    "cn-north-1",
    "us-iso-east-1",
    "us-isob-east-1",
    "eu-isoe-west-1",
    "us-isof-south-1",
]
FLAGS: list[dict[str, str]] = [
    {},
    {"AWS_USE_FIPS_ENDPOINT": "true"},
    {"AWS_USE_DUALSTACK_ENDPOINT": "true"},
    {"AWS_USE_FIPS_ENDPOINT": "true", "AWS_USE_DUALSTACK_ENDPOINT": "true"},
]


@pytest.mark.parametrize("flags", FLAGS, ids=["default", "fips", "dualstack", "fips+dualstack"])
@pytest.mark.parametrize("region", REGIONS)
def test_endpoint_is_botocores(
    monkeypatch: pytest.MonkeyPatch, region: str, flags: dict[str, str]
) -> None:
    """FIPS, dual-stack and every partition (China, GovCloud, ISO) resolve as botocore does:
    rasd connects where boto3 sends its requests (in GovCloud with FIPS, and in ISO regions
    with dual-stack, that is not ``meta.endpoint_url``)."""
    for k, v in flags.items():
        monkeypatch.setenv(k, v)
    try:
        expected = _boto_sends_to(region)
    except Exception as exc:  # noqa: BLE001 - a combination botocore refuses
        with pytest.raises(aws.AwsSettingsError):
            aws.resolve(None, region)
        print(f"{region} {flags}: botocore refuses: {exc}")
        return
    got = aws.resolve(None, region)
    assert got.endpoint_url == expected
    assert got.tls
    meta = _boto_url(region)
    if expected != meta:
        print(f"{region} {flags}: sent to {expected}, meta.endpoint_url {meta}")


@pytest.mark.parametrize("region", ["us-east-1", "eu-west-1", "cn-north-1", "us-gov-west-1"])
def test_account_based_endpoint_as_botocore_sends(
    monkeypatch: pytest.MonkeyPatch, clean_env: Path, region: str
) -> None:
    """Credentials that carry an account id (AWS_ACCOUNT_ID, a credential_process's
    AccountId, SSO) make botocore send to the account's endpoint; so does rasd, and
    account_id_endpoint_mode = disabled turns it off for both."""
    acct = "123456789012"
    got = aws.resolve(None, region, acct)
    assert got.endpoint_url == _boto_sends_to(region, acct)
    print(region, got.endpoint_url, got.sources["endpoint_url"])
    clean_env.write_text("[default]\naccount_id_endpoint_mode = disabled\n")
    assert aws.resolve(None, region, acct).endpoint_url == _boto_sends_to(region, acct)
    assert acct not in aws.resolve(None, region, acct).endpoint_url
    clean_env.write_text("[default]\naccount_id_endpoint_mode = required\n")
    with pytest.raises(aws.AwsSettingsError, match="no account id"):
        aws.resolve(None, region)


async def test_the_daemons_credentials_choose_the_account_endpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rasd.dynamo import ddb, sigv4

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AK")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "SK")
    monkeypatch.setenv("AWS_ACCOUNT_ID", "123456789012")
    monkeypatch.delenv("AWS_CREDENTIAL_EXPIRATION", raising=False)
    assert sigv4.resolve_credentials().account_id == "123456789012"
    client = await ddb.LeanDynamoDB.create(None, "us-east-1")
    await client.close()
    assert client.endpoint_url == "https://123456789012.ddb.us-east-1.amazonaws.com"
    assert client.endpoint_url == _boto_sends_to("us-east-1", "123456789012")


def test_fips_and_dualstack_from_the_profile(
    monkeypatch: pytest.MonkeyPatch, clean_env: Path
) -> None:
    clean_env.write_text("[default]\nuse_fips_endpoint = true\nuse_dualstack_endpoint = true\n")
    assert aws.resolve(None, "us-west-2").endpoint_url == _boto_url("us-west-2")
    assert aws.resolve(None, "us-west-2").endpoint_url == "https://dynamodb-fips.us-west-2.api.aws"


def test_endpoint_urls_in_botocores_order(monkeypatch: pytest.MonkeyPatch, clean_env: Path) -> None:
    """rasd's endpoint_url, AWS_ENDPOINT_URL_DYNAMODB, AWS_ENDPOINT_URL, the profile's
    services section and endpoint_url, AWS_IGNORE_CONFIGURED_ENDPOINT_URLS."""
    clean_env.write_text(
        "[default]\nendpoint_url = http://profile:1\nservices = local\n"
        "[services local]\ndynamodb =\n  endpoint_url = http://services:1\n"
    )
    assert aws.resolve(None, "eu-west-1").endpoint_url == _boto_url("eu-west-1")
    assert _boto_url("eu-west-1") == "http://services:1"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://all:1")
    assert aws.resolve(None, "eu-west-1").endpoint_url == _boto_url("eu-west-1") == "http://all:1"
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", "http://ddb:1")
    got = aws.resolve(None, "eu-west-1")
    assert got.endpoint_url == _boto_url("eu-west-1") == "http://ddb:1"
    assert got.sources["endpoint_url"] == "AWS_ENDPOINT_URL_DYNAMODB"
    assert got.ca_bundle is None  # plain HTTP: nothing to verify
    assert aws.resolve("http://x:1", "eu-west-1").endpoint_url == "http://x:1"
    monkeypatch.setenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true")
    got = aws.resolve(None, "eu-west-1")
    assert got.endpoint_url == _boto_url("eu-west-1") == "https://dynamodb.eu-west-1.amazonaws.com"


def test_ca_bundle_from_env_or_profile(
    monkeypatch: pytest.MonkeyPatch, clean_env: Path, tmp_path: Path
) -> None:
    import certifi

    default = aws.resolve(None, "us-east-1")
    assert default.ca_bundle == certifi.where()
    clean_env.write_text(f"[default]\nca_bundle = {certifi.where()}\n")
    got = aws.resolve(None, "us-east-1")
    assert got.ca_bundle == certifi.where() and got.sources["ca_bundle"] == "profile ca_bundle"
    missing = tmp_path / "nope.pem"
    monkeypatch.setenv("AWS_CA_BUNDLE", str(missing))
    with pytest.raises(aws.AwsSettingsError, match=r"nope\.pem"):
        aws.resolve(None, "us-east-1")


def test_proxies_as_botocore_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from botocore.utils import get_environ_proxies

    monkeypatch.setenv("HTTPS_PROXY", "http://user:p%40ss@proxy.example:3128")
    got = aws.resolve(None, "us-east-1")
    assert get_environ_proxies(got.endpoint_url)["https"].startswith("http://user")
    assert got.proxy_url == "http://proxy.example:3128"
    assert got.proxy_headers == (("Proxy-Authorization", "Basic dXNlcjpwQHNz"),)  # user:p@ss
    assert "p%40ss" not in json.dumps(got.public())
    monkeypatch.setenv("HTTPS_PROXY", "proxy.example:8080")  # no scheme: http, as botocore
    assert aws.resolve(None, "us-east-1").proxy_url == "http://proxy.example:8080"
    monkeypatch.setenv("NO_PROXY", ".amazonaws.com")
    assert get_environ_proxies("https://dynamodb.us-east-1.amazonaws.com") == {}
    assert aws.resolve(None, "us-east-1").proxy_url is None
    # an http endpoint uses HTTP_PROXY, not HTTPS_PROXY
    monkeypatch.delenv("NO_PROXY")
    assert aws.resolve("http://ddb.local:8000", "us-east-1").proxy_url is None
    monkeypatch.setenv("HTTP_PROXY", "http://fwd.example:3128")
    assert aws.resolve("http://ddb.local:8000", "us-east-1").proxy_url == "http://fwd.example:3128"


@pytest.mark.parametrize(
    ("env", "config", "match"),
    [
        ({"HTTPS_PROXY": "socks5://proxy.example:1080"}, "", "SOCKS"),
        ({"AWS_RETRY_MODE": "legacy"}, "", "retry_mode 'legacy'"),
        ({}, "[default]\nretry_mode = adaptive\n", "retry_mode 'adaptive'"),
        ({"AWS_ACCOUNT_ID_ENDPOINT_MODE": "required"}, "", "account_id_endpoint_mode"),
        ({"AWS_ENDPOINT_DISCOVERY_ENABLED": "true"}, "", "endpoint_discovery_enabled"),
        (
            {"HTTPS_PROXY": "http://proxy.example:3128"},
            "[default]\nproxies_config =\n  proxy_client_cert = /c.pem\n",
            "proxy_client_cert",
        ),
        (
            {"HTTPS_PROXY": "http://proxy.example:3128"},
            "[default]\nproxies_config =\n  proxy_use_forwarding_for_https = true\n",
            "proxy_use_forwarding_for_https",
        ),
    ],
    ids=[
        "socks",
        "legacy",
        "adaptive",
        "account-id-required",
        "endpoint-discovery",
        "proxy-cert",
        "forwarding",
    ],
)
def test_what_rasd_cannot_honour_stops_it(
    monkeypatch: pytest.MonkeyPatch,
    clean_env: Path,
    capsys: pytest.CaptureFixture[str],
    env: dict[str, str],
    config: str,
    match: str,
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    clean_env.write_text(config)
    with pytest.raises(aws.AwsSettingsError, match=match):
        aws.resolve(None, "us-east-1")
    assert cli.main(["check-config", "--env-file", "/dev/null"]) == 2
    assert match in capsys.readouterr().err


def test_max_attempts_from_env_or_profile(monkeypatch: pytest.MonkeyPatch, clean_env: Path) -> None:
    assert aws.resolve(None, "us-east-1").max_attempts == 3
    clean_env.write_text("[default]\nmax_attempts = 7\nretry_mode = standard\n")
    assert aws.resolve(None, "us-east-1").max_attempts == 7
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "5")
    assert aws.resolve(None, "us-east-1").max_attempts == 5


def test_check_config_prints_the_aws_settings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import certifi

    monkeypatch.setenv("AWS_USE_FIPS_ENDPOINT", "true")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("RASD_ACL_OPEN", "true")
    monkeypatch.setenv("AWS_CA_BUNDLE", certifi.where())
    monkeypatch.delenv("RASD_ENDPOINT_URL", raising=False)
    assert cli.main(["check-config", "--env-file", "/dev/null", "--region", "us-west-2"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    a = out["aws"]
    assert a["endpoint_url"] == "https://dynamodb-fips.us-west-2.amazonaws.com"
    assert a["proxy"] == "http://proxy.example:3128"
    assert a["ca_bundle"] == certifi.where()
    assert a["sources"]["ca_bundle"] == "AWS_CA_BUNDLE"
    assert a["max_attempts"] == 3 and a["retry_mode"] == "standard"


def test_check_config_reads_aws_settings_from_the_env_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """/etc/default/rasd (the unit's EnvironmentFile=) is where operators put AWS_* and proxy
    variables: check-config resolves with them, as the service will."""
    env_file = tmp_path / "rasd.env"
    env_file.write_text(
        "HTTPS_PROXY=http://proxy.example:3128\nAWS_MAX_ATTEMPTS=4\nRASD_ACL_OPEN=true\n"
    )
    assert cli.main(["check-config", "--env-file", str(env_file)]) == 0
    a = json.loads(capsys.readouterr().out)["aws"]
    assert a["proxy"] == "http://proxy.example:3128" and a["max_attempts"] == 4
    assert "HTTPS_PROXY" not in os.environ  # the shell's environment is kept
