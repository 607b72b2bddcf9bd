"""``python -m enroute_compute --config FILE``."""

import sys

from enroute_compute.main import main

sys.exit(main())
