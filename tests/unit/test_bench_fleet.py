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
    }
