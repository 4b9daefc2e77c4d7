"""Per-pool capacity metrics of one daemon (:class:`PoolMetrics`), bounded in cardinality
(``#overflow`` past the first pools) and counted only where a request does DynamoDB work
anyway. The families: docs/operations.md, "Observability".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

#: Pools with labels of their own; later ones share the overflow labels.
MAX_POOLS = 100
#: The label value of every pool past ``MAX_POOLS`` (no pool name can contain ``#``).
OVERFLOW = "#overflow"
#: The families exported (the operator kit's rules and dashboard may use them).
FAMILIES = (
    "rasd_pool_new_leases_total",
    "rasd_pool_no_capacity_total",
    "rasd_pool_claimable_candidates",
)

PoolKey = tuple[str, str]
_OVERFLOW_KEY: PoolKey = (OVERFLOW, OVERFLOW)


class PoolMetrics:
    """NO_CAPACITY answers and new leases per pool, with a cap on distinct pools."""

    __slots__ = ("_labelled", "max_pools", "new", "no_capacity")

    def __init__(self, max_pools: int = MAX_POOLS) -> None:
        if max_pools < 1:
            raise ValueError("max_pools must be >= 1")
        self.max_pools = max_pools
        self._labelled: set[PoolKey] = set()
        self.new: Counter[PoolKey] = Counter()
        self.no_capacity: Counter[PoolKey] = Counter()

    def key(self, client_id: str, pool_id: str) -> PoolKey:
        """The labels ``(client_id, pool_id)`` are counted under: the pool's own while fewer
        than ``max_pools`` pools have labels, else the overflow labels."""
        k = (client_id, pool_id)
        if k in self._labelled:
            return k
        if len(self._labelled) < self.max_pools:
            self._labelled.add(k)
            return k
        return _OVERFLOW_KEY

    def new_lease(self, client_id: str, pool_id: str) -> None:
        self.new[self.key(client_id, pool_id)] += 1

    def no_capacity_answer(self, client_id: str, pool_id: str) -> None:
        self.no_capacity[self.key(client_id, pool_id)] += 1

    def bounded(self, values: Mapping[PoolKey, float]) -> dict[PoolKey, float]:
        """``values`` per pool, those of pools without labels of their own summed under the
        overflow labels. Read-only: a pool first seen here takes no label slot (scrapes run
        in another thread and must not change what the event loop counts)."""
        out: dict[PoolKey, float] = {}
        labelled = set(self._labelled)
        room = self.max_pools - len(labelled)
        for k, v in sorted(values.items()):
            if k not in labelled:
                if room > 0:
                    room -= 1  # would get its own labels at its first count
                else:
                    k = _OVERFLOW_KEY
            out[k] = out.get(k, 0.0) + v
        return out

    def families(
        self, core: Any, claimable: Callable[[], Mapping[PoolKey, float]] | None = None
    ) -> Iterator[Any]:
        """The metric families (``core`` is prometheus_client.metrics_core)."""
        labels = ["client_id", "pool_id"]
        # every pool with labels has both counters from its first count on, so a pool's
        # first NO_CAPACITY answer is an increase from 0 (Prometheus ignores a first sample)
        known = set(self._labelled)
        if self.new.get(_OVERFLOW_KEY) or self.no_capacity.get(_OVERFLOW_KEY):
            known.add(_OVERFLOW_KEY)
        for name, doc, counts in (
            (
                "rasd_pool_new_leases",
                "get_lease answers that acquired a new lease, per pool.",
                self.new,
            ),
            ("rasd_pool_no_capacity", "get_lease answers NO_CAPACITY, per pool.", self.no_capacity),
        ):
            fam = core.CounterMetricFamily(name, doc, labels=labels)
            values = dict(counts)
            for k in sorted(known):
                fam.add_metric(list(k), values.get(k, 0))
            yield fam
        if claimable is not None:
            fam = core.GaugeMetricFamily(
                "rasd_pool_claimable_candidates",
                "Claim candidates the prefetcher holds per pool (a lower bound of what is "
                "claimable in this region; 0 once a sweep found nothing).",
                labels=labels,
            )
            for k, v in sorted(self.bounded(claimable()).items()):
                fam.add_metric(list(k), v)
            yield fam
