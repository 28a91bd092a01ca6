"""``python -m scoperouter_lab up|status|down`` (same as ``scoperouter lab ...``)."""

import sys

from scoperouter_lab.cli import main

sys.exit(main(["lab", *sys.argv[1:]]))
