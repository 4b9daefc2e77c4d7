"""The protocol's steps, written once, with no I/O: the machinery every actor's programs share.

A *program* is a generator that yields effects (:class:`Returns` of their result types) and is
sent back what each returned; :data:`Program` names the effects it may yield. :func:`advance`
steps one for every interpreter: the drivers (:func:`drive`, :func:`drive_sync`) and the
checker's replay of a :class:`Trace`. docs/design.md, "The jobs, written once".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Generic, Self, TypeVar, overload

from ..core.decide import Outcome
from ..core.errors import RasdError
from ..core.lease import Mapping, ResourceItem
from ..core.writes import ItemKey, Value, Write

R = TypeVar("R")
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
A = TypeVar("A")
B = TypeVar("B")
C = TypeVar("C")
E = TypeVar("E")


class Returns(Generic[T_co]):
    """An effect whose result is a ``T_co``. ``x = yield from eff`` yields ``eff`` (as the
    program's own effect, checked against the program's union) and returns what the
    interpreter sent back, typed as ``T_co``: the one step a program takes per result."""

    __slots__ = ()

    def __iter__(self) -> Generator[Self, object, T_co]:
        return (yield self)  # type: ignore[return-value]


class Call(Returns[T_co]):
    """A DynamoDB call (:data:`DdbCall`): what :class:`At` and :class:`Together` take."""

    __slots__ = ()


#: A read-back check for a write whose outcome is unknown (``rasd.core.map_builders.ReadBack``).
ReadBack = Callable[[dict[str, Any]], bool]


# --------------------------------------------------------------------------- DynamoDB calls
@dataclass(frozen=True, slots=True)
class GetItem(Call[dict[str, Value] | None]):
    """One strongly consistent GetItem. Result: the item as a plain dict, or None."""

    key: ItemKey


@dataclass(frozen=True, slots=True)
class QueryMappings(Call[list[Mapping]]):
    """The key's mapping items, every region's (one strongly consistent Query).
    Result: ``list[rasd.core.lease.Mapping]``."""

    client_id: str
    pool_id: str
    key: str


@dataclass(frozen=True, slots=True)
class QueryLeased(Call[list[ResourceItem]]):
    """The leased-resources index's items for the key (eventually consistent: a hint, never
    a decision). Result: ``list[rasd.core.lease.ResourceItem]``."""

    client_id: str
    pool_id: str
    key: str


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What a write returned (:class:`Send`), in every driver: APPLIED (``item`` as
    written, a plain dict), REJECTED (its condition failed, or it was never sent: then
    ``error`` says why), or UNKNOWN (sent, no answer: ``error``)."""

    outcome: Outcome
    #: the item as written (APPLIED), as a plain dict (``rasd.core.writes.item_from_av``)
    item: dict[str, Value] | None = None
    #: why the outcome is not APPLIED, when an error (not a condition) decided it
    error: RasdError | None = None


@dataclass(frozen=True, slots=True)
class Send(Call[WriteResult]):
    """One conditional write. Result: ``rasd.steps.WriteResult`` (outcome, item as written,
    error). A write never raises into the program: an error is an outcome (``UNKNOWN``, or
    ``REJECTED`` with ``error`` set when the table refused it for another reason).
    ``readback`` resolves an unknown outcome by a consistent read, where the driver can."""

    write: Write
    readback: ReadBack | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Together(Call[tuple[object, ...]]):
    """Several calls in one round trip. Result: a tuple of their results, in order. A read
    in it that fails makes the whole effect fail (its error is thrown into the program).
    :func:`together` yields one with each result typed."""

    calls: tuple[DdbCall, ...]


@overload
def together(a: Call[A], b: Call[B], /) -> Generator[Together, object, tuple[A, B]]: ...
@overload
def together(
    a: Call[A], b: Call[B], c: Call[C], /
) -> Generator[Together, object, tuple[A, B, C]]: ...
def together(*calls: Call[object]) -> Generator[Together, object, tuple[object, ...]]:
    """``a, b = yield from together(a, b)``: :class:`Together`, each result typed as its
    call's."""
    return (yield Together(calls))  # type: ignore[arg-type, return-value]


# ------------------------------------------------------------------- the jobs' calls
@dataclass(frozen=True, slots=True)
class At(Call[T]):
    """``call`` (a DynamoDB call above) made in ``region``'s replica rather than the
    program's own: ``ras-dedupe`` and ``rasadmin delete-pool`` write each region's items
    where that region's daemons write them. The driver refuses (throws) a write to a region
    it has no endpoint for; a read there falls back to the driver's own replica. The checker
    reads another region's replica as lagging. Result: ``call``'s."""

    region: str
    call: Call[T]


@dataclass(frozen=True, slots=True)
class Put(Call[WriteResult]):
    """A whole item written with PutItem (a new resource, a pool definition), as DynamoDB
    attribute values. ``only_new``: conditional on no item under its key. Result: a
    ``rasd.steps.WriteResult`` (REJECTED: the key was taken), as for :class:`Send`."""

    key: ItemKey
    item: dict[str, Any] = field(compare=False)
    only_new: bool = False


@dataclass(frozen=True, slots=True)
class Delete(Call[WriteResult]):
    """DeleteItem, unconditional (a pool definition: nothing is claimed through it).
    Result: a ``rasd.steps.WriteResult``."""

    key: ItemKey


@dataclass(frozen=True, slots=True)
class QueryAvailable(Call[list[ResourceItem]]):
    """One page of one sub-partition of the ``available_resources`` index (eventually
    consistent: a claim decides, on its conditions).
    Result: ``list[rasd.core.lease.ResourceItem]``."""

    client_id: str
    pool_id: str
    region: str
    partition: int
    limit: int


#: the effects that are DynamoDB calls (what :func:`in_region` sends to another replica)
CALLS = (GetItem, QueryMappings, QueryLeased, Send, Together, Put, Delete, QueryAvailable)


def in_region(region: str | None, prog: Program[R]) -> Program[R]:
    """``prog`` with every DynamoDB call it makes sent to ``region``'s replica (:class:`At`);
    ``None``: the driver's own. Results and errors pass through unchanged; a :class:`Tail`
    of ``prog`` goes on inside, in ``region`` too."""
    if region is None:
        return (yield from prog)
    sent: object = None
    while True:
        prog, eff, _ = advance(prog, sent)
        if isinstance(eff, Done):
            if eff.error is not None:
                raise eff.error
            return eff.value  # type: ignore[no-any-return]
        try:
            sent = yield At(region, eff) if isinstance(eff, CALLS) else eff
        except RasdError as exc:
            sent = Raised(exc)


# ------------------------------------------------------------------------------ local
@dataclass(frozen=True, slots=True)
class Now(Returns[int]):
    """The wall clock. Result: microseconds since the epoch."""


@dataclass(frozen=True, slots=True)
class Mono(Returns[float]):
    """The monotonic clock. Result: seconds (float)."""


@dataclass(frozen=True, slots=True)
class Sleep(Returns[None]):
    """Wait. ``bounded``: within the request's deadline (the driver throws
    ``rasd.core.errors.Timeout`` if the deadline would pass first). Result: None."""

    seconds: float
    bounded: bool = True


@dataclass(frozen=True, slots=True)
class Spawn(Returns[object]):
    """Start ``fn(*args)`` (a program function) as a task of its own, not bound to this
    request. Result: a handle that :class:`Join` takes (the driver's task, the checker's
    process). The arguments are values (hashable): the checker keeps them in its states."""

    fn: Callable[..., AnyProgram[Any]]
    args: tuple[Any, ...] = ()

    def trace(self) -> Trace:
        fn, args = self.fn, self.args
        return Trace(fn.__qualname__, lambda: fn(*args), args)


@dataclass(frozen=True, slots=True)
class Join(Returns[None]):
    """Wait for a spawned program, at most until the deadline. Result: None."""

    handle: Any = field(compare=False)


@dataclass(frozen=True, slots=True)
class Tail(Returns[R]):
    """What remains of this program, and of every program that ``yield from``s it (each
    returning what it returns), is ``fn(*args)``: a loop's next round as a call. A driver
    goes on with the new program; the checker keeps a loop's state as its arguments rather
    than as the history of its earlier rounds. Result: none (the program is left)."""

    fn: Callable[..., AnyProgram[R]]
    args: tuple[Any, ...] = ()


def goto(
    fn: Callable[..., Generator[E, object, R]], *args: Any
) -> Generator[E | Tail[R], object, R]:
    """``return (yield from goto(fn, *args))``: end this program as ``fn(*args)`` ends
    (a :class:`Tail`, typed; the program may yield what ``fn``'s may)."""
    return (yield from Tail(fn, args))


@dataclass(frozen=True, slots=True)
class Note(Returns[None]):
    """Something worth counting or logging (a counter name, and log fields). Result: None.
    The checker ignores notes."""

    event: str
    fields: tuple[tuple[str, object], ...] = ()
    level: str = ""  # "", "warning" or "error": log it too


# --------------------------------------------------------------------------- interpreters
@dataclass(frozen=True, slots=True)
class Raised:
    """A failed effect's result: :func:`advance` throws ``error`` into the program (a
    trace records a failure as one)."""

    error: RasdError


@dataclass(frozen=True, slots=True)
class Done:
    """A program that has ended: what it returned, or the error it raised."""

    value: Any = None
    error: BaseException | None = None


#: A program of any actor, as the interpreters step it (each driver's entry point takes its
#: own actor's kind, :data:`Program` or ``DaemonProgram``, and performs that kind's union).
AnyProgram = Generator[Any, object, R]
#: What :func:`advance` returns: the program now running, its next effect (or
#: :class:`Done`), and the last :class:`Tail` it followed (None: the same program goes on).
Stepped = tuple[AnyProgram[Any], Any, Tail[Any] | None]


def advance(prog: AnyProgram[Any], sent: object = None) -> Stepped:
    """Send ``sent`` into ``prog`` (throw its error, for a :class:`Raised`) and run it to
    its next effect: the one stepping loop every driver and the checker use.

    A :class:`Tail` is followed at once: the program is closed and ``fn(*args)`` goes on,
    started with None, and the returned :class:`Tail` says so (the checker starts a fresh
    trace there). A program that returns ends as ``Done(value)``; one that raises a
    :class:`rasd.core.errors.RasdError` ends as ``Done(error=...)``, and a driver raises it
    to its own caller. Any other exception propagates, as a bug."""
    tail: Tail[Any] | None = None
    while True:
        try:
            eff = prog.throw(sent.error) if type(sent) is Raised else prog.send(sent)
        except StopIteration as stop:
            return prog, Done(stop.value), tail
        except RasdError as exc:
            return prog, Done(error=exc), tail
        if type(eff) is not Tail:
            return prog, eff, tail
        prog.close()
        tail, prog, sent = eff, eff.fn(*eff.args), None


def drive_sync(prog: AnyProgram[R], perform: Callable[[Any], object]) -> R:
    """Run ``prog`` to its end, performing each effect with ``perform`` (blocking). A
    :class:`rasd.core.errors.RasdError` that ``perform`` raises is thrown into the program;
    one the program raises is raised here."""
    prog, eff, _ = advance(prog)
    while not isinstance(eff, Done):
        try:
            sent: object = perform(eff)
        except RasdError as exc:
            sent = Raised(exc)
        prog, eff, _ = advance(prog, sent)
    if eff.error is not None:
        raise eff.error
    return eff.value  # type: ignore[no-any-return]


async def drive(prog: AnyProgram[R], perform: Callable[[Any], Awaitable[object]]) -> R:
    """Run ``prog`` to its end, awaiting ``perform`` for each effect (the daemon's driver);
    errors as in :func:`drive_sync`."""
    prog, eff, _ = advance(prog)
    while not isinstance(eff, Done):
        try:
            sent: object = await perform(eff)
        except RasdError as exc:
            sent = Raised(exc)
        prog, eff, _ = advance(prog, sent)
    if eff.error is not None:
        raise eff.error
    return eff.value  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Trace:
    """A program as the checker keeps it: how to start it and what it has been sent.

    ``start()`` must build a fresh generator each time (a ``functools.partial`` of a
    program function and its arguments); ``sent`` holds one result per effect performed
    (a :class:`Raised` for a failure). Two traces of one program with equal results are the
    same process state, so a trace is compared by ``(name, args, sent)``."""

    name: str
    start: Callable[[], AnyProgram[Any]] = field(compare=False, hash=False, repr=False)
    args: tuple[Any, ...] = ()
    sent: tuple[Any, ...] = ()

    def resume(self) -> tuple[AnyProgram[Any] | None, Any]:
        """Replay the results sent so far (:func:`advance`). Returns the live generator and
        the effect it is waiting on, or ``(None, Done(...))`` if it has ended."""
        gen, eff, _ = advance(self.start())
        for r in self.sent:
            if isinstance(eff, Done):
                break
            gen, eff, _ = advance(gen, r)
        return (None, eff) if isinstance(eff, Done) else (gen, eff)

    def then(self, result: Any) -> Trace:
        """This program after its pending effect returned ``result``."""
        return Trace(self.name, self.start, self.args, (*self.sent, result))


#: The effects every driver knows: DynamoDB's calls, the clock, notes, spawning. A driver
#: dispatches with ``match`` ending in ``assert_never``, so one that lacks a handler fails
#: mypy (the daemon's own effects are :data:`rasd.steps.daemon.DaemonEffect`).
DdbCall = (
    GetItem
    | QueryMappings
    | QueryLeased
    | QueryAvailable
    | Send
    | Together
    | At[Any]
    | Put
    | Delete
)
Common = DdbCall | Now | Mono | Sleep | Note | Spawn | Join
#: What a program of the jobs (and the steps every actor shares) yields: :data:`Common`, and
#: :class:`Tail` (which :func:`advance` follows, so no driver performs it). The daemon's
#: programs are :data:`rasd.steps.daemon.DaemonProgram`, which adds the daemon's own effects.
Effect = Common | Tail[Any]
#: A program: yields effects of :data:`Effect` only, is sent their results (typed by
#: ``yield from`` each effect, :class:`Returns`), returns its answer.
Program = Generator[Effect, object, R]
