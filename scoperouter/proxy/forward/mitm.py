"""Every use of mitmproxy internals, in one place (mitmproxy 11.0.2 and 12.3.1: what differs
between them is in :mod:`~scoperouter.proxy.forward.compat`): the forward proxy's.

The forward proxy's adapter uses mitmproxy's public addon API only (options, hooks, flows, the
connection objects they carry). What that API cannot do is here, each item with the reason and
the internal it relies on; ``tests/unit/test_mitm_contract.py`` checks every one of them against
the installed mitmproxy, so an upgrade that changes one fails loudly there, not in production.

1. **Error pages** (:func:`install`, :func:`set_error_response`, :func:`error_page`). mitmproxy
   answers failures it detects itself (refused connection, invalid response...) with an HTML
   page from ``proxy.layers.http._http1.make_error_response(status, message)``; an addon cannot
   change it (a ``flow.response`` set in the ``error`` hook is ignored on that path). It is
   replaced by :func:`render_error`, which answers keystone's JSON error format. The ``error``
   hook gives the per-flow status and message with :func:`set_error_response`; that hook and the
   renderer run in the *same asyncio task* (``HttpStream.handle_protocol_error`` yields the
   blocking ``HttpErrorHook``; the connection handler runs it in a hook task that, once the hook
   returns, feeds ``HookCompleted`` back to the layers in that same task, and the layers then
   send the ``ResponseProtocolError`` to ``Http1Server``, which calls the renderer). So the
   hand-over is a :class:`contextvars.ContextVar`, used at most once and only for the message
   of the flow it was made for.
2. **The request head and body** (:mod:`~scoperouter.proxy.forward.guard`, its own module for
   its size; this module's contract test checks it with the rest). mitmproxy's HTTP/1 server
   reads a request head of any size, at any speed (its code says ``FIXME: protect against
   header size DoS``), answers malformed heads with its own text, waits for a body forever, and
   raises ``NotImplementedError`` on a chunked body's trailer fields (the connection then hangs
   unanswered). The guarded server, put in its place in ``proxy.layers.http`` (where
   ``HttpLayer`` looks it up by name), enforces :class:`~scoperouter.catalog.Limits` (431, 414,
   408), refuses control characters and obs-fold in the head and every framing problem
   mitmproxy's header validation finds (400, our message, before any hook: these are the
   client's errors), drops trailer fields (bounded like a head: 431), answers a body that stops
   arriving with 408 (``body_timeout``), closes idle keep-alive connections, and reports every
   refusal of a head so each one is logged and counted (a failed body is the flow's error: its
   hook logs it). Timers are mitmproxy's own ``RequestWakeup`` commands: at most one per
   connection, re-armed only when it fires.
3. **Upstream connections** (:func:`connecting_task`, :func:`abort_upstream`). mitmproxy has no
   connect timeout (mitmproxy issue #1095) and no way to abort one upstream connection. The
   ``server_connect`` hook is awaited inline by ``ConnectionHandler.open_connection``, inside the
   task that then calls ``asyncio.open_connection``: cancelling that task while
   ``timestamp_tcp_setup`` is unset fails the connect cleanly. An established upstream is
   aborted through the ``proxyserver`` addon's table of connection handlers and their
   transports; the HTTP layer then sees the server close before a response (the error path).
4. **Listening sockets** (:func:`use_listen_sockets`). mitmproxy binds its listeners itself;
   router workers must accept on sockets their supervisor bound (``SO_REUSEPORT``, one per
   worker, kept open across a worker's restart). ``AsyncioServerInstance.listen`` is wrapped to
   serve a registered socket for its address.
5. **The master** (:func:`quiet_master`, :func:`fast_hooks`). ``Master`` copies every log
   record into a deprecated ``add_log`` event no addon here uses (~18 us per log line). Its
   ``AddonManager`` sends every event to every addon (a context manager, a coroutine and a
   ``getattr`` through two generators each, whether or not the addon has the hook), and after
   each event about a flow an ``update`` event nobody here handles: about 15 us per event with
   four addons, a hundred per request. :class:`FastAddonManager` calls, per event, only the
   hooks that exist (found once per event name, found again when addons change), with the same
   error isolation (``safecall``) and ``AddonHalt``.
6. **Messages** mitmproxy puts in ``flow.error`` (:func:`client_went_away`,
   :func:`client_protocol_error`): how the router tells the client's faults from upstream ones;
   a failed certificate check upstream, worded as the reverse path words it
   (:func:`upstream_reason`).
7. **Intercepted TLS** (:class:`InterceptingTlsConfig`). mitmproxy's ``TlsConfig`` addon makes
   the certificate a client's handshake is answered with in ``get_cert`` (from its own CA in
   ``confdir``, whose key it also uses as every certificate's key, in a cache of 100 entries
   evicted first in, first out). The router's subclass answers with its own
   (:mod:`~scoperouter.proxy.forward.intercept`: the cloud's ``proxy.ca``, a key of the
   worker's, an LRU, catalog hosts only); a handshake that is not in a tunnel to a catalog
   destination (TLS sent to the proxy itself, or a destination a reload removed) gets
   mitmproxy's own, from the CA it made in the worker's private directory, which nobody
   trusts (as without interception). Everything else (ciphers, ALPN, the upstream side)
   stays mitmproxy's.
8. **What a tunnel carries** (:func:`could_be_tls`, :func:`refuse_layer`). After a ``CONNECT``
   mitmproxy asks the ``next_layer`` hook which protocol follows; its ``NextLayer`` addon
   takes anything that is not TLS for HTTP, whose head the guarded server then waits for
   (bytes without a line end: a 408 after ``header_timeout``). The adapter's hook runs before
   that addon (the engine adds it first): bytes that cannot begin a TLS record get
   :func:`refuse_layer` at once (a layer answering the router's JSON error and closing, its
   refusal logged and counted like a refused head), and the first bytes of a TLS record not
   yet long enough to tell (fewer than 3) stop the addons there (``AddonHalt``): the decision
   waits for the next bytes, as mitmproxy's ``NextLayer`` asks again on each.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import socket
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from mitmproxy import addonmanager, certs, ctx, exceptions, hooks, http, tls
from mitmproxy import flow as mflow
from mitmproxy.addons import tlsconfig
from mitmproxy.connection import Client, Server
from mitmproxy.master import Master
from mitmproxy.net import tls as net_tls
from mitmproxy.proxy import commands, events, layer, mode_servers
from mitmproxy.proxy import layers as proxy_layers
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.layers.http import _http1

from scoperouter.proxy.forward import guard

logger = logging.getLogger("scoperouter")
_access = logging.getLogger("scoperouter.access")

# --------------------------------------------------------------------------- 1. error pages

_original_renderer = _http1.make_error_response


@dataclass(slots=True)
class _Pending:
    message: str  # the mitmproxy error message the renderer will be called with
    status: int | None  # None: keep mitmproxy's status
    text: str  # our message for the JSON body
    used: bool = False


_pending: contextvars.ContextVar[_Pending | None] = contextvars.ContextVar(
    "scoperouter_pending_error", default=None
)


def set_error_response(flow: http.HTTPFlow, status: int | None, message: str) -> None:
    """Answer this flow's error with `status` (None: mitmproxy's) and `message`.

    Call from the ``error`` hook only; it applies to the error response mitmproxy is about to
    render for this flow, if any.
    """
    if flow.error is not None:
        _pending.set(_Pending(flow.error.msg, status, message))


def render_error(status_code: int, message: str = "") -> bytes:
    """Drop-in replacement for ``_http1.make_error_response``: an OpenStack JSON error.

    An error mitmproxy answers before any hook saw the request (e.g. a forward-proxy request
    without a host) is logged here, so that every answer has its access line."""
    try:
        status, text = status_code, message
        pending = _pending.get()
        if pending is not None and not pending.used and pending.message == message:
            pending.used = True
            status = pending.status or status_code
            text = pending.text
        else:
            _access.info(
                "- - %s",
                status,
                extra={"fields": {"status": status, "decision": "refused", "reason": text[:160]}},
            )
        return guard.error_page(status, text or "the router could not complete the request")
    except Exception:  # pragma: no cover - an error page must always come out
        logger.exception("rendering an error response failed")
        return _original_renderer(status_code, message)


def install() -> None:
    """Put the router's pieces into mitmproxy (idempotent): JSON error pages, the guarded
    HTTP/1 server, listening on registered sockets."""
    _http1.make_error_response = render_error
    proxy_layers.http.Http1Server = guard.GuardedHttp1Server  # type: ignore[attr-defined]
    mode_servers.AsyncioServerInstance.listen = _listen  # type: ignore[method-assign]


def uninstall() -> None:
    _http1.make_error_response = _original_renderer
    proxy_layers.http.Http1Server = _http1.Http1Server  # type: ignore[attr-defined]
    mode_servers.AsyncioServerInstance.listen = _original_listen  # type: ignore[method-assign]


# --------------------------------------------------------------------------- 3. upstreams

CONNECT_TIMEOUT_MESSAGE = "scoperouter: connect timeout"
"""The connection error of a connect attempt cancelled by the router's connect timeout."""


def connecting_task() -> asyncio.Task[Any] | None:
    """From the ``server_connect`` hook: the task that is about to open the connection."""
    return asyncio.current_task()


def cancel_connect(task: asyncio.Task[Any]) -> None:
    """Fail a connect still waiting for its TCP handshake (from :func:`connecting_task`)."""
    task.cancel(CONNECT_TIMEOUT_MESSAGE)


def abort_upstream(client: Client, server: Server) -> bool:
    """Abort an upstream connection of `client`'s handler; False when not possible right now.

    An established transport is aborted (the reader sees EOF and mitmproxy reports the closed
    connection to the HTTP layer); a connection still waiting for its TCP handshake has its
    task cancelled, which mitmproxy handles as a failed connect.
    """
    handler = _handler(client)
    if handler is None:  # the client is gone: nothing left to answer
        return True
    io = handler.transports.get(server)
    if io is None:
        return True  # already closed
    if io.writer is not None:
        transport = getattr(io.writer, "transport", None)
        if transport is not None:
            transport.abort()
        else:  # pragma: no cover - non-asyncio streams (UDP/WireGuard), not used by the router
            io.writer.close()
        return True
    connecting = server.timestamp_start is not None and server.timestamp_tcp_setup is None
    if connecting and io.handler is not None and not io.handler.done():
        io.handler.cancel(CONNECT_TIMEOUT_MESSAGE)
        return True
    return False


def close_client(client_id: str) -> None:
    """Close a client connection (draining on shutdown); nothing if it is already gone."""
    proxyserver = ctx.master.addons.get("proxyserver")
    handler = proxyserver.connections.get(client_id) if proxyserver else None
    if handler is None:
        return
    io = handler.transports.get(handler.client)
    if io is not None and io.writer is not None and not io.writer.is_closing():
        io.writer.close()


def client_ids() -> Iterator[str]:
    """The client connections the proxy server holds right now."""
    proxyserver = ctx.master.addons.get("proxyserver")
    return iter(list(proxyserver.connections) if proxyserver else [])


def _handler(client: Client) -> Any:
    proxyserver = ctx.master.addons.get("proxyserver")
    return proxyserver.connections.get(client.id) if proxyserver else None


# --------------------------------------------------------------------------- 4. listening

_original_listen = mode_servers.AsyncioServerInstance.listen
_listen_sockets: dict[tuple[str, int], socket.socket] = {}


def use_listen_sockets(sockets: Mapping[tuple[str, int], socket.socket]) -> None:
    """Listeners at these (host, port) addresses accept on the given bound, listening sockets
    instead of binding their own."""
    _listen_sockets.clear()
    _listen_sockets.update(sockets)


async def _listen(self: Any, host: str, port: int) -> list[Any]:
    sock = _listen_sockets.get((host.lower(), port))
    if sock is None or self.mode.transport_protocol != "tcp":
        return await _original_listen(self, host, port)
    # asyncio closes the socket it serves when the server closes: give it a duplicate, so the
    # supervisor's socket (and its queue of connections not yet accepted) outlives this worker.
    return [await asyncio.start_server(self.handle_stream, sock=sock.dup())]


# --------------------------------------------------------------------------- 5. log plumbing


def quiet_master(master: Master) -> None:
    """Drop the deprecated ``add_log`` copies of log records (nothing here listens to them)."""
    legacy = getattr(master, "_legacy_log_events", None)
    if legacy is not None:
        legacy.uninstall()


class FastAddonManager(addonmanager.AddonManager):
    """mitmproxy's addon manager, calling for each event only the addons that have its hook.

    Put in place on a master's manager by :func:`fast_hooks` (the manager is made by
    ``Master.__init__`` and wired to the options there; only its class changes)."""

    def _implementers(self, name: str) -> tuple[Callable[..., Any], ...]:
        cache: dict[str, tuple[Callable[..., Any], ...]] = self.__dict__.setdefault(
            "_scoperouter_hooks", {}
        )
        found = cache.get(name)
        if found is None:
            found = cache[name] = tuple(
                hook
                for addon in addonmanager.traverse(self.chain)
                if callable(hook := getattr(addon, name, None))
                and not isinstance(hook, types.ModuleType)
            )
        return found

    def _forget_hooks(self) -> None:
        self.__dict__.pop("_scoperouter_hooks", None)

    def register(self, addon: Any) -> Any:
        self._forget_hooks()
        return super().register(addon)  # type: ignore[no-untyped-call]

    def remove(self, addon: Any) -> None:
        self._forget_hooks()
        super().remove(addon)  # type: ignore[no-untyped-call]

    async def trigger_event(self, event: hooks.Hook) -> None:
        hooks_found = self._implementers(event.name)
        if not hooks_found:
            return
        args = event.args()
        for hook in hooks_found:
            try:
                with addonmanager.safecall():
                    result = hook(*args)
                    if result is not None and inspect.isawaitable(result):
                        await result
            except exceptions.AddonHalt:
                return

    async def handle_lifecycle(self, event: hooks.Hook) -> None:
        await self.trigger_event(event)
        if self._implementers("update"):
            message = event.args()[0]
            if isinstance(message, mflow.Flow):
                await self.trigger_event(hooks.UpdateHook([message]))


def fast_hooks(master: Master) -> None:
    """Give `master` the :class:`FastAddonManager` (before or after adding addons)."""
    master.addons.__class__ = FastAddonManager


# --------------------------------------------------------------------------- 6. messages

CLIENT_GONE = "Client disconnected"  # Http1Connection.wait, when the client closes mid-request
CLIENT_PROTOCOL_ERROR = "HTTP/1 protocol error"  # Http1Connection.read_body, malformed body


def client_went_away(flow: http.HTTPFlow) -> bool:
    return flow.error is not None and flow.error.msg.startswith(CLIENT_GONE)


def body_failure(flow: http.HTTPFlow) -> tuple[int, str] | None:
    """The status and message of a body the guarded server failed (408, 431), else None."""
    if flow.error is None or not flow.error.msg.startswith(guard.BODY_FAILED):
        return None
    status, _, message = flow.error.msg.removeprefix(guard.BODY_FAILED).partition(": ")
    return int(status), message


TLS_VERIFY_FAILED = "Certificate verify failed: "  # proxy.layers.tls: an upstream's check


def upstream_reason(message: str) -> str:
    """mitmproxy's words for an upstream's failure, in the HTTP layer's where they differ: a
    failed certificate check says so as the reverse path does (``TLS certificate verification
    failed: <why>``)."""
    if message.startswith(TLS_VERIFY_FAILED):
        return f"TLS certificate verification failed: {message.removeprefix(TLS_VERIFY_FAILED)}"
    return message


def client_protocol_error(flow: http.HTTPFlow) -> bool:
    """The client sent a malformed body (bad chunked framing...) before its request ended."""
    return (
        flow.error is not None
        and flow.error.msg.startswith(CLIENT_PROTOCOL_ERROR)
        and flow.request.timestamp_end is None
    )


# --------------------------------------------------------------------------- 7. TLS

CertificateFor = Callable[[str | None, int | None], x509.Certificate | None]
"""(host, port) of the tunnel -> the certificate to answer with, None to refuse."""


class InterceptingTlsConfig(tlsconfig.TlsConfig):
    """mitmproxy's TlsConfig answering client handshakes with the router's certificates."""

    def __init__(self, certificate_for: CertificateFor, key: Any) -> None:
        super().__init__()
        self.certificate_for = certificate_for
        self.key = key  # the private key of every certificate certificate_for gives

    if hasattr(tlsconfig.TlsConfig, "request"):  # mitmproxy 12 (compat.TLSCONFIG_HAS_REQUEST_HOOK)

        def request(self, flow: http.HTTPFlow) -> None:
            """mitmproxy 12's hook answering a path ending in its CRL's name: switched off
            (every request is the router's to route and log; no certificate of the router
            names that CRL)."""

    def get_cert(self, conn_context: Any) -> certs.CertStoreEntry:
        address = conn_context.server.address
        host, port = (address[0], address[1]) if address else (None, None)
        cert = self.certificate_for(host, port)
        if cert is None:  # mitmproxy's own, from the worker's throwaway CA that nobody trusts
            return super().get_cert(conn_context)
        return certs.CertStoreEntry(certs.Cert(cert), self.key, None, [])


# --------------------------------------------------------------------------- 8. tunnels

NextLayer = layer.NextLayer
TlsData = tls.TlsData  # what the tls_established_client hook gets (.context.client)
"""What the ``next_layer`` hook gets: ``.context``, ``.layer`` (set it to decide),
``.data_client()`` (the bytes the client sent so far)."""


def could_be_tls(data: bytes) -> bool:
    """Whether `data`, the first bytes of a tunnel, begin a TLS record (a ClientHello); with
    fewer than 3 bytes that still could, the ``next_layer`` hook stops every addon after it
    (:class:`~mitmproxy.exceptions.AddonHalt`), so nothing decides until more bytes come."""
    if len(data) >= 3:
        return net_tls.starts_like_tls_record(data)
    if b"\x16\x03".startswith(data):
        raise exceptions.AddonHalt()  # the next bytes decide
    return False


def refuse_layer(context: Context, status: int, message: str, where: str) -> layer.Layer:
    """A layer that answers the client `status` with the router's JSON error, half-closes,
    drops what still comes for :data:`guard.LINGER_SECONDS` and closes; the refusal is
    reported once (the access log and metrics, as a refused head: path `where`)."""
    return _Refusing(context, status, message, where)


class _Refusing(layer.Layer):
    def __init__(self, context: Context, status: int, message: str, where: str) -> None:
        super().__init__(context)
        self.status, self.message, self.where = status, message, where
        self.answered = False

    def _handle_event(self, event: events.Event) -> layer.CommandGenerator[None]:
        client = self.context.client
        if not self.answered:
            self.answered = True
            yield commands.SendData(client, guard.error_page(self.status, self.message))
            yield commands.CloseTcpConnection(client, half_close=True)
            yield commands.RequestWakeup(guard.LINGER_SECONDS)
            guard.report(client, self.status, self.message, "-", self.where)
        elif isinstance(event, events.Wakeup) or (
            isinstance(event, events.ConnectionClosed) and event.connection == client
        ):
            yield commands.CloseConnection(client)
