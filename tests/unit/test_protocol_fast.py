"""The one-pass check of a get_lease frame accepts exactly what the field-by-field walk
accepts, with the same Request; everything else gets the walk's typed error."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from rasd.errors import BadRequest
from rasd.lease import MAX_KEY_LEN
from rasd.protocol import MAX_DEADLINE_MS, MAX_ID_LEN, _parse_checked, parse

GOOD: dict[str, Any] = {
    "v": 1,
    "id": 7,
    "op": "get_lease",
    "client_id": "c",
    "pool_id": "p",
    "key": "k",
    "lease_expires_us": 10**15,
    "deadline_ms": 500,
}
VALUES: dict[str, list[Any]] = {
    "v": [1, 2, True, 1.0, None, "1"],
    "id": [0, -3, 2**40, True, 1.5, "1", None],
    "client_id": ["c", "", "x" * MAX_ID_LEN, "x" * (MAX_ID_LEN + 1), 5, None, b"c"],
    "pool_id": ["p", "", "y" * (MAX_ID_LEN + 1), [], None],
    "key": ["k", "", "z" * MAX_KEY_LEN, "z" * (MAX_KEY_LEN + 1), 3, None],
    "lease_expires_us": [10**15, 0, -1, False, 1.0, "1", None],
    "deadline_ms": [None, 1, MAX_DEADLINE_MS, MAX_DEADLINE_MS + 1, 0, True, 2.0, "5"],
}
MISSING = object()


def outcome(fn: Any, frame: dict[str, Any]) -> Any:
    try:
        return fn(frame)
    except BadRequest as exc:
        return ("error", exc.code, exc.message)


@pytest.mark.parametrize("field", sorted(VALUES))
def test_fast_and_checked_agree_field_by_field(field: str) -> None:
    for value in [*VALUES[field], MISSING]:
        frame = dict(GOOD)
        if value is MISSING:
            del frame[field]
        else:
            frame[field] = value
        assert outcome(parse, frame) == outcome(_parse_checked, frame), (field, value)


def test_fast_and_checked_agree_on_pairs() -> None:
    fields = sorted(VALUES)
    for a, b in itertools.combinations(fields, 2):
        for va, vb in itertools.product(VALUES[a][:4], VALUES[b][:4]):
            frame = {**GOOD, a: va, b: vb}
            assert outcome(parse, frame) == outcome(_parse_checked, frame), (a, va, b, vb)


def test_other_ops_take_the_checked_walk() -> None:
    frame = {"v": 1, "id": 1, "op": "release", "client_id": "c", "pool_id": "p", "key": "k"}
    assert parse(frame) == _parse_checked(frame)
    assert outcome(parse, {"v": 1, "id": 1, "op": "nope"})[0] == "error"
