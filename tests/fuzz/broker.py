"""``python -m tests.fuzz.broker --config F``: ``scoperouter broker serve`` as shipped, with the
test pack's clouds (:class:`tests.broker.ansible_harness.PackClouds`: a clouds.yaml for the
runs, no call to any cloud) in place of the federation's: the OSB API, the worker threads,
the database and ansible-runner are the real ones."""

from __future__ import annotations

import sys

from scoperouter.broker import runtime
from scoperouter.broker.cli import main
from tests.broker.ansible_harness import PackClouds

if __name__ == "__main__":
    runtime.make_clouds = lambda config: PackClouds()  # type: ignore[assignment,return-value]
    sys.exit(main(["serve", *sys.argv[1:]]))
