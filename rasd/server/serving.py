"""What the request paths serve with: :class:`Status`, what the daemon says of itself, and
:class:`Serving`, the store and the roles, handed to the router at once when the store is up."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .hittable import Answer

if TYPE_CHECKING:  # imported at run time by the bring-up, after the socket already serves
    from ..core.lease import Pool
    from ..daemon.acquire import Acquirer
    from ..daemon.cache import LeaseCache
    from ..daemon.coordinator import Coordinator
    from ..daemon.releaser import Releaser
    from ..daemon.reporter import Reporter
    from ..dynamo.store import Store


class Status:
    """What the daemon says of itself, which it changes as it starts and stops and the request
    paths read: ``ready``, why it is ``degraded`` (None: it is not), when it ``started``."""

    __slots__ = ("degraded", "ready", "started")

    def __init__(self) -> None:
        self.ready = False
        self.degraded: str | None = None
        self.started = time.time()

    def degrade(self, why: str) -> None:
        """Not up, and why (DynamoDB unreachable at start, an AWS setting refused)."""
        self.degraded = why

    def serving(self) -> None:
        """Up: ready, and no longer degraded."""
        self.ready = True
        self.degraded = None

    def stopping(self) -> None:
        self.ready = False


@dataclass(frozen=True, slots=True)
class Serving:
    """The store and the roles (the ``coordinator``'s, and those the request paths call), and
    the cache's ``answer`` for the hit: made once the store is up (:meth:`of`)."""

    store: Store
    coordinator: Coordinator
    cache: LeaseCache
    #: (client_id, pool_id) -> Pool: the pool table's dict, read in place
    pools: dict[tuple[str, str], Pool]
    acquirer: Acquirer
    releaser: Releaser
    reporter: Reporter
    answer: Answer

    @classmethod
    def of(cls, store: Store, coordinator: Coordinator) -> Serving:
        co = coordinator
        cache = co.cache
        return cls(store, co, cache, co.pools, co.acquirer, co.releaser, co.reporter, cache.answer)
