"""``python -m enroute_gitproto --config FILE``."""

import sys

from enroute_gitproto.main import main

sys.exit(main())
