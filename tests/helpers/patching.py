"""One object's method replaced for a test, without assigning to the object: the method is
patched on its class (``monkeypatch``, undone after the test) and calls ``fake`` for that
object only; every other object of the class runs what it ran before."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def for_one(
    monkeypatch: pytest.MonkeyPatch, obj: object, name: str, fake: Callable[..., Any]
) -> None:
    """``obj.<name>(...)`` calls ``fake(...)`` (a coroutine function for an async method)."""
    cls = type(obj)
    before = getattr(cls, name)

    def method(self: Any, *args: Any, **kw: Any) -> Any:
        if self is obj:
            return fake(*args, **kw)
        return before(self, *args, **kw)

    monkeypatch.setattr(cls, name, method)
