"""A mixed fleet on one table: rasd daemons and workers of the paper's agent asking for the
same keys at once, both liberators running, then an audit of what every caller was answered.

The audit reads only the answers (who asked, for which key, what came back, when, until
when) and the releases:

* I1: no resource is answered to two keys with overlapping leases (a lease runs from its
  answer to the end it was answered with: the paper's agent is never told of a release);
* I2 across the agents: no key holds two resources of the region at overlapping times, except
  where the second one's acquisition started before the first one's was answered (the
  paper's own race between an index lookup and a claim, which no agent beside it can close).
  Those are counted, and must stay rare.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import pytest

import rasd_client
from bench.baseline import BaselineAgent, NoCapacity, paper_liberate
from rasd.core import lease as lease_items
from rasd_client import aio as rasd_aio
from rasd_jobs import liberator
from tests.helpers.tables import rollout_on, seed_pool

pytestmark = [pytest.mark.integration, pytest.mark.serial]

C, P, EAST = "demo", "default", "us-east-1"


@pytest.fixture(autouse=True)
def _rollout_mode(ddb: Any, table: str) -> None:
    """The paper's agent writes these tables: they are in rollout mode (``rasadmin adopt``)."""
    rollout_on(ddb, table)


RUN_S = 6.0
KEYS = [f"k{i:02d}" for i in range(16)]
#: how long past a lease's end a call that answers the same resource, not new, still counts
#: as continuing that lease (the audit's ``acquired``)
LAPSE_S = 0.2


@dataclass(frozen=True)
class Answer:
    agent: str
    key: str
    resource: str
    start: float  # the call's start (wall seconds)
    at: float  # when the answer came back
    end: float  # the lease end it was answered with
    new: bool
    #: the end the call asked for: rasd extends the item toward it in the background after
    #: answering (refresh-ahead), so the item's lease may run that long
    asked: float


def now() -> float:
    return time.time()


def audit(
    answers: list[Answer], releases: dict[str, list[float]], confirm_s: float
) -> tuple[list[str], list[str], int]:
    """(I1 violations, I2 violations, I2 overlaps from concurrent first acquisitions)."""
    i1: list[str] = []
    by_res: dict[str, list[Answer]] = defaultdict(list)
    for a in answers:
        by_res[a.resource].append(a)
    for res, xs in by_res.items():
        xs.sort(key=lambda a: a.at)
        for i, a in enumerate(xs):
            for b in xs[i + 1 :]:
                if b.key != a.key and b.at < a.end:
                    i1.append(f"{res}: {a} then {b}")
    i2: list[str] = []
    races: set[tuple[str, str, str]] = set()
    by_key: dict[str, list[Answer]] = defaultdict(list)
    for a in answers:
        by_key[a.key].append(a)
    for key, xs in by_key.items():
        xs.sort(key=lambda a: a.at)

        def acquired(a: Answer, xs: list[Answer] = xs) -> tuple[float, float]:
            # When the lease ``a`` is part of was acquired, as (start, answered): the answers
            # of that resource for this key back from ``a`` while the item's lease may have
            # run on (each call started before the end the previous call asked for, or within
            # LAPSE_S after it: an extension is conditioned on the item's version, and a rasd
            # daemon never extends an item whose end has passed, so a call that is not new
            # continues the same lease), up to the newest that acquired it. When none of
            # them did (the acquiring call was answered to no one, or its other callers
            # coalesced on it), the chain's earliest call and earliest answer.
            same = [x for x in xs if x.resource == a.resource and x.at <= a.at]
            chain = [same[-1]]
            for x in reversed(same[:-1]):
                if chain[-1].new or x.asked < chain[-1].start - LAPSE_S:
                    break
                chain.append(x)
            if chain[-1].new:
                return chain[-1].start, chain[-1].at
            return min(x.start for x in chain), min(x.at for x in chain)

        rel = releases.get(key, [])

        def held_until(a: Answer, rel: list[float] = rel) -> float:
            # The app that released the key stops using it; a host may still answer the
            # released lease from its cache for S after its last confirmation (I3), so a
            # release also ends what was answered up to S after it.
            return min([a.end, *(t for t in rel if t >= a.at - confirm_s)])

        for i, a in enumerate(xs):
            for b in xs[i + 1 :]:
                if b.resource == a.resource or b.at >= held_until(a):
                    continue
                (start_a, at_a), (start_b, at_b) = acquired(a), acquired(b)
                if start_b < at_a and start_a < at_b:
                    races.add((key, *sorted((a.resource, b.resource))))  # ran at once
                else:
                    i2.append(f"{key}: {a} and {b}")
    return i1, i2, len(races)


async def test_mixed_fleet_audit(
    ddb: Any, table: str, moto_endpoint: str, make_daemon: Any
) -> None:
    """Two rasd daemons and two workers of the paper's agent share 16 keys and 24 resources
    for a few seconds of short leases (rasd also releases), with the paper's liberator and
    ras-liberator running beside them: no resource is answered to two keys at once, and no
    key holds two resources at once beyond the paper's own race."""
    seed_pool(ddb, table, count=24)
    cfg = {
        "skew_margin": 0.3,
        "confirm_interval": 1.0,
        "max_clock_skew": 0.1,
        "replication_lag": 0.2,
        "exhausted_backoff": 0.1,
    }
    answers: list[Answer] = []
    releases: dict[str, list[float]] = defaultdict(list)
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[str] = []
    deadline = now() + RUN_S

    def paper_worker(seed: int) -> None:
        rng = random.Random(seed)
        agent = BaselineAgent(table, EAST, moto_endpoint, paper=True)
        try:
            while now() < deadline:
                key = rng.choice(KEYS)
                t0 = now()
                asked = t0 + rng.uniform(1.0, 2.5)
                try:
                    got = agent.get_lease(C, P, key, int(asked * lease_items.US))
                except NoCapacity:
                    continue
                end = got.expires_us / lease_items.US  # the paper's agent never extends
                with lock:
                    answers.append(Answer("paper", key, got.resource, t0, now(), end, got.new, end))
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(f"paper worker: {exc!r}")
        finally:
            agent.ddb.close()

    def liberators() -> None:
        while not stop.wait(0.3):
            try:
                paper_liberate(ddb, table, int(now() * lease_items.US))
                opts = liberator.Options(
                    table,
                    EAST,
                    int(now() * lease_items.US),
                    grace_us=int(0.2 * lease_items.US),
                    orphan_age_us=int(1.0 * lease_items.US),
                    quarantine_us=int(1.3 * lease_items.US),
                    segments=1,
                )
                summary = liberator.run(ddb, opts)
                if summary["errors"]:
                    errors.append(f"ras-liberator: {summary}")
            except Exception as exc:  # noqa: BLE001 - reported by the test
                errors.append(f"liberators: {exc!r}")

    async def rasd_worker(sock: str, seed: int) -> None:
        rng = random.Random(seed)
        while now() < deadline:
            key = rng.choice(KEYS)
            t0 = now()
            asked = t0 + rng.uniform(1.5, 3.0)
            try:
                got = await rasd_aio.get_lease(C, P, key, asked, socket_path=sock, timeout=5)
            except (rasd_client.NoCapacity, rasd_client.Busy, rasd_client.Timeout):
                await asyncio.sleep(0.01)
                continue
            with lock:
                answers.append(
                    Answer(
                        "rasd",
                        key,
                        got.resource,
                        t0,
                        now(),
                        got.lease_expires.timestamp(),
                        got.new,
                        max(asked, got.lease_expires.timestamp()),
                    )
                )
            if rng.random() < 0.1:
                t1 = now()
                try:
                    await rasd_aio.release(C, P, key, socket_path=sock, timeout=5)
                except rasd_client.NotHeld:
                    pass
                with lock:
                    releases[key].append(t1)

    async with make_daemon(**cfg) as d1, make_daemon(**cfg) as d2:
        threads = [threading.Thread(target=paper_worker, args=(i,)) for i in range(2)]
        threads.append(threading.Thread(target=liberators))
        for t in threads:
            t.start()
        try:
            await asyncio.gather(
                *(rasd_worker(d.cfg.socket, 10 + i) for i, d in enumerate((d1, d2, d1, d2)))
            )
        finally:
            stop.set()
            for t in threads:
                await asyncio.to_thread(t.join)
    assert not errors, errors
    i1, i2, races = audit(answers, releases, cfg["confirm_interval"])
    assert not i1, "\n".join(i1[:10])
    assert not i2, "\n".join(i2[:10])
    by_agent = {a: sum(1 for x in answers if x.agent == a) for a in ("rasd", "paper")}
    assert min(by_agent.values()) > 10, by_agent  # both agents did work (load slows them)
    assert races <= len(answers) // 10, (races, len(answers))
