"""The fleet bench's reading of a proxy's trace: the backend's time per operation and the
requests that opened a connection, between two snapshots' offsets."""

from __future__ import annotations

import json
from pathlib import Path

from bench.fleet import trace_service


def line(
    op: str, conn: int, up: float, back: float, index: str | None = None, status: str = "200"
) -> bytes:
    t = {"op": op, "index": index, "conn": conn, "in": up, "up": up, "back": back, "out": back}
    t["status"] = status
    return (json.dumps(t) + "\n").encode()


def test_the_window_counts_its_own_requests_and_connections(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    before = line("Query", 1, 0.0, 0.002) + line("Query", 2, 0.0, 0.003)
    inside = (
        line("Query", 1, 1.0, 1.004)  # an old connection
        + line("UpdateItem", 3, 1.0, 1.001)  # a new one
        + line("UpdateItem", 3, 2.0, 2.003, status="400")
        + line("Query", 4, 2.0, 2.0015, index="leased_resources")  # a new one
    )
    path.write_bytes(before + inside + b'{"op": "Query", "ind')  # a line being written
    got = trace_service(str(path), len(before), path.stat().st_size)
    assert got["new_connections"] == 2
    assert set(got["ops"]) == {"Query", "UpdateItem", "Query leased_resources"}
    assert got["ops"]["Query"]["n"] == 1
    assert round(got["ops"]["Query"]["p50_ms"], 6) == 4.0
    assert got["ops"]["UpdateItem"]["n"] == 2
    assert got["ops"]["Query leased_resources"]["n"] == 1
    assert got["not_200"] == {"UpdateItem 400": 1}


def test_an_empty_window_is_empty(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(line("Query", 1, 0.0, 0.001))
    size = path.stat().st_size
    assert trace_service(str(path), size, size) == {
        "ops": {},
        "new_connections": 0,
        "not_200": {},
        "writes_meeting_a_page": {"writes": 0, "of": 0, "p50_ms": None, "others_p50_ms": None},
    }


def test_writes_that_met_an_index_page_at_the_backend(tmp_path: Path) -> None:
    """A write whose time at the backend overlapped an available-index Query's is counted
    apart (a refill's page served among a claim's writes), with its backend time; one that
    only touched it end to end is not."""
    path = tmp_path / "trace.jsonl"
    path.write_bytes(
        line("Query", 1, 1.000, 1.004, index="available_resources")  # a 4 ms page
        + line("UpdateItem", 2, 1.001, 1.006)  # met it: 5 ms
        + line("UpdateItem", 3, 1.004, 1.005)  # began as it ended: 1 ms
        + line("UpdateItem", 4, 5.000, 5.002)  # alone: 2 ms
        + line("Query", 5, 5.001, 5.003)  # a key's Query, not a page
    )
    got = trace_service(str(path), 0, path.stat().st_size)["writes_meeting_a_page"]
    assert got["writes"] == 1 and got["of"] == 3
    assert round(got["p50_ms"], 6) == 5.0
    assert round(got["others_p50_ms"], 6) == 1.0  # nearest rank of 1 and 2 ms
