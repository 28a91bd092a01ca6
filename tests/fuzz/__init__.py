"""The router's HTTP layer under fuzzed input, with HAProxy beside it (``python -m tests.fuzz``).

Raw request bytes (heads, bodies, trailers, pipelined requests, stalls; mutations in the style
of public request-smuggling material) go to real router processes in front of recording
backends, and the same bytes to HAProxy in front of another. What must always hold
(:mod:`~.check`):

* nothing reaches a backend that routing and the access log did not see: every request a
  backend receives has the access-log line of its request id, with its method and path; no
  field of a trailer or a body ever arrives in a head (canary fields);
* every connection is answered or closed within its deadline;
* every answer the router makes itself is OpenStack JSON with its status;
* no traceback and no error in any router log; the workers' memory back to its level.

How HAProxy treats the same bytes is reported beside (forwarded by both, refused by both,
refused by the router only, forwarded by the router only), with examples.

That is the ``raw`` family; three more run after it, each with its own invariants and a minimum
number of inputs (:mod:`.families`): ``tunnel`` (the same bytes inside TLS tunnels the forward
proxy intercepts, :mod:`.tunnel`), ``scope`` (``&``/``|`` scopes on list reads: backend
requests per client request at most the distinct clouds named, memory back to its level,
:mod:`.scopes`) and ``osb`` (hostile parameters at a broker running an Ansible pack: no
template evaluated, no canary file, :mod:`.osb`).
"""
