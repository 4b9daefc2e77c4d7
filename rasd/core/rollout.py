"""Whether the paper's agent may write the table: the rollout record. Pure: no I/O.

Theory of operation (the argument is in docs/design.md, "Rollout mode, in the table")
-------------------------------------------------------------------------------------
One meta item, ``#meta``/``rollout``, says whether the table is in *rollout mode*: hosts
running the paper's in-process agent (or its liberator) may write it. Every rasd actor that
writes resource items reads it: the daemons at start-up and with every pool refresh, the jobs
at the start of each run. In rollout mode they keep the rules that are safe beside the
paper's agent (``legacy_agents`` in :class:`rasd.steps.daemon.DaemonContext`); out of it, the fast
ones. ``rasadmin adopt`` turns it on (before the first rasd host), ``rasadmin end-rollout``
turns it off (:func:`on_end`: refused while a lease of the paper's agent is in the table, and
not before every answer that agent may have given has ended), and any actor that finds a
lease of the paper's agent while it is off turns it on again (:func:`paper_lease`). A table
rasd creates has no record: off.

The jobs and rasadmin write the record; a daemon never writes ``#meta``. A daemon that finds
a lease of the paper's agent raises a *signal* instead, ``#hosts``/``paper-lease``, whose
version grows with each raise (:func:`raise_signal`). The record keeps the signal's version
it last turned off at (``seen_cleared``); a signal newer than that turns the mode on for
every reader (:func:`rollout_from` reads both items), as the record's own flag does.

The item carries no ``partition`` and no ``key``, so it is in neither index. Writes are
conditional on the version read, so two writers never undo each other blindly.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .lease import HOSTS_CLIENT, META_CLIENT, ResourceItem, fmt_time, parse_time
from .writes import Cond, ItemKey, Value, Write

ROLLOUT_KEY: ItemKey = (META_CLIENT, "rollout")
#: the daemons' signal that they saw a lease of the paper's agent (read with the record)
SIGNAL_KEY: ItemKey = (HOSTS_CLIENT, "paper-lease")
ON, OFF = "on", "off"


@dataclass(frozen=True, slots=True)
class Rollout:
    """The record and the signal as read (absent: off, version 0). ``paper_agents``: rollout
    mode is on, by the record's flag or by a signal raised since the record last turned off."""

    paper_agents: bool = False
    version: int = 0
    #: the signal's version as read, and the one the record last turned off at
    signal: int = 0
    cleared: int = 0
    changed: str | None = None
    by: str | None = None
    why: str | None = None
    #: set by ``end-rollout`` (:func:`on_end`): it turns the record off no earlier than this
    ends_at: str | None = None

    @property
    def ends_at_us(self) -> int | None:
        return None if self.ends_at is None else parse_time(self.ends_at)


def rollout_from(
    item: Mapping[str, Value] | None, signal: Mapping[str, Value] | None = None
) -> Rollout:
    """The record from its item and the signal's (None: absent; no record and no signal: no
    paper's agent)."""
    raised = 0 if signal is None else int(signal.get("version", 0))
    if item is None:
        return Rollout(paper_agents=raised > 0, signal=raised)
    changed, by, why = item.get("changed"), item.get("by"), item.get("why")
    ends_at = item.get("ends_at")
    cleared = int(item.get("seen_cleared", 0))
    return Rollout(
        paper_agents=item.get("paper_agents") == ON or raised > cleared,
        version=int(item.get("version", 0)),
        signal=raised,
        cleared=cleared,
        changed=None if changed is None else str(changed),
        by=None if by is None else str(by),
        why=None if why is None else str(why),
        ends_at=None if ends_at is None else str(ends_at),
    )


def set_rollout(
    on: bool, seen: Rollout, now_us: int, by: str, why: str, ends_at_us: int | None = None
) -> Write:
    """Turn rollout mode on or off, conditional on the version ``seen`` (absent: no item);
    ``ends_at_us``: on, and ``end-rollout`` marked when it may turn it off (every other
    write of the record removes the mark). Off clears the signal as read: a daemon's raise
    after that read leaves the mode on."""
    assert ends_at_us is None or on
    cond = Cond("version", "=", seen.version) if seen.version else Cond("version", "not_exists")
    if not on:
        extra: tuple[tuple[str, Value], ...] = (("seen_cleared", seen.signal),)
    else:
        extra = () if ends_at_us is None else (("ends_at", fmt_time(ends_at_us)),)
    return Write(
        key=ROLLOUT_KEY,
        conds=(cond,),
        set=(
            ("kind", "rollout"),
            ("paper_agents", ON if on else OFF),
            ("changed", fmt_time(now_us)),
            ("by", by),
            ("why", why),
            *extra,
        ),
        remove=() if ends_at_us is not None else ("ends_at",),
        incr=("version",),
        kind="set_rollout",
    )


def raise_signal(seen: Rollout, now_us: int, by: str, why: str) -> Write:
    """A daemon saw a lease of the paper's agent while the mode was off: a new version of the
    signal (conditional on the version ``seen``), which every reader takes as on until the
    record is next turned off."""
    cond = Cond("version", "=", seen.signal) if seen.signal else Cond("version", "not_exists")
    return Write(
        key=SIGNAL_KEY,
        conds=(cond,),
        set=(("kind", "paper_lease"), ("changed", fmt_time(now_us)), ("by", by), ("why", why)),
        incr=("version",),
        kind="raise_signal",
    )


def paper_lease(r: ResourceItem) -> bool:
    """Is ``r`` held by a lease rasd did not make (the paper's agent's)? Every rasd write to
    a held item keeps ``holder`` current (``hver`` = ``version``); the paper's agent writes
    none, and its writes leave an earlier holder stale."""
    return r.key is not None and not r.holder_current


def running_paper_lease(r: ResourceItem, now_us: int, grace_us: int) -> bool:
    """A lease of the paper's agent that apps may still use: held, not rasd's, and not past
    its end plus ``grace_us`` (the paper's agent answers it to its end)."""
    return (
        paper_lease(r) and r.lease_expires_us is not None and r.lease_expires_us + grace_us > now_us
    )


def answers_end(items: Iterable[ResourceItem], grace_us: int) -> int:
    """The latest time an answer given so far from these items (the whole table) may still
    be in use: every held item's end plus ``grace_us`` (0: none held). The paper's agent
    answers whatever the leased index shows, rasd's leases and claims included, to the end
    it read; a held item's end only moves later while it stays held, and every free made in
    rollout mode keeps the item unclaimable to its lease's end (``decide.holds_to_end``)."""
    ends = [r.lease_expires_us for r in items if r.key is not None and r.lease_expires_us]
    return max(ends, default=-grace_us) + grace_us


class End(enum.Enum):
    """What ``rasadmin end-rollout`` does (:func:`on_end`)."""

    #: a lease of the paper's agent is in the table: the agent still writes, or its leases
    #: have not been freed; nothing turns off (and a mark is removed)
    REFUSE = "refuse"
    #: no lease of the paper's agent, but an answer it gave may still be in use: mark the
    #: record with that answer's end, keep it on, and turn it off at a run after the mark
    MARK = "mark"
    #: marked, and the mark is still ahead
    WAIT = "wait"
    #: every answer of the paper's agent has ended: turn the record off
    TURN_OFF = "turn_off"


def on_end(paper_found: bool, seen: Rollout, answers_until_us: int, now_us: int) -> End:
    """``end-rollout``'s decision, from its scan of the table (``paper_found``: an item holds a
    lease of the paper's agent, :func:`paper_lease`; ``answers_until_us``: :func:`answers_end`
    of the scan) and the record ``seen`` (on).

    Out of rollout mode an early free needs the quarantine only, which is safe only if no
    app uses the lease: an answer of the paper's agent runs to its end however rasd frees
    the lease after (a lease it made that rasd adopted, or a lease of rasd's it found by the
    key). The operator stops the agent's hosts first (so it makes no answer after this
    run), and the record stays on until every end the table shows now has passed. A mark
    from an earlier run stands: the table it scanned bounded every answer then, and
    none was made since."""
    if paper_found:
        return End.REFUSE
    ends = seen.ends_at_us
    if ends is None:
        return End.TURN_OFF if answers_until_us <= now_us else End.MARK
    return End.TURN_OFF if ends <= now_us else End.WAIT


__all__ = [
    "OFF",
    "ON",
    "ROLLOUT_KEY",
    "SIGNAL_KEY",
    "End",
    "Rollout",
    "answers_end",
    "on_end",
    "paper_lease",
    "raise_signal",
    "rollout_from",
    "running_paper_lease",
    "set_rollout",
]
