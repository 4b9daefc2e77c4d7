"""``python -m rasd_jobs.admin``: rasadmin."""

from __future__ import annotations

from .cli import main

raise SystemExit(main())
