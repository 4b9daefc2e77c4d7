"""The cache rules at their edges: an answer is served strictly before its ``until`` (the
client's table read compares the same way), and re-confirmed only strictly past S/2."""

from __future__ import annotations

from rasd.core import cache_rules


def test_an_entry_is_served_strictly_before_its_until() -> None:
    assert cache_rules.serves(10.0, 9.999)
    assert not cache_rules.serves(10.0, 10.0)
    assert not cache_rules.serves(10.0, 10.001)


def test_re_confirmation_starts_strictly_past_half_of_s() -> None:
    assert not cache_rules.stale(100.0, 115.0, 30.0)
    assert cache_rules.stale(100.0, 115.001, 30.0)
