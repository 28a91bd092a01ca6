"""A tiny read-only stand-in for the network service (neutron) of a lab cloud.

Nova calls the network service even for servers created with ``--nic none`` (show, list and
delete ask ``GET /v2.0/ports?device_id=...``); real neutron is heavy, so this answers every list
call with an empty list, every show with 404 and every write with 403. It does not check tokens.

Run: ``python -m scoperouter.lab.netstub --listen 127.0.1.2:9696`` (stdlib only).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_COLLECTION = re.compile(r"^/v2\.0/([a-z0-9_-]+?)(?:\.json)?/?$")
_ITEM = re.compile(r"^/v2\.0/([a-z0-9_-]+)/([^/]+?)(?:\.json)?/?$")
_QUOTA_KEYS = ("network", "subnet", "port", "router", "floatingip", "security_group",
               "security_group_rule")  # fmt: skip


class Handler(BaseHTTPRequestHandler):
    server_version = "scoperouter-lab-network/1"
    protocol_version = "HTTP/1.1"

    def _send(self, status: int, body: object) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)
        self.close_connection = True

    def _error(self, status: int, kind: str, message: str) -> None:
        self._send(status, {"NeutronError": {"type": kind, "message": message, "detail": ""}})

    def _host(self) -> str:
        host, port = self.server.server_address[:2]
        return self.headers.get("Host") or f"{host}:{port}"

    def do_GET(self) -> None:
        path = self.path.partition("?")[0]
        base = f"http://{self._host()}"
        if path in ("", "/"):
            self._send(
                200,
                {
                    "versions": [
                        {
                            "id": "v2.0",
                            "status": "CURRENT",
                            "links": [{"href": base + "/v2.0/", "rel": "self"}],
                        }
                    ]
                },
            )
            return
        if path.rstrip("/") == "/v2.0":
            self._send(200, {"resources": []})
            return
        m = _COLLECTION.match(path)
        if m:
            self._send(200, {m.group(1).replace("-", "_"): []})
            return
        m = _ITEM.match(path)
        if m and m.group(1) == "quotas":
            self._send(200, {"quota": {k: -1 for k in _QUOTA_KEYS}})
            return
        if m:
            self._error(404, "NotFound", f"{m.group(1)} {m.group(2)} could not be found")
            return
        self._error(404, "NotFound", f"no resource at {path}")

    do_HEAD = do_GET

    def _read_only(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self._error(403, "Forbidden", "the lab's network stand-in is read-only")

    do_POST = do_PUT = do_DELETE = do_PATCH = _read_only

    def log_message(self, fmt: str, *args: object) -> None:
        sys.stderr.write(f"{self.log_date_time_string()} {fmt % args}\n")
        sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT to listen on")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    server = ThreadingHTTPServer((host, int(port)), Handler)
    server.daemon_threads = True
    sys.stderr.write(f"network stand-in listening on {args.listen}\n")
    sys.stderr.flush()
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
