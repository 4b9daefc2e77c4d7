"""The bench's targets table: each figure judged against its target from one run's document."""

from __future__ import annotations

from typing import Any

from bench.__main__ import targets
from bench.report import targets_table


def _doc(**over: Any) -> dict[str, Any]:
    sc: dict[str, Any] = {
        "s": {
            "backend": "dynalite",
            "leases": 500,
            "cpu_per_new_lease_ms": 1.4,
            "spawn_to_first_new_lease_s": {"median": 0.3, "min": 0.2, "max": 0.4, "runs": [0.3]},
        },
        "c": {"speedup_p50": 1.6, "rasd": {"p50_ms": 22.0}, "baseline": {"p50_ms": 35.2}},
        "f": {
            "backend": "dynalite",
            "conflicts_per_acquisition": 0.01,
            "prefetch_hit_rate": 0.97,
            "double_allocations": 0,
        },
        "g": {"cached_leases": 100_000, "rss_mb_full": 79.0},
        "d": {"points": [{"procs": 8, "ratio": 0.92}, {"procs": 32, "ratio": 0.79}]},
        "e": {"points": [{"per_subpartition": 1000}, {"per_subpartition": 100_000}],
              "rasd_p50_spread": 0.03},
    }  # fmt: skip
    for k, v in over.items():
        sc[k] = {**sc[k], **v}
    return {"scenarios": sc, "delay_ms": 3.5, "options": {"f_daemons": 20}}


def test_each_figure_judged_against_its_target() -> None:
    got = {t["target"]: t["met"] for t in targets(_doc())}
    assert got == {
        "<= 1.5 ms": True,
        ">= 2.5x": False,
        "<= 2 % / >= 95 %": True,
        "<= 80 MB": True,
        "<= 0.5 s": True,
        ">= 90 % / >= 80 %": False,  # 32 processes at 79 %
        "flat within 10 %": True,
    }


def test_a_double_allocation_fails_spread_and_extrapolated_rss_is_named() -> None:
    doc = _doc(
        f={"double_allocations": 1},
        g={"cached_leases": 20_000, "rss_mb_at_100k_extrapolated": 70.0},
    )
    rows = {t["from"]: t for t in targets(doc)}
    assert rows["f"]["met"] is False
    assert rows["g"]["met"] is True and "extrapolated from 20,000" in rows["g"]["measured"]


def test_partial_range_is_not_judged_and_table_names_the_load() -> None:
    doc = _doc(e={"points": [{"per_subpartition": 1000}, {"per_subpartition": 10_000}]})
    ts = targets(doc)
    assert next(t for t in ts if t["from"] == "e")["met"] is None
    md = targets_table(ts, {"s": {"before": [1.25, 1, 1], "after": [1.5, 1, 1]}})
    assert "| 1.25 / 1.50 |" in md and md.count("\n") == len(ts) + 1
