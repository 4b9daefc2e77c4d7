"""What a request heard from DynamoDB: the calls made for it that got an answer.

The store (``rasd.dynamo.store``) appends to :data:`HEARD` each time DynamoDB answers a call,
whatever it said, when the context it runs in keeps one; the router's outage path sets it
around a request, whose acquirer's flight copies the context. A request that heard nothing learnt
nothing of its key. Its own module: the router imports it before the store is loaded.
"""

from __future__ import annotations

from contextvars import ContextVar

#: the monotonic times of the answered calls made for the current request (unset: not kept)
HEARD: ContextVar[list[float] | None] = ContextVar("rasd_heard", default=None)
