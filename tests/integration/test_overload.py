"""Twenty daemons on one pool, overloaded: slow calls past the deadline, lost replies (writes
that applied), 5xx and throttles, on a hot key set (Pareto). The load is sized so that moto
(in this process, sharing its GIL) answers most calls and a good share still miss their
deadline: an overload that answers nothing would test nothing. Load alone can make a weaker
protocol double-allocate (a lock item and index adoption did, in 20-daemon runs on dynalite).
Here every answer is checked:

- I1: no resource is answered to two keys (nothing expires or is released during the run);
- I2: no key is answered two resources of the region;

and the final table must agree with every answer (tests.helpers.fleet.audit).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, defaultdict
from typing import Any

import pytest

from rasd.config import Config
from rasd.core import lease as lease_items
from rasd.core.errors import RasdError
from rasd.daemon.coordinator import Coordinator
from tests.doubles.store import Faults, FaultyStore
from tests.helpers.fleet import audit
from tests.helpers.tables import seed_pool

pytestmark = [pytest.mark.integration, pytest.mark.serial]

C, P = "demo", "default"
DAEMONS, KEYS, RESOURCES, CALLS, CONCURRENCY = 20, 40, 80, 400, 12


def plan(seed: int) -> Faults:
    f = Faults(seed=seed)
    f.add("lost_reply", ops={"UpdateItem"}, probability=0.04, delay=3.0)
    f.add("slow", probability=0.05, delay=1.2)  # beyond the 1 s deadline
    f.add("slow", probability=0.10, delay=0.3)
    f.add("server_error", probability=0.02)
    f.add("throttle", probability=0.02)
    return f


async def test_twenty_daemons_overloaded_never_double_allocate(
    moto_endpoint: str, ddb: Any, table: str
) -> None:
    seed_pool(ddb, table, count=RESOURCES)
    rng = random.Random(7)
    daemons: list[Coordinator] = []
    try:
        for i in range(DAEMONS):
            cfg = Config(
                table=table, endpoint_url=moto_endpoint, socket=f"/tmp/unused-{i}.sock"
            ).validate()
            store = FaultyStore(cfg, faults=Faults())
            await store.start()
            acq = Coordinator(cfg, store, rng=random.Random(i))
            await acq.pool_table.load(time.monotonic() + 10)
            store.faults.rules = plan(i).rules  # faults from here on
            daemons.append(acq)
        answers: list[dict[str, Any]] = []
        errors: Counter[str] = Counter()
        sem = asyncio.Semaphore(CONCURRENCY)

        async def call(n: int) -> None:
            d = daemons[rng.randrange(DAEMONS)]
            key = f"k{min(int(rng.paretovariate(1.2)) - 1, KEYS - 1):02d}"
            async with sem:
                exp = int(time.time() * lease_items.US) + 3600 * lease_items.US
                try:
                    lease, new = await d.acquirer.get_lease(C, P, key, exp, time.monotonic() + 1.0)
                except RasdError as exc:
                    errors[exc.code] += 1
                    return
            answers.append(
                {"key": key, "resource": lease.resource, "version": lease.version, "new": new}
            )

        await asyncio.gather(*(call(n) for n in range(CALLS)))
        for d in daemons:
            d.store.faults.clear()  # heal, then let give-backs and fences finish
        await asyncio.gather(*(d.drain(10.0) for d in daemons))
    finally:
        for d in daemons:
            await d.store.close()

    by_resource: dict[str, set[str]] = defaultdict(set)
    by_key: dict[str, set[str]] = defaultdict(set)
    for a in answers:
        by_resource[a["resource"]].add(a["key"])
        by_key[a["key"]].add(a["resource"])
    assert not {r: ks for r, ks in by_resource.items() if len(ks) > 1}, "I1 broken"
    assert not {k: rs for k, rs in by_key.items() if len(rs) > 1}, "I2 broken"
    summary = audit(ddb, table, answers, "us-east-1")
    injected = sum(sum(d.store.faults.injected.values()) for d in daemons)  # type: ignore[attr-defined]
    total: Counter[str] = Counter()
    for d in daemons:
        total.update(d.counters.snapshot())
    print("counters", dict(sorted(total.items())))
    print(
        f"overload: {len(answers)} answers, errors {dict(errors)}, faults injected {injected}, "
        f"orphans repaired {summary['orphans']}"
    )
    assert injected > 0 and errors, "the run must actually have been overloaded"
    assert len(answers) > CALLS // 4, "most calls should still be answered"
