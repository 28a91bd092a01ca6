"""The router's logic, engine-neutral: it imports neither an HTTP library (``scoperouter.http``,
httptools) nor mitmproxy nor the processes (``scoperouter.proxy``), which call it.

* :mod:`~.pipeline` - the one order every request goes through (facts, decide, breaker, token
  swap, send or combine, failure answer, catalog region, access log and metrics);
* :mod:`~.config` - the federation config and this router's cloud, reload;
* :mod:`~.listeners` - where the router listens (frontends, forward proxy, peer link);
* :mod:`~.state` - what the router remembers of one request, and its request id;
* :mod:`~.health` - the circuit breaker per upstream;
* :mod:`~.tokens` - a local service's token carried to another cloud;
* :mod:`~.failures` - the wording of each failure;
* :mod:`~.region` - token validations another cloud answered, given this cloud's region;
* :mod:`~.combined`, :mod:`~.fanout` - ``A & B`` and ``A | B``, given a way to send;
* :mod:`~.targets` - the URLs routing makes, taken apart;
* :mod:`~.accesslog`, :mod:`~.metrics`, :mod:`~.logs` - one line and one count per request,
  the Prometheus metrics, the JSON log format.
"""
