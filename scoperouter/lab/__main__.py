"""``python -m scoperouter.lab up|status|down`` (same as ``scoperouter lab ...``)."""

import sys

from scoperouter.lab.cli import main

sys.exit(main(["lab", *sys.argv[1:]]))
