"""``python -m scoperouter.broker ...``: the same as ``scoperouter broker ...``."""

import sys

from scoperouter.broker.cli import main

sys.exit(main())
