"""The get_lease frame's one check (protocol.lease_fields, the names' lengths included):
each field's good values are accepted into the Request, each bad one is refused with a
BadRequest naming that field; and the one answer layout, whose cached form is the same bytes."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from rasd.core.errors import BadRequest
from rasd.core.lease import MAX_KEY_LEN, US, Lease
from rasd.wire import (
    ID_MAX,
    ID_PACK,
    MAX_DEADLINE_MS,
    MAX_ID_LEN,
    Request,
    answer_head,
    lease_fields,
    lease_response,
    parse,
)
from rasd_client.wire import FrameDecoder, encode

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
MISSING = object()
#: field -> (values accepted, values refused)
VALUES: dict[str, tuple[list[Any], list[Any]]] = {
    "v": ([1], [2, True, 1.0, None, "1", MISSING]),
    "id": ([0, -3, 2**40], [True, 1.5, "1", None, MISSING]),
    "client_id": (["c", "x" * MAX_ID_LEN], ["", "x" * (MAX_ID_LEN + 1), 5, None, b"c", MISSING]),
    "pool_id": (["p", "y" * MAX_ID_LEN], ["", "y" * (MAX_ID_LEN + 1), [], None, MISSING]),
    "key": (["k", "z" * MAX_KEY_LEN], ["", "z" * (MAX_KEY_LEN + 1), 3, None, MISSING]),
    "lease_expires_us": ([10**15, 0, -1], [False, 1.0, "1", None, MISSING]),
    "deadline_ms": (
        [None, 1, MAX_DEADLINE_MS, MISSING],
        [MAX_DEADLINE_MS + 1, 0, True, 2.0, "5"],
    ),
}
#: what the error message of a refused field says
NAMED = {"v": "version", **{f: f for f in VALUES if f != "v"}}


def with_(frame: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    out = dict(frame)
    if value is MISSING:
        del out[field]
    else:
        out[field] = value
    return out


def refusal(frame: dict[str, Any]) -> str:
    with pytest.raises(BadRequest) as info:
        parse(frame)
    assert info.value.code == "BAD_REQUEST"
    assert info.value.message != "malformed get_lease", frame  # the walk named nothing
    return info.value.message


@pytest.mark.parametrize("field", sorted(VALUES))
def test_good_values_make_the_request(field: str) -> None:
    for value in VALUES[field][0]:
        frame = with_(GOOD, field, value)
        req = parse(frame)
        assert req == Request(
            frame["id"],
            "get_lease",
            frame["client_id"],
            frame["pool_id"],
            frame["key"],
            frame["lease_expires_us"],
            frame.get("deadline_ms"),
        )
        assert lease_fields(frame) == (
            req.id,
            req.client_id,
            req.pool_id,
            req.key,
            req.lease_expires_us,
            req.deadline_ms,
        )


@pytest.mark.parametrize("field", sorted(VALUES))
def test_a_bad_value_is_refused_naming_its_field(field: str) -> None:
    for value in VALUES[field][1]:
        frame = with_(GOOD, field, value)
        assert NAMED[field] in refusal(frame), (field, value)
        assert lease_fields(frame) is None, (field, value)  # the one check refuses it


def test_two_bad_fields_are_refused_naming_one_of_them() -> None:
    for a, b in itertools.combinations(sorted(VALUES), 2):
        for va, vb in itertools.product(VALUES[a][1][:3], VALUES[b][1][:3]):
            message = refusal(with_(with_(GOOD, a, va), b, vb))
            assert NAMED[a] in message or NAMED[b] in message, (a, va, b, vb, message)


def test_other_ops_take_the_walk() -> None:
    frame = {"v": 1, "id": 1, "op": "release", "client_id": "c", "pool_id": "p", "key": "k"}
    assert lease_fields(frame) is None
    assert parse(frame) == Request(1, "release", "c", "p", "k")
    assert "unknown op" in refusal({"v": 1, "id": 1, "op": "nope"})


def test_the_cached_answer_is_the_answer_layout_encoded() -> None:
    """answer_head + the id's 8 bytes is lease_response encoded: byte for byte where msgpack
    itself packs the id as a uint64, and decoded to the same map for every id."""
    exp = 10**15
    lease = Lease("c", "p", "k", "rés-1", "eu-west-1", exp, 2**40, exp - US, "0123456789abcdef")
    head = answer_head(lease)
    for rid in (2**32, 2**63, ID_MAX):
        assert head + ID_PACK(rid) == encode(lease_response(rid, lease, False))
    for rid in (0, 1, 127, 128, 2**16, 2**32 - 1):
        dec = FrameDecoder()
        dec.feed(head + ID_PACK(rid))
        assert list(dec.frames()) == [lease_response(rid, lease, False)]
        assert dec.buffered == 0
