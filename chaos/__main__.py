"""``python -m chaos``: see chaos/run.py."""

from chaos.run import main

raise SystemExit(main())
