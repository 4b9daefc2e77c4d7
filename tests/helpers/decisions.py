"""The pure decisions' test inputs (rasd.core.decide): fixed time, the rules, and a mapping
and a resource item with every field defaulted to a live lease of key ``k`` on ``r1``."""

from __future__ import annotations

from rasd.core import decide
from rasd.core import lease as lease_items

NOW = 1_800_000_000 * lease_items.US
S = lease_items.US
RULES = decide.Rules(
    margin_us=5 * S, grace_us=2 * S, pending_hold_us=2 * S, quarantine_us=57 * S, confirm_us=30 * S
)


def m(
    state: str = lease_items.LIVE,
    exp: int = NOW + 3600 * S,
    region: str = "us-east-1",
    since: int = NOW - 10 * S,
    res: str = "r1",
    ver: int = 3,
    token: str = "tok",
    rver: int = 4,
) -> lease_items.Mapping:
    return lease_items.Mapping("c", "p", "k", region, ver, state, token, res, rver, exp, since)


def r(
    holder: str | None = "tok", key: str | None = "k", version: int = 5
) -> lease_items.ResourceItem:
    return lease_items.ResourceItem(
        "c", "r1", "p", "us-east-1", "x", version, key, NOW + 3600 * S, None, NOW, holder, 3
    )
