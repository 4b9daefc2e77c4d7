"""The IAM policies in docs/operations.md: valid, least-privilege by parliament's checks, and
the daemon's policy grants exactly the DynamoDB operations its store makes."""

from __future__ import annotations

import json

import pytest

from rasd.dynamo.store import OPERATIONS
from tests.helpers.iam import filled, policies

parliament = pytest.importorskip("parliament", reason="parliament is in the [dev] extra")


def test_the_page_has_the_policies() -> None:
    assert {"Daemon (`rasd serve`)", "ras-liberator", "ras-dedupe"} <= set(policies())


@pytest.mark.parametrize("name", sorted(policies()))
def test_parliament_finds_nothing(name: str) -> None:
    # the page writes ACCOUNT, REGION, ... where the operator's values go
    policy = filled(policies()[name], REGION="us-east-1", HOME_REGION="eu-west-1", CLIENT="demo")
    text = json.dumps(policy)
    analyzed = parliament.analyze_policy_string(text)
    findings = [f"{f.issue}: {f.detail}" for f in analyzed.findings]
    assert findings == [], findings


def test_the_daemon_policy_grants_exactly_what_the_store_calls() -> None:
    """A new operation in rasd/dynamo/store.py without the policy would fail in production with
    AccessDenied; a stale one in the policy is privilege the daemon does not need."""
    granted = {
        a.removeprefix("dynamodb:")
        for st in policies()["Daemon (`rasd serve`)"]["Statement"]
        for a in (st["Action"] if isinstance(st["Action"], list) else [st["Action"]])
    }
    assert granted == set(OPERATIONS)
