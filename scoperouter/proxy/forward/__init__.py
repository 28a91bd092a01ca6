"""The forward proxy (``HTTP_PROXY`` of a cloud's services), on mitmproxy.

The only part of the router that imports mitmproxy: :mod:`~.engine` (the embedded master),
:mod:`~.addon` (its hooks calling the router's pipeline), :mod:`~.timeouts` (connect and
response timeouts of its upstream connections) and :mod:`~.mitm` (every use of mitmproxy's
internals, with its contract test).
"""
