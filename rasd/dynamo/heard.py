"""What a request heard from DynamoDB (:data:`HEARD`): the calls made for it that got an answer,
for the outage path (docs/design.md, "An outage budget"). Its own module: the router imports
it before the store is loaded.
"""

from __future__ import annotations

from contextvars import ContextVar

#: the monotonic times of the answered calls made for the current request (unset: not kept)
HEARD: ContextVar[list[float] | None] = ContextVar("rasd_heard", default=None)
