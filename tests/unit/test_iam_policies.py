"""The IAM policies in docs/operations.md: valid, least-privilege by parliament's checks, and
the daemon's policy grants exactly the DynamoDB operations its store makes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from rasd.dynamo.store import OPERATIONS

parliament = pytest.importorskip("parliament", reason="parliament is in the [dev] extra")

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def policies() -> dict[str, dict[str, Any]]:
    """Every ```json block of the page that is an IAM policy, by the heading above it."""
    text = DOC.read_text()
    out: dict[str, dict[str, Any]] = {}
    heading = ""
    for line_block in re.split(r"(?m)^(### .*)$", text):
        if line_block.startswith("### "):
            heading = line_block[4:].strip()
            continue
        for block in re.findall(r"```json\n(.*?)```", line_block, re.S):
            doc = json.loads(block)
            if doc.get("Version") == "2012-10-17":
                out[heading] = doc
    return out


def test_the_page_has_the_policies() -> None:
    assert {"Daemon (`rasd serve`)", "ras-liberator", "ras-dedupe"} <= set(policies())


@pytest.mark.parametrize("name", sorted(policies()))
def test_parliament_finds_nothing(name: str) -> None:
    # the page writes ACCOUNT where the operator's account id goes
    text = json.dumps(policies()[name]).replace("ACCOUNT", "123456789012")
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
