"""The paper's agent and its liberator, as programs (:func:`paper_get_lease`,
:func:`paper_free_expired`): what the checker and ``bench.baseline`` run beside the daemons
(docs/design.md, "Beside the paper's agent").
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..core.builders import paper_claim, paper_free
from ..core.decide import pick
from ..core.lease import ResourceItem
from ..core.serialize import resource_from
from . import Note, Program, QueryAvailable, QueryLeased, Send
from .repair import applied


@dataclass(frozen=True)
class PaperAnswer:
    """A lease the paper's agent answered: the item (as written by its claim, or as the index
    showed it) and whether it claimed it now."""

    item: ResourceItem
    new: bool


def paper_get_lease(
    client_id: str,
    pool_id: str,
    key: str,
    region: str,
    expires_us: int,
    now_us: int,
    partitions: tuple[int, ...],
    page: int,
    seed: int | None = None,
) -> Program[PaperAnswer | None]:
    """One ``get_lease`` of the paper's agent: the key's running lease from the leased index,
    else a claim of a candidate of ``partitions`` (tried in that order; the candidates of a
    page in an order drawn from ``seed``, as read when None). None: no candidate was left."""
    found: list[ResourceItem] = yield from QueryLeased(client_id, pool_id, key)
    live = [it for it in found if it.client_id == client_id and not it.expired(now_us)]
    it = pick(live)
    if it is not None:
        return PaperAnswer(it, False)
    rng = random.Random(seed) if seed is not None else None
    for n in partitions:
        cands = list((yield from QueryAvailable(client_id, pool_id, region, n, page)))
        if rng is not None:
            rng.shuffle(cands)
        for cand in cands:
            res = yield from Send(paper_claim(cand, key, expires_us))
            if applied(res):
                assert res.item is not None
                return PaperAnswer(resource_from(res.item), True)
            yield Note("conflicts")
    return None


def paper_free_expired(item: ResourceItem, now_us: int, grace_us: int = 0) -> Program[str]:
    """One item of the paper's liberator's scan of the leased index: a lease past its end
    plus ``grace_us`` on this clock is freed on the version read. ``running``, ``freed`` or
    ``lost_race``."""
    if item.key is None or item.lease_expires_us is None:
        return "running"
    if item.lease_expires_us > now_us - grace_us:
        return "running"
    ok = applied((yield from Send(paper_free(item, now_us))))
    return "freed" if ok else "lost_race"


__all__ = ["PaperAnswer", "paper_free_expired", "paper_get_lease"]
