"""``rasadmin``: create the table, define pools, add/list/show/release/delete resources, stats.

Listings print a human table, or one JSON document with ``--json``. Commands that change the
table print a one-line JSON summary on stdout. Logs and progress go to stderr (the progress
line only when stderr is a terminal). Exit 0 done, 1 failed, refused or not found, 2 bad
usage, names or settings (docs/operations.md has each command's).

Read-only commands (list-*, show-*, stats) cover every region unless ``--region`` is given on
the command line; ``RASD_REGION`` is not applied to them as a filter. Commands that write a
region's items (add-resources, release-resource, delete-resource) need the region:
``--region`` or ``RASD_REGION``, and write only that region's items (in a global table an item
is written in its own region's replica, where its daemons' claims are ordered with the write);
``delete-pool`` writes other regions' items through ``--peer-endpoint``.

Every command keeps I1 (docs/design.md): nothing it frees, deletes or adds is claimable while a
lease or quarantine on that resource may still run. A release is held to the lease's end (no
app released it); a delete leaves a tombstone holding the name until the lease or quarantine
it had runs out, and a re-add of the name waits for it (``rasd.core.builders.tombstone``/``readd``).

The commands are :mod:`.pools`' (the table and pools), :mod:`.resources`' and :mod:`.stats`';
:mod:`.reads` reads what they act on and :mod:`.listing` prints it; :mod:`.cli` is the parser.
``adopt`` and ``rollout`` are :mod:`rasd_jobs.adopt`'s and :mod:`rasd_jobs.rollout`'s.
"""

from __future__ import annotations

from .cli import main

__all__ = ["main"]
