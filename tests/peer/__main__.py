"""``python -m tests.peer``: see tests/peer/runner.py."""

import sys

from tests.peer.runner import main

sys.exit(main())
