"""The checker's interpreter: the protocol's programs run over the model of the table, one
DynamoDB call a step, each call once per way it can end (:func:`step`,
:func:`write_branches`, :func:`read_branches`, :func:`lww_branches`). docs/checker.md, "What
is modeled" (the interpreter, Store.write's outcomes).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from itertools import permutations
from typing import Any, assert_never, cast

from rasd.core.decide import Outcome
from rasd.core.errors import RasdError, Timeout, Unavailable
from rasd.core.map_builders import read_back
from rasd.core.writes import Write, apply, from_av
from rasd.steps import (
    At,
    DdbCall,
    Delete,
    Done,
    GetItem,
    Join,
    Mono,
    Note,
    Now,
    Program,
    Put,
    QueryAvailable,
    QueryLeased,
    QueryMappings,
    Raised,
    Send,
    Sleep,
    Spawn,
    Together,
    Trace,
    WriteResult,
    advance,
)

from .procs import Proc, replace
from .world import Out, World

#: the errors the model's calls fail with (one instance each: a state is compared by value)
NOT_SENT = Unavailable("not sent (the model's fault)")
UNANSWERED = Timeout("no answer within the deadline (the model's fault)")
READ_FAILED = Unavailable("read failed (the model's fault)")
DEADLINE = Timeout("deadline passed")
_SHARED = (NOT_SENT, UNANSWERED, READ_FAILED, DEADLINE)


def forget_tracebacks() -> None:
    """Drop what the shared errors have been raised through. Each raise of one instance
    adds its frames to the traceback it already carries, and those frames hold the worlds
    they stepped: a search or a swarm that runs long keeps every one of them (a 20-minute
    swarm grew to 23 GB) unless the searches call this now and then."""
    for e in _SHARED:
        e.__traceback__ = None


class _Later:
    """A call's result still to come: its write applied, its reply was lost, its retry was
    refused, and the store's read-back of the item is a step of its own, made later (other
    processes may write the item meanwhile)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "LATER"


LATER = _Later()

DDB_CALLS = (GetItem, QueryMappings, QueryLeased, Send, Together, At, QueryAvailable, Put, Delete)


class FrozenItem(dict[str, Any]):
    """An item as a program is sent it: a dict, hashable by value (never changed, so its
    hash is kept once made)."""

    __slots__ = ("_hash",)
    _hash: int

    def __hash__(self) -> int:  # type: ignore[override]
        try:
            return self._hash
        except AttributeError:
            h = self._hash = hash(tuple(sorted(self.items())))
            return h


def frozen(it: dict[str, Any] | None) -> FrozenItem | None:
    return None if it is None else FrozenItem(it)


class Host:
    """What the model supplies to run a kind of process: where it lives and its effects."""

    def place(self, w: World, old: Proc | None, new: Proc | None) -> None:
        """Put ``new`` where ``old`` was (None: started / ended)."""
        raise NotImplementedError

    def chooses(self, eff: Any) -> bool:
        """Is ``eff`` a step of its own (a choice among results, not a DynamoDB call)?"""
        return False

    def choices(self, w: World, p: Proc, eff: Any) -> list[tuple[str, Any]]:
        """The results such a step may have, labelled."""
        raise NotImplementedError

    def query(self, w: World, p: Proc, eff: Any) -> list[tuple[str, Any]]:
        """A Query's results as the process may read them (replicas may lag), labelled."""
        raise NotImplementedError

    def local(self, w: World, p: Proc, eff: Any) -> Any:
        """Perform a local effect of the host's kind (the daemon's cache, tokens...)."""
        raise TypeError(f"no such effect: {eff!r}")

    def spawn(self, w: World, p: Proc, eff: Spawn) -> None:
        raise TypeError(f"{p.label} cannot spawn")

    def note(self, w: World, p: Proc, eff: Note) -> None:
        """A Note (most are ignored)."""

    def finished(self, w: World, p: Proc, done: Done) -> None:
        """The process ended."""

    def describe(self, eff: Any) -> str:
        """How a read is named in a step's label."""
        return type(eff).__name__

    def written_in(self, w: World, p: Proc, eff: At[Any]) -> str | None:
        """The replica a write ``At(region, ...)`` is made in, when it is not ``region``'s
        own (the driver has no endpoint for ``region``); None: ``region``'s (the model's
        one table, where the write is ordered with that region's own writes)."""
        return None


# ------------------------------------------------------------------------- starting, running
def start(w: World, host: Host, trace: Trace, label: str, **kw: Any) -> None:
    """Start a process: run it through its local effects to its first step effect."""
    p, gen, eff = _advance(Proc(trace, label, started=w.t, **kw), trace.start(), None)
    if isinstance(eff, Done):  # ended before its first effect: never placed
        host.finished(w, p, eff)
        return
    _settle(w, host, None, p, gen, eff)


def _settle(w: World, host: Host, old: Proc | None, p: Proc, gen: Program[Any], eff: Any) -> None:
    """Run ``gen`` (at ``p.trace``, waiting on ``eff``) through its local effects."""
    while not (isinstance(eff, DDB_CALLS) or host.chooses(eff)):
        result: Any
        try:
            result = _local(w, host, p, eff)
        except RasdError as exc:
            result = Raised(exc)
        p, gen, eff = _advance(replace(p, trace=p.trace.then(result)), gen, result)
        if isinstance(eff, Done):
            host.place(w, old, None)
            host.finished(w, p, eff)
            return
    host.place(w, old, replace(p, order=(), partial=(), eff=eff))


def _local(w: World, host: Host, p: Proc, eff: Any) -> Any:
    """A local effect: the ones every program may yield here, the host's kind's by the host."""
    match eff:
        case Now():
            return w.now_us(p.offset)
        case Mono():
            return w.t
        case Sleep() | Join():
            return None
        case Note():
            host.note(w, p, eff)
            return None
        case Spawn():
            host.spawn(w, p, eff)
            return None
        case _:
            return host.local(w, p, eff)


def _send(w: World, host: Host, old: Proc, p: Proc, result: Any) -> None:
    """``result`` is the pending effect's: send it in (replayed) and run on."""
    gen, _ = p.trace.resume()
    assert gen is not None
    p, gen, eff = _advance(replace(p, trace=p.trace.then(result)), gen, result)
    if isinstance(eff, Done):
        host.place(w, old, None)
        host.finished(w, p, eff)
        return
    _settle(w, host, old, p, gen, eff)


def _advance(p: Proc, gen: Program[Any], sent: Any) -> tuple[Proc, Program[Any], Any]:
    """``rasd.steps.advance`` for process ``p`` (whose trace records ``sent`` already): its
    next effect or :class:`Done`. Where the program went on as another (``Tail``), ``p``
    gets a fresh trace of that one: a state holds a loop's arguments, not its history."""
    gen, eff, tail = advance(gen, sent)
    if tail is not None:
        trace = Trace(tail.fn.__qualname__, partial(tail.fn, *tail.args), tail.args)
        p = replace(p, trace=trace)
    return p, gen, eff


# ---------------------------------------------------------------------------- one step
def step(w0: World, host: Host, p: Proc) -> Out:
    """Every way process ``p``'s pending step effect can end, each as (label, world)."""
    eff = p.eff
    out: Out = []
    if p.later is not None:  # a lost reply's read-back, made now
        return _read_back_later(w0, host, p)
    if p.partial or p.order:  # a Together under way: its next call lands
        assert isinstance(eff, Together)
        i = p.order[len(p.partial)]
        late = p.bound and w0.t > p.started + w0.cfg.deadline
        for lab, w, r in _call(w0, host, p, eff.calls[i], late=late):
            q = replace(p, partial=(*p.partial, r))
            if len(q.partial) < len(eff.calls):
                host.place(w, p, q)
            else:
                got = dict(zip(q.order, q.partial, strict=True))
                results = tuple(got[j] for j in range(len(eff.calls)))
                fail = next((r for r in results if isinstance(r, Raised)), None)
                if fail is None and any(r is LATER for r in results):
                    host.place(w, p, replace(q, order=(), partial=(), later=results))
                else:
                    _send(w, host, p, replace(q, order=(), partial=()), fail or results)
            out.append((f"{p.label} {lab}", w))
        return out
    if p.bound and (w0.t > p.started + w0.cfg.deadline or p.calls >= w0.cfg.max_calls):
        w = w0.clone()
        _send(w, host, p, p, _past_deadline(eff))
        return [(f"{p.label} deadline passed", w)]
    p1 = replace(p, calls=p.calls + 1)
    if host.chooses(eff):
        for lab, r in host.choices(w0, p, eff):
            w = w0.clone()
            _send(w, host, p, p1, r)
            out.append((f"{p.label} {lab}", w))
        return out
    if isinstance(eff, Together):
        for order in permutations(range(len(eff.calls))):
            for lab, w, r in _call(w0, host, p1, eff.calls[order[0]]):
                host.place(w, p, replace(p1, order=order, partial=(r,)))
                out.append((f"{p.label} {lab}", w))
        return out
    for lab, w, r in _call(w0, host, p1, eff):
        if r is LATER:
            host.place(w, p, replace(p1, later=(r,)))
        else:
            _send(w, host, p, p1, r)
        out.append((f"{p.label} {lab}", w))
    return out


def _read_back_later(w0: World, host: Host, p: Proc) -> Out:
    """The store reads back the item of each call of ``p`` whose reply was lost after it
    applied (``LATER``), now, whatever was written since, and judges it by the drivers'
    rule (:func:`_readback`); the read may fail (a fault), or come past the deadline."""
    eff = p.eff
    calls = eff.calls if isinstance(eff, Together) else (eff,)
    assert p.later is not None
    late = p.bound and w0.t > p.started + w0.cfg.deadline
    out: Out = []
    for _lab, w, ok in [("read", w0.clone(), False)] if late else read_branches(w0):
        got = []
        for c, r in zip(calls, p.later, strict=True):
            if r is not LATER:
                got.append(r)
                continue
            sent = c.call if isinstance(c, At) else c
            assert isinstance(sent, Send) and sent.readback is not None
            wr = sent.write
            if not ok:
                got.append(WriteResult(Outcome.UNKNOWN, error=UNANSWERED))
                continue
            rep = _readback(w, wr, sent.readback)
            item = frozen(w.get(wr.key)) if rep.outcome is Outcome.APPLIED else None
            got.append(WriteResult(rep.outcome, item, UNANSWERED if rep.error else None))
        result = tuple(got) if isinstance(eff, Together) else got[0]
        _send(w, host, p, replace(p, later=None), result)
        what = "late" if late else ("FAILED" if not ok else "")
        kinds = ", ".join(
            f"{cast(Send, c.call if isinstance(c, At) else c).write.kind} {g.outcome.value.upper()}"
            for c, r, g in zip(calls, p.later, got, strict=True)
            if r is LATER
        )
        out.append((f"{p.label} read back {what + ' ' if what else ''}-> {kinds}", w))
    return out


def _past_deadline(eff: Any) -> Any:
    """What a call returns once the deadline has passed: a write is not sent, a read fails."""
    if isinstance(eff, Send):
        return WriteResult(Outcome.REJECTED, error=DEADLINE)
    if isinstance(eff, Together) and all(isinstance(c, Send) for c in eff.calls):
        return tuple(WriteResult(Outcome.REJECTED, error=DEADLINE) for _ in eff.calls)
    return Raised(DEADLINE)


def _call(
    w0: World, host: Host, p: Proc, eff: Any, late: bool = False
) -> list[tuple[str, World, Any]]:
    """One DynamoDB call's ways to end: (label, world, result or Raised). Every call is
    handled: one added to ``rasd.steps.DdbCall`` without a case here fails mypy."""
    call: DdbCall = eff
    match call:
        case At(call=Send() as sent):  # one table holds every region
            elsewhere = host.written_in(w0, p, call)
            if elsewhere is not None:
                return lww_branches(w0, sent.write, elsewhere)
            return _call(w0, host, p, sent, late)
        case At(call=Put() | Delete() as whole) | (Put() | Delete() as whole):
            return whole_item_branches(w0, whole)
        case Send():
            return _write(w0, call, late)
        case Together():
            raise TypeError("a Together's calls land one at a time (step)")
        case GetItem() | QueryMappings() | QueryLeased() | QueryAvailable() | At():
            return _read(w0, host, p, call)
        case _:
            assert_never(call)


def _write(w0: World, eff: Send, late: bool) -> list[tuple[str, World, Any]]:
    wr = eff.write
    if late:  # sent in time, answered after the deadline: it may still land
        x = w0.clone()
        x.inflight = (*x.inflight, wr)
        res = WriteResult(Outcome.UNKNOWN, error=UNANSWERED)
        return [(f"{wr.kind} answered after the deadline", x, res)]
    out: list[tuple[str, World, Any]] = []
    for lab, w, rep in write_branches(w0, wr, eff.readback):
        if rep is LATER_REPLY:
            out.append((lab, w, LATER))
            continue
        item = frozen(w.get(wr.key)) if rep.outcome is Outcome.APPLIED else None
        error = None
        if rep.error:
            error = UNANSWERED if rep.outcome is Outcome.UNKNOWN else NOT_SENT
        out.append((lab, w, WriteResult(rep.outcome, item, error)))
    return out


def _read(w0: World, host: Host, p: Proc, eff: Any) -> list[tuple[str, World, Any]]:
    """A read (a GetItem, a Query, or one of them in another region's replica)."""
    what = host.describe(eff)
    reads: list[tuple[str, World, Any]] = []
    for lab, w, ok in read_branches(w0):
        if not ok:
            reads.append((f"{lab} {what}", w, Raised(READ_FAILED)))
        elif isinstance(eff, GetItem):
            reads.append((f"{lab} {what}", w, frozen(w.get(eff.key))))
        else:
            views = host.query(w, p, eff)
            for vlab, r in views:
                reads.append((f"{lab} {what}{vlab}", w.clone() if len(views) > 1 else w, r))
    return reads


# ----------------------------------------------------------------- faulty DynamoDB calls
@dataclass(frozen=True)
class Reply:
    outcome: Outcome
    error: bool  # an error (not a condition) decided it (WriteResult.error is not None)


def write_branches(w: World, wr: Write, mine: Any) -> list[tuple[str, World, Reply]]:
    """Every way ``Store.write(wr, mine)`` can end, each with the world after it.

    ok: applied or rejected, answer received. Faults (each costs one of the budget):
    NOT SENT: nothing that could apply was sent (REJECTED with an error); DELAYED/LOST: the
    request is in flight and lands at any later step (at once: a lost reply; never: a lost
    request) while the caller is told UNKNOWN; REPLY LOST, retry rejected, read-back:
    applied, the retry's condition fails, the item is read back with ``mine``; DELAYED,
    retry rejected, read-back: the same while the first attempt is still in flight; applied,
    REPLY LOST, read back later: the read-back is a step of its own (``LATER``), so other
    processes may write the item between the write and it. Read-backs are judged by the
    drivers' rule (:func:`_readback`). Without ``mine`` a retry rejected after a lost reply
    is UNKNOWN, as DELAYED/LOST landing at once is, so it is that branch.
    """
    out: list[tuple[str, World, Reply]] = []
    a = w.clone()
    ok = a.land(wr)
    out.append(
        (
            f"{wr.kind} {'APPLIED' if ok else 'REJECTED'}",
            a,
            Reply(Outcome.APPLIED if ok else Outcome.REJECTED, False),
        )
    )
    if w.faults >= w.cfg.max_faults:
        return out

    def faulty() -> World:
        x = w.clone()
        x.faults += 1
        return x

    kinds = w.cfg.faults
    if "unsent" in kinds:
        x = faulty()
        out.append((f"{wr.kind} NOT SENT", x, Reply(Outcome.REJECTED, True)))
    if "in_flight" in kinds:
        x = faulty()
        x.inflight = (*x.inflight, wr)
        out.append((f"{wr.kind} DELAYED/LOST (in flight)", x, Reply(Outcome.UNKNOWN, True)))
    if mine is None:
        return out
    if "reply_lost" in kinds:
        x = faulty()
        landed = x.land(wr)
        out.append(
            (
                f"{wr.kind} {'applied' if landed else 'rejected'}, REPLY LOST, retry rejected, "
                "read-back",
                x,
                _readback(x, wr, mine),
            )
        )
    if "delayed_retry" in kinds:
        x = faulty()
        x.inflight = (*x.inflight, wr)
        if apply(x.get(wr.key), wr) is None:  # the retry's condition fails now
            out.append((f"{wr.kind} DELAYED, retry rejected, read-back", x, _readback(x, wr, mine)))
    if "read_back_later" in kinds:
        x = faulty()
        if x.land(wr):
            out.append((f"{wr.kind} applied, REPLY LOST, read back later", x, LATER_REPLY))
    return out


#: :func:`write_branches`' reply for a read-back made at a later step (``LATER``)
LATER_REPLY = Reply(Outcome.UNKNOWN, False)


def _readback(x: World, wr: Write, mine: Any) -> Reply:
    """The store's read-back of ``wr`` (``map_builders.read_back``, the drivers' rule):
    APPLIED when the item shows it, REJECTED when it proves it never applied, UNKNOWN (an
    error) otherwise; known-bad T1 takes an item that does not show it as a refusal."""
    cur = x.get(wr.key)
    seen = read_back(wr, cur, mine)
    if seen is None and x.proto.readback_absent_rejects:
        seen = False
    if seen is None:
        return Reply(Outcome.UNKNOWN, True)
    return Reply(Outcome.APPLIED if seen else Outcome.REJECTED, False)


def whole_item_branches(w0: World, eff: Put | Delete) -> list[tuple[str, World, Any]]:
    """A PutItem (``only_new``: conditional on no item under its key) or a DeleteItem:
    answered, or NOT SENT (a fault). The item is written whole, as DynamoDB stores it."""
    kind = "put" if isinstance(eff, Put) else "delete"
    a = w0.clone()
    if isinstance(eff, Delete):
        a.table.pop(eff.key, None)
        ok = True
    else:
        ok = not (eff.only_new and eff.key in a.table)
        if ok:
            a.put(eff.key, {k: _plain(v) for k, v in eff.item.items()})
    item = frozen(a.get(eff.key)) if ok else None
    res = WriteResult(Outcome.APPLIED if ok else Outcome.REJECTED, item)
    out: list[tuple[str, World, Any]] = [(f"{kind} {'APPLIED' if ok else 'REJECTED'}", a, res)]
    if w0.faults < w0.cfg.max_faults and "unsent" in w0.cfg.faults:
        x = w0.clone()
        x.faults += 1
        out.append((f"{kind} NOT SENT", x, WriteResult(Outcome.REJECTED, error=NOT_SENT)))
    return out


def _plain(av: dict[str, Any]) -> Any:
    """An attribute value as the model's items hold it (a fractional number as a string)."""
    n = av.get("N")
    if n is not None and not n.lstrip("-").isdigit():
        return n
    return from_av(av)


def lww_branches(w0: World, wr: Write, replica: str) -> list[tuple[str, World, Any]]:
    """``wr`` made in ``replica``, which is not the item's own region's: its condition is
    checked against that replica's copy, which may still show an earlier version (any the
    lagging index may: the current one or one of ``Config.history`` earlier ones), and
    replication resolves it with the item's own region's writes by last-writer-wins: the
    later write's whole item wins in every replica. So a write whose condition held on a
    stale copy overwrites what the item's region wrote since (a claim). The write may also
    lose to a later write there (the item as it is)."""
    out: list[tuple[str, World, Any]] = []
    cur = w0.table.get(wr.key)
    seen: set[object] = set()
    first: Any = None
    for i, f in enumerate((cur, *w0.hist.get(wr.key, ()))):
        if f in seen:
            continue
        seen.add(f)
        new = apply(None if f is None else dict(f), wr)
        if new is None:
            continue
        first = first or new
        w = w0.clone()
        w.put(wr.key, new)
        behind = "" if i == 0 else f" ({i} behind)"
        lab = f"{wr.kind} in {replica}'s replica{behind} APPLIED, wins by last-writer-wins"
        out.append((lab, w, WriteResult(Outcome.APPLIED, frozen(new))))
    a = w0.clone()
    if out:
        lab = f"{wr.kind} in {replica}'s replica APPLIED, loses by last-writer-wins"
        out.append((lab, a, WriteResult(Outcome.APPLIED, frozen(first))))
    else:
        out.append((f"{wr.kind} in {replica}'s replica REJECTED", a, WriteResult(Outcome.REJECTED)))
    return out


def read_branches(w: World) -> list[tuple[str, World, bool]]:
    """A strongly consistent read: answered (True) or failed (False, a fault)."""
    out = [("read", w.clone(), True)]
    if w.faults < w.cfg.max_faults and "read_failed" in w.cfg.faults:
        x = w.clone()
        x.faults += 1
        out.append(("read FAILED", x, False))
    return out
