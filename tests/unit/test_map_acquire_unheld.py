"""``map_acquire_unheld`` (rollout mode's speculative mapping write) applies exactly where
``decide.on_read`` would decide Acquire from the mapping alone: so it is the write an acquirer
that read the mapping at that instant would have made at the version read."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rasd.core import decide, serialize
from rasd.core import lease as lease_items
from rasd.core import writes as item_writes
from rasd.core.map_builders import map_acquire_unheld

US = lease_items.US
NOW = 1_800_000_000 * US
IDENT = ("#map#c#p#k", "us-east-1")
RULES = decide.Rules(
    margin_us=2 * US,
    grace_us=5 * US,
    pending_hold_us=3 * US,
    quarantine_us=40 * US,
    confirm_us=30 * US,
)
offsets = st.integers(-20 * US, 20 * US)


@st.composite
def mapping_items(draw: Any, exp_when_free: bool = False) -> dict[str, item_writes.Value] | None:
    """A mapping item as the protocol's writes leave it (``exp_when_free``: a free one may
    carry an end too, which none of them leaves)."""
    state = draw(st.sampled_from([None, lease_items.FREE, lease_items.PENDING, lease_items.LIVE]))
    if state is None:
        return None
    item: dict[str, item_writes.Value] = {
        "client_id": IDENT[0],
        "resource": IDENT[1],
        "state": state,
        "ver": draw(st.integers(1, 9)),
    }
    if state != lease_items.FREE or (exp_when_free and draw(st.booleans())):
        item.update(
            token="tok",
            res="r1",
            rver=3,
            exp=lease_items.fmt_time(NOW + draw(offsets)),
            since=lease_items.fmt_time(NOW - 60 * US),
            owner="h",
        )
    return item


def _write() -> item_writes.Write:
    return map_acquire_unheld(IDENT, NOW - RULES.grace_us, "t2", "r2", 4, NOW + 60 * US, NOW, "h2")


def _acquires(item: dict[str, item_writes.Value] | None) -> bool:
    own = None if item is None else serialize.mapping_from(item)
    return isinstance(decide.on_read(own, [], NOW, RULES), decide.Acquire)


@pytest.mark.property
@settings(max_examples=300)
@given(mapping_items())
def test_it_applies_exactly_where_a_reader_would_acquire(
    item: dict[str, item_writes.Value] | None,
) -> None:
    after = item_writes.apply(item, _write())
    assert (after is not None) == _acquires(item), item
    if after is not None:
        before = 0 if item is None else int(item["ver"])
        m = serialize.mapping_from(after)
        # what map_acquire at the version read would have written
        assert (m.state, m.ver, m.token, m.resource) == (
            lease_items.PENDING,
            before + 1,
            "t2",
            "r2",
        )


@pytest.mark.property
@settings(max_examples=300)
@given(mapping_items(exp_when_free=True))
def test_it_never_applies_where_a_reader_would_not_acquire(
    item: dict[str, item_writes.Value] | None,
) -> None:
    if item_writes.apply(item, _write()) is not None:
        assert _acquires(item), item


@pytest.mark.parametrize(
    ("end", "applies"),
    [(NOW - RULES.grace_us, True), (NOW - RULES.grace_us + 1, False), (NOW - 1, False)],
    ids=["ended-the-grace-ago", "a-microsecond-less", "just-ended"],
)
def test_a_live_lease_is_taken_over_only_past_its_end_plus_the_grace(
    end: int, applies: bool
) -> None:
    live = {
        "client_id": IDENT[0], "resource": IDENT[1], "state": lease_items.LIVE, "ver": 4,
        "token": "tok", "res": "r1", "exp": lease_items.fmt_time(end),
    }  # fmt: skip
    assert (item_writes.apply(live, _write()) is not None) is applies
