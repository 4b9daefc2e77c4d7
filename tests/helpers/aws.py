"""The AWS settings' environment variables the AWS-settings tests clear and set."""

from __future__ import annotations

AWS_VARS = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_DYNAMODB",
    "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
    "AWS_USE_FIPS_ENDPOINT",
    "AWS_USE_DUALSTACK_ENDPOINT",
    "AWS_CA_BUNDLE",
    "AWS_MAX_ATTEMPTS",
    "AWS_RETRY_MODE",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_ACCOUNT_ID_ENDPOINT_MODE",
    "AWS_ACCOUNT_ID",
    "AWS_ENDPOINT_DISCOVERY_ENABLED",
    "AWS_DATA_PATH",
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "NO_PROXY",
    "no_proxy",
    "ALL_PROXY",
    "all_proxy",
)
