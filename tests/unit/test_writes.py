"""rasd.core.writes.render: its per-shape template cache gives exactly what rendering from scratch
(``render_plain``) gives, whatever the values and however shapes repeat."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rasd.core import builders, map_builders
from rasd.core import lease as lease_items
from rasd.core import writes as item_writes

ATTRS = ["holder", "version", "lease_expires", "state", "token", "#odd name"]
OPS: list[item_writes.Op] = [
    "=", "<>", "<", "<=", ">", ">=", "exists", "not_exists", "absent_or_ne", "absent_or_le"
]  # fmt: skip
values = st.one_of(st.text(max_size=8), st.integers(-(10**12), 10**12))


@st.composite
def writes(draw: Any) -> item_writes.Write:
    conds = []
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(OPS))
        value = None if op in ("exists", "not_exists") else draw(values)
        conds.append(item_writes.Cond(draw(st.sampled_from(ATTRS)), op, value))
    sets = tuple(
        (a, draw(values)) for a in draw(st.lists(st.sampled_from(ATTRS), unique=True, max_size=4))
    )
    remove = tuple(draw(st.lists(st.sampled_from(ATTRS), unique=True, max_size=2)))
    incr = tuple(draw(st.lists(st.sampled_from(ATTRS), unique=True, max_size=2)))
    if not (sets or remove or incr):
        sets = (("state", draw(values)),)
    key = (draw(st.text(min_size=1, max_size=5)), draw(st.text(min_size=1, max_size=5)))
    return item_writes.Write(key, tuple(conds), sets, remove, incr)


@pytest.mark.property
@settings(max_examples=400)
@given(writes())
def test_render_equals_rendering_from_scratch(w: item_writes.Write) -> None:
    assert item_writes.render(w) == item_writes.render_plain(w)


def test_the_daemons_writes_render_as_from_scratch() -> None:
    """Two writes of each kind the daemon sends, with different values: the second one comes
    from the template the first made, and must still carry its own values."""
    item = lease_items.ResourceItem("c", "r1", "p", "us-east-1", "c#p#us-east-1#3", 4)
    out = []
    for n in (1, 2):
        now = 1_700_000_000_000_000 + n
        token = f"tok{n}"
        ws = [
            builders.claim(item, f"k{n}", now + 60_000_000, now, token, n),
            map_builders.map_acquire(
                ("m#c#p#k", "us-east-1"), n - 1, token, f"r{n}", n, now + 9, now, "o"
            ),
            builders.free_claim(("c", f"r{n}"), f"k{n}", token, now, now + 5),
            builders.fence_resource(("c", f"r{n}"), n),
        ]
        for w in ws:
            assert item_writes.render(w) == item_writes.render_plain(w)
        out.append([item_writes.render(w) for w in ws])
    assert out[0] != out[1]


def test_booleans_are_refused_from_a_template_too() -> None:
    w = item_writes.Write(("a", "b"), (item_writes.Cond("version", "=", 1),), (("state", "x"),))
    item_writes.render(w)
    with pytest.raises(TypeError):
        item_writes.render(
            item_writes.Write(
                ("a", "b"), (item_writes.Cond("version", "=", True),), (("state", "x"),)
            )
        )


@pytest.mark.property
@settings(max_examples=300)
@given(st.integers(-(10**16), 10**17))
def test_fmt_time_equals_formatting_from_scratch(us: int) -> None:
    assert lease_items.fmt_time(us) == lease_items.fmt_time_plain(us)
    assert lease_items.fmt_time(us + 1) == lease_items.fmt_time_plain(
        us + 1
    )  # same second, from the cache


@pytest.mark.property
@settings(max_examples=300)
@given(st.integers(-(10**16), 10**17))
def test_parse_time_equals_parsing_from_scratch(us: int) -> None:
    s = lease_items.fmt_time_plain(us)
    assert lease_items.parse_time(s) == lease_items.parse_time_plain(s) == us
    s1 = lease_items.fmt_time_plain(us + 1)
    assert (
        lease_items.parse_time(s1) == lease_items.parse_time_plain(s1) == us + 1
    )  # same second, from the cache


@pytest.mark.parametrize(
    "bad",
    [
        "2023-11-14T22:13:50.000000",
        "2023-11-14T22:13:50,000000Z",
        "2023-11-14T22:13:50.00000xZ",
        "2023-11-14T22:13:50.0000\u00b2Z",
        "2023-13-14T22:13:50.000000Z",
        "2023-11-14T22:13:50.000000ZZ",
    ],
)
def test_parse_time_refuses_what_is_not_a_fixed_width_utc_time(bad: str) -> None:
    with pytest.raises(ValueError):
        lease_items.parse_time(bad)


@pytest.mark.property
@given(st.dictionaries(st.sampled_from(ATTRS), st.one_of(values, st.binary(max_size=3))))
def test_item_from_av_keeps_strings_and_numbers_only(plain: dict[str, Any]) -> None:
    raw = {
        k: ({"B": v} if isinstance(v, bytes) else item_writes.to_av(v)) for k, v in plain.items()
    }
    want = {k: v for k, v in plain.items() if not isinstance(v, bytes)}
    assert item_writes.item_from_av(raw) == want
    assert item_writes.item_from_av(raw) == {
        k: item_writes.from_av(av) for k, av in raw.items() if "B" not in av
    }
