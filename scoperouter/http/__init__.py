"""HTTP/1.1 on asyncio and llhttp (``httptools``), for the router's reverse data path.

This package speaks HTTP and knows nothing of routing (it never imports ``scoperouter.router``,
``scoperouter.proxy`` or mitmproxy); the router's logic is handed each request by the server
and sends upstream through the client. One module, one concern, in the way uvicorn
(``protocols/http/``) and aiohttp (``connector.py``) split theirs:

* :mod:`~.heads` - the limits on what a client sends, the checks of a request head (target
  form, ``Host``, transfer codings) and the messages of every refusal;
* :mod:`~.wire` - rendering heads and error answers, hop-by-hop fields, connection tokens,
  chunk framing, idempotent methods (one copy each);
* :mod:`~.flow` - flow control (pause/resume reading, wait for the write buffer), shared by
  both sides;
* :mod:`~.server` - the client connection: requests parsed, bounded, checked, queued and
  handed in order to the application, their deadlines, refusals;
* :mod:`~.request` - a request as the application gets it, its body (back-pressure), the ways
  it fails;
* :mod:`~.upstream` - one connection to an upstream: answers parsed, bounded, relayed;
* :mod:`~.pool` - upstream connections per origin, kept warm toward peer routers, TLS;
* :mod:`~.client` - **one** :func:`~.client.exchange` (take / connect / retry once / head /
  body / final head) for every request the router sends, and the relay of its answer.
"""
