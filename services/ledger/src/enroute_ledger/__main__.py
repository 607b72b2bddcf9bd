"""``python -m enroute_ledger --config FILE``."""

from .main import main

raise SystemExit(main())
