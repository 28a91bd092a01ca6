"""``python -m scoperouter.cli``: the console script (how the tests and the bench start routers)."""

import sys

from scoperouter.cli import main

sys.exit(main())
