"""A process of the model: one program's trace, and what the interpreter keeps beside it.
Plain data, shared by the model's state (:mod:`check.world`) and its interpreter
(:mod:`check.effects`), which import it and not each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rasd.steps import Trace


@dataclass(frozen=True)
class Proc:
    """One process: its program's trace, and what the interpreter keeps beside it."""

    trace: Trace
    label: str  # how its steps are named ("d0 get_lease(k1)", "d0 bg confirm(k1)")
    offset: int = 0  # its clock's offset (ticks)
    started: int = 0  # true tick it began (a bound process's deadline runs from here)
    bound: bool = False  # bound by a request's deadline
    calls: int = 0  # DynamoDB calls made
    order: tuple[int, ...] = ()  # a Together under way: the order its calls land in
    partial: tuple[Any, ...] = ()  # ... and the results of those landed so far
    #: the results of its call (a Send's one, a Together's each) whose read-back is still
    #: to be made: a write whose reply was lost and whose retry was refused, as ``LATER``
    later: tuple[Any, ...] | None = None
    #: the step effect it waits on (its trace's, kept to spare a replay)
    eff: Any = field(default=None, compare=False, repr=False)

    def __hash__(self) -> int:
        # Kept once made: a process that does not step is hashed again in every state that
        # follows, and its trace's results make a deep tuple.
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.trace, self.label, self.offset, self.started, self.bound,
                      self.calls, self.order, self.partial, self.later))  # fmt: skip
            self.__dict__["_hash"] = h
        return h


def replace(p: Proc, **kw: Any) -> Proc:
    """``dataclasses.replace`` for a :class:`Proc`, fast (the checker makes millions)."""
    new = object.__new__(Proc)
    new.__dict__.update(p.__dict__)
    new.__dict__.pop("_hash", None)
    new.__dict__.update(kw)
    return new
