"""rasd.core.writes.render: its per-shape template cache gives exactly what rendering from scratch
(``render_plain``) gives, whatever the values and however shapes repeat."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rasd.core import builders as B
from rasd.core import lease as L
from rasd.core import map_builders as MB
from rasd.core import writes as W

ATTRS = ["holder", "version", "lease_expires", "state", "token", "#odd name"]
OPS: list[W.Op] = ["=", "<>", "<", "<=", ">", ">=", "exists", "not_exists"]
values = st.one_of(st.text(max_size=8), st.integers(-(10**12), 10**12))


@st.composite
def writes(draw: Any) -> W.Write:
    conds = []
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(OPS))
        value = None if op in ("exists", "not_exists") else draw(values)
        conds.append(W.Cond(draw(st.sampled_from(ATTRS)), op, value))
    sets = tuple(
        (a, draw(values)) for a in draw(st.lists(st.sampled_from(ATTRS), unique=True, max_size=4))
    )
    remove = tuple(draw(st.lists(st.sampled_from(ATTRS), unique=True, max_size=2)))
    incr = tuple(draw(st.lists(st.sampled_from(ATTRS), unique=True, max_size=2)))
    if not (sets or remove or incr):
        sets = (("state", draw(values)),)
    key = (draw(st.text(min_size=1, max_size=5)), draw(st.text(min_size=1, max_size=5)))
    return W.Write(key, tuple(conds), sets, remove, incr)


@pytest.mark.property
@settings(max_examples=400)
@given(writes())
def test_render_equals_rendering_from_scratch(w: W.Write) -> None:
    assert W.render(w) == W.render_plain(w)


def test_the_daemons_writes_render_as_from_scratch() -> None:
    """Two writes of each kind the daemon sends, with different values: the second one comes
    from the template the first made, and must still carry its own values."""
    item = L.ResourceItem("c", "r1", "p", "us-east-1", "c#p#us-east-1#3", 4)
    out = []
    for n in (1, 2):
        now = 1_700_000_000_000_000 + n
        token = f"tok{n}"
        ws = [
            B.claim(item, f"k{n}", now + 60_000_000, now, token, n),
            MB.map_acquire(("m#c#p#k", "us-east-1"), n - 1, token, f"r{n}", n, now + 9, now, "o"),
            B.free_claim(("c", f"r{n}"), f"k{n}", token, now, now + 5),
            B.fence_resource(("c", f"r{n}"), n),
        ]
        for w in ws:
            assert W.render(w) == W.render_plain(w)
        out.append([W.render(w) for w in ws])
    assert out[0] != out[1]


def test_booleans_are_refused_from_a_template_too() -> None:
    w = W.Write(("a", "b"), (W.Cond("version", "=", 1),), (("state", "x"),))
    W.render(w)
    with pytest.raises(TypeError):
        W.render(W.Write(("a", "b"), (W.Cond("version", "=", True),), (("state", "x"),)))


@pytest.mark.property
@settings(max_examples=300)
@given(st.integers(-(10**16), 10**17))
def test_fmt_time_equals_formatting_from_scratch(us: int) -> None:
    assert L.fmt_time(us) == L.fmt_time_plain(us)
    assert L.fmt_time(us + 1) == L.fmt_time_plain(us + 1)  # same second, from the cache


@pytest.mark.property
@settings(max_examples=300)
@given(st.integers(-(10**16), 10**17))
def test_parse_time_equals_parsing_from_scratch(us: int) -> None:
    s = L.fmt_time_plain(us)
    assert L.parse_time(s) == L.parse_time_plain(s) == us
    s1 = L.fmt_time_plain(us + 1)
    assert L.parse_time(s1) == L.parse_time_plain(s1) == us + 1  # same second, from the cache


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
        L.parse_time(bad)


@pytest.mark.property
@given(st.dictionaries(st.sampled_from(ATTRS), st.one_of(values, st.binary(max_size=3))))
def test_item_from_av_keeps_strings_and_numbers_only(plain: dict[str, Any]) -> None:
    raw = {k: ({"B": v} if isinstance(v, bytes) else W.to_av(v)) for k, v in plain.items()}
    want = {k: v for k, v in plain.items() if not isinstance(v, bytes)}
    assert W.item_from_av(raw) == want
    assert W.item_from_av(raw) == {k: W.from_av(av) for k, av in raw.items() if "B" not in av}
