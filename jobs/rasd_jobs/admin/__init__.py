"""``rasadmin``: create the table, define pools, add/list/show/release/delete resources, stats.

The commands are :mod:`.pools`' (the table and pools), :mod:`.resources`' and :mod:`.stats`';
:mod:`.reads` reads what they act on and :mod:`.listing` prints it; :mod:`.cli` is the parser.
``adopt`` and ``rollout`` are :mod:`rasd_jobs.adopt`'s and :mod:`rasd_jobs.rollout`'s. Each
command, its output, regions and exit status: docs/operations.md, "rasadmin"; why none frees
anything early: docs/design.md, "Arguments, interleaving by interleaving" (admin commands).
"""

from __future__ import annotations

from .cli import main

__all__ = ["main"]
