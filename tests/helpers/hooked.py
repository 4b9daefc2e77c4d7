"""A daemon's DynamoDB client with a hook in front of every call: what a scenario test uses to
make another actor's write land between two of the daemon's."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

Hook = Callable[[str, dict[str, Any], Any], Awaitable[Any]]


class Hooked:
    """Wraps the client; ``hook(method, kw, real)`` decides what a call does."""

    def __init__(self, inner: Any, hook: Hook) -> None:
        self._inner, self._hook = inner, hook

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._inner, name)
        if not callable(real) or name.startswith("_"):
            return real

        async def call(**kw: Any) -> Any:
            return await self._hook(name, kw, real)

        return call
