"""``python -m chaos``: see chaos/cli.py."""

from chaos.cli import main

raise SystemExit(main())
