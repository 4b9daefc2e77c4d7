"""Whether the paper's agent may write the table: the rollout record. Pure: no I/O.

Theory of operation (the argument is in docs/design.md, "Rollout mode, in the table")
-------------------------------------------------------------------------------------
One meta item, ``#meta``/``rollout``, says whether the table is in *rollout mode*: hosts
running the paper's in-process agent (or its liberator) may write it. Every rasd actor that
writes resource items reads it: the daemons at start-up and with every pool refresh, the jobs
at the start of each run. In rollout mode they keep the rules that are safe beside the
paper's agent (``legacy_agents`` in :class:`rasd.steps.daemon.Daemon`); out of it, the fast
ones. ``rasadmin adopt`` turns it on (before the first rasd host), ``rasadmin end-rollout``
turns it off (refused while a lease of the paper's agent runs), and any actor that finds a
lease of the paper's agent while it is off turns it on again (:func:`paper_lease`). A table
rasd creates has no record: off.

The item carries no ``partition`` and no ``key``, so it is in neither index. Writes are
conditional on the version read, so two writers never undo each other blindly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .lease import META_CLIENT, ResourceItem, fmt_time
from .writes import Cond, ItemKey, Value, Write

ROLLOUT_KEY: ItemKey = (META_CLIENT, "rollout")
ON, OFF = "on", "off"


@dataclass(frozen=True, slots=True)
class Rollout:
    """The record as read (absent: off, version 0)."""

    paper_agents: bool = False
    version: int = 0
    changed: str | None = None
    by: str | None = None
    why: str | None = None


def rollout_from(item: Mapping[str, Value] | None) -> Rollout:
    """The record from its item (None: no record, so no paper's agent)."""
    if item is None:
        return Rollout()
    changed, by, why = item.get("changed"), item.get("by"), item.get("why")
    return Rollout(
        paper_agents=item.get("paper_agents") == ON,
        version=int(item.get("version", 0)),
        changed=None if changed is None else str(changed),
        by=None if by is None else str(by),
        why=None if why is None else str(why),
    )


def set_rollout(on: bool, seen: Rollout, now_us: int, by: str, why: str) -> Write:
    """Turn rollout mode on or off, conditional on the version ``seen`` (absent: no item)."""
    cond = Cond("version", "=", seen.version) if seen.version else Cond("version", "not_exists")
    return Write(
        key=ROLLOUT_KEY,
        conds=(cond,),
        set=(
            ("kind", "rollout"),
            ("paper_agents", ON if on else OFF),
            ("changed", fmt_time(now_us)),
            ("by", by),
            ("why", why),
        ),
        incr=("version",),
        kind="set_rollout",
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


__all__ = [
    "OFF",
    "ON",
    "ROLLOUT_KEY",
    "Rollout",
    "paper_lease",
    "rollout_from",
    "running_paper_lease",
    "set_rollout",
]
