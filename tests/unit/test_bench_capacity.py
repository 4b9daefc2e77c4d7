"""bench.capacity: DynamoDB's billing rules, on the documented examples and rasd's items."""

from __future__ import annotations

from bench import capacity


def test_item_sizes_follow_the_documented_rules() -> None:
    assert capacity.item_size(None) == 0
    assert capacity.item_size({"a": {"S": "hello"}}) == 1 + 5
    assert capacity.item_size({"é": {"S": "é"}}) == 2 + 2  # UTF-8 bytes, name and value
    # numbers: a byte per two significant digits, plus one; zeros at either end trimmed
    assert capacity.value_size({"N": "7"}) == 2
    assert capacity.value_size({"N": "12345"}) == 4
    assert capacity.value_size({"N": "1000000"}) == 2
    assert capacity.value_size({"N": "0.001"}) == 2
    assert capacity.value_size({"BOOL": True}) == capacity.value_size({"NULL": True}) == 1
    assert capacity.value_size({"L": [{"S": "ab"}, {"N": "1"}]}) == 3 + (2 + 1) + (2 + 1)
    assert capacity.value_size({"M": {"k": {"S": "v"}}}) == 3 + 1 + 1 + 1


def test_reads_round_up_to_4_kb_and_an_eventual_read_costs_half() -> None:
    assert capacity.read_units(0, True) == 1  # an absent item still costs the minimum
    assert capacity.read_units(4096, True) == 1
    assert capacity.read_units(4097, True) == 2
    assert capacity.read_units(4097, False) == 1.0
    assert capacity.read_units(100, False) == 0.5


def test_writes_bill_the_larger_image_and_a_refused_one_the_existing_item() -> None:
    small = {"client_id": {"S": "c"}, "resource": {"S": "r"}}
    big = {**small, "blob": {"S": "x" * 1100}}
    assert capacity.write_units(None, small) == 1
    assert capacity.write_units(big, small) == 2  # shrinking an item pays for what it was
    assert capacity.write_units(small, None) == 1
    assert capacity.refused_write_units(None) == 1
    assert capacity.refused_write_units(big) == 2


def _resource(**extra: str) -> dict[str, dict[str, str]]:
    base = {"client_id": "demo", "resource": "res-1", "pool_id": "p", "region": "us-east-1",
            "version": "3"}  # fmt: skip
    base.update(extra)
    return {k: ({"N": v} if k == "version" else {"S": v}) for k, v in base.items()}


def test_each_index_a_write_changes_bills_its_own_entries() -> None:
    free = _resource(partition="demo.p.us-east-1.0", lease_available="2026-01-01T00:00:00.000000Z")
    held = _resource(key="k", lease_expires="2026-01-01T01:00:00.000000Z")
    # a claim: out of the available index (one delete), into the leased one (one put)
    assert capacity.index_write_units(free, held) == {
        "available_resources": 1,
        "leased_resources": 1,
    }
    # an extension: the leased entry changes, its key does not: one write
    longer = {**held, "lease_expires": {"S": "2026-01-01T02:00:00.000000Z"}}
    assert capacity.index_write_units(held, longer) == {"leased_resources": 1}
    # the same key held for another pool's name would move the entry: two writes
    moved = {**held, "pool_id": {"S": "q"}}
    assert capacity.index_write_units(held, moved) == {"leased_resources": 2}
    # an item in no index (a mapping item) costs no index anything
    mapping = {"client_id": {"S": "#map#demo#p#k"}, "resource": {"S": "us-east-1"}}
    assert capacity.index_write_units(None, mapping) == {}
    assert capacity.weighted(2.0, 3) == 17.0
