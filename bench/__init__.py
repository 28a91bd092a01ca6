"""The scoperouter benchmark: ``python -m bench`` (see bench/README.md).

Modules:

* ``federation`` - the generated configs: two clouds on loopback for the router runs, and a
  synthetic catalog of N clouds x 10 services for the routing-decision micro-benchmark;
* ``decision``   - part 2, ``routing.decide`` alone (timeit);
* ``procs``      - starting and stopping the bench's own processes, by PID, even on Ctrl-C;
* ``backend``    - the tiny backend: nginx (from Debian, unpacked, never installed as a service)
  or the asyncio fallback in ``httpserver``;
* ``load``       - the load generator: wrk (installed with apt-get when missing) or the asyncio
  fallback in ``pyload``; both report the same figures;
* ``transfer``   - part 3, 100 MB uploads and downloads with the routers' RSS sampled;
* ``report``     - the table and the JSON;
* ``__main__``   - the command line and the run.
"""
