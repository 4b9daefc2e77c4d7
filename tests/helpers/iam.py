"""The IAM policies of docs/operations.md, and what they allow a DynamoDB call.

``allows`` evaluates only what the page's policies use: Allow and Deny statements, actions
and resources with ``*`` wildcards, and ``ForAllValues:StringEquals`` / ``StringLike`` on
``dynamodb:LeadingKeys`` (moto's server does not evaluate IAM conditions). Any other
condition raises, so a policy the page adopts later cannot pass unevaluated."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
ACCOUNT = "123456789012"
#: the hash key of the table and of each index
HASH = {"": "client_id", "available_resources": "partition", "leased_resources": "key"}


def policies() -> dict[str, dict[str, Any]]:
    """Every ```json block of the page that is an IAM policy, by the heading above it."""
    text = DOC.read_text()
    out: dict[str, dict[str, Any]] = {}
    heading = ""
    for block_text in re.split(r"(?m)^(### .*)$", text):
        if block_text.startswith("### "):
            heading = block_text[4:].strip()
            continue
        for block in re.findall(r"```json\n(.*?)```", block_text, re.S):
            doc = json.loads(block)
            if doc.get("Version") == "2012-10-17":
                out[heading] = doc
    return out


@dataclass(frozen=True)
class Call:
    """One DynamoDB request: its region, operation, index ('' for the table) and the hash
    key value it touches (its ``dynamodb:LeadingKeys``)."""

    region: str
    op: str
    index: str
    leading_key: str

    def arn(self, table: str = "rasd") -> str:
        tail = f"table/{table}" + (f"/index/{self.index}" if self.index else "")
        return f"arn:aws:dynamodb:{self.region}:{ACCOUNT}:{tail}"


def call_of(region: str, op: str, kw: Mapping[str, Any]) -> Call:
    """The :class:`Call` of one GetItem, UpdateItem or Query request's keyword arguments."""
    index = kw.get("IndexName", "")
    if op in ("GetItem", "UpdateItem", "PutItem", "DeleteItem"):
        return Call(region, op, index, kw["Key"]["client_id"]["S"])
    assert op == "Query", op
    m = re.match(r"\s*(#?\w+)\s*=\s*(:\w+)", kw["KeyConditionExpression"])
    assert m is not None, kw["KeyConditionExpression"]
    name = kw.get("ExpressionAttributeNames", {}).get(m[1], m[1])
    assert name == HASH[index], (name, index)  # the first equality is the hash key's
    return Call(region, op, index, kw["ExpressionAttributeValues"][m[2]]["S"])


def _listed(v: str | list[str]) -> list[str]:
    return v if isinstance(v, list) else [v]


def _condition_holds(cond: Mapping[str, Any], call: Call) -> bool:
    for op, tests in cond.items():
        for key, values in tests.items():
            if key != "dynamodb:LeadingKeys":
                raise NotImplementedError(f"condition key {key}")
            if op == "ForAllValues:StringEquals":
                ok = call.leading_key in _listed(values)
            elif op == "ForAllValues:StringLike":
                ok = any(fnmatchcase(call.leading_key, p) for p in _listed(values))
            else:
                raise NotImplementedError(f"condition operator {op}")
            if not ok:
                return False
    return True


def _matches(st: Mapping[str, Any], call: Call) -> bool:
    if not any(fnmatchcase(f"dynamodb:{call.op}", a) for a in _listed(st["Action"])):
        return False
    if not any(fnmatchcase(call.arn(), r) for r in _listed(st["Resource"])):
        return False
    return _condition_holds(st.get("Condition", {}), call)


def allows(policy: Mapping[str, Any], call: Call) -> bool:
    """Does ``policy`` allow ``call``: some Allow statement matches and no Deny does."""
    sts = policy["Statement"]
    if any(st["Effect"] == "Deny" and _matches(st, call) for st in sts):
        return False
    return any(st["Effect"] == "Allow" and _matches(st, call) for st in sts)


def filled(policy: Mapping[str, Any], **names: str) -> dict[str, Any]:
    """The policy with the page's placeholders (``ACCOUNT``, ``REGION``, ``CLIENT``, ...)
    replaced."""
    text = json.dumps(policy).replace("ACCOUNT", ACCOUNT)
    for k, v in sorted(names.items(), key=lambda kv: -len(kv[0])):  # HOME_REGION first
        text = text.replace(k, v)
    out: dict[str, Any] = json.loads(text)
    return out
