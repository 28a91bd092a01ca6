"""A read-only stand-in for the block-storage service (cinder v3) of a lab cloud.

The lab has no volumes. Clients still ask block storage about servers: openstacksdk's cloud
layer lists a server's volumes before deleting it, its compute tests require a block-storage
v3 endpoint, and ``openstack quota show`` / ``availability zone list`` / ``limits show`` include
block storage when the catalog has it. This stand-in answers those reads as an empty cinder
would (no volumes, snapshots, backups; unlimited quotas; one availability zone) and refuses
every write with 403 in cinder's error format: creating a volume is a limit of the lab.

Version discovery at ``/`` and ``/v3`` (microversions 3.0-3.71), project-less URLs and
``/v3/<project_id>/...`` alike. Tokens are not checked (the stand-in listens on the lab's
loopback backend address, behind the cloud's router).

Run: ``python -m scoperouter_lab.blockstub --listen 127.0.1.2:8776`` (stdlib only).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from scoperouter_lab.api import scheme, serve_tls

MIN_VERSION, MAX_VERSION = "3.0", "3.71"
_PROJECT = re.compile(r"^[0-9a-f]{32}$")
_QUOTAS = ("volumes", "snapshots", "gigabytes", "backups", "backup_gigabytes", "groups",
           "per_volume_gigabytes")  # fmt: skip
_ABSOLUTE = {"maxTotalVolumes": -1, "maxTotalSnapshots": -1, "maxTotalVolumeGigabytes": -1,
             "maxTotalBackups": -1, "maxTotalBackupGigabytes": -1, "totalVolumesUsed": 0,
             "totalSnapshotsUsed": 0, "totalGigabytesUsed": 0, "totalBackupsUsed": 0,
             "totalBackupGigabytesUsed": 0}  # fmt: skip


def version_doc(base: str) -> dict[str, object]:
    return {
        "id": "v3.0",
        "status": "CURRENT",
        "version": MAX_VERSION,
        "min_version": MIN_VERSION,
        "updated": "2023-01-01T00:00:00Z",
        "links": [{"href": f"{base}/v3/", "rel": "self"}],
        "media-types": [
            {"base": "application/json", "type": "application/vnd.openstack.volume+json;version=3"}
        ],
    }


def answer(path: str, query: dict[str, list[str]], base: str) -> tuple[int, dict[str, object]]:
    """The stand-in's reply to a GET of `path`: (status, JSON body)."""
    parts = [p for p in path.split("/") if p]
    if not parts:
        return 300, {"versions": [version_doc(base)]}
    if parts[0] != "v3":
        return 404, _error(404, f"no resource at {path}")
    parts = parts[1:]
    if parts and _PROJECT.match(parts[0]):
        parts = parts[1:]  # /v3/<project_id>/volumes ... (the legacy URL form)
    if not parts:
        return 200, {"version": version_doc(base)}
    head = parts[0]
    if head == "os-quota-sets" and len(parts) == 2:
        usage = query.get("usage", ["false"])[0].lower() in ("true", "1")
        value: object = {"limit": -1, "in_use": 0, "reserved": 0} if usage else -1
        return 200, {"quota_set": {"id": parts[1], **dict.fromkeys(_QUOTAS, value)}}
    if head == "os-availability-zone" and len(parts) == 1:
        zone = {"zoneName": "nova", "zoneState": {"available": True}}
        return 200, {"availabilityZoneInfo": [zone]}
    if head == "limits" and len(parts) == 1:
        return 200, {"limits": {"rate": [], "absolute": dict(_ABSOLUTE)}}
    if len(parts) == 1 or (len(parts) == 2 and parts[1] == "detail"):
        return 200, {head.replace("-", "_"): []}  # volumes, snapshots/detail, backups, types ...
    return 404, _error(404, f"{head} {parts[1]} could not be found", "itemNotFound")


def _error(code: int, message: str, kind: str | None = None) -> dict[str, object]:
    kind = kind or {403: "forbidden", 404: "itemNotFound"}.get(code, "badRequest")
    return {kind: {"code": code, "message": message}}


class Handler(BaseHTTPRequestHandler):
    server_version = "scoperouter-lab-block-storage/1"
    protocol_version = "HTTP/1.1"

    def _send(self, status: int, body: object) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        if status < 400:
            self.send_header("OpenStack-API-Version", f"volume {MIN_VERSION}")
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)
        self.close_connection = True

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        host, port = self.server.server_address[:2]  # type: ignore[index,str-unpack]
        base = f"{scheme(self)}://{self.headers.get('Host') or f'{host}:{port}'}"
        self._send(*answer(parts.path, parse_qs(parts.query), base))

    do_HEAD = do_GET

    def _read_only(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if 0 < length <= 1 << 20:
            self.rfile.read(length)
        self._send(403, _error(403, "the lab's block-storage stand-in has no volumes and is "
                                    "read-only"))  # fmt: skip

    do_POST = do_PUT = do_DELETE = do_PATCH = _read_only

    def log_message(self, fmt: str, *args: object) -> None:
        sys.stderr.write(f"{self.log_date_time_string()} {fmt % args}\n")
        sys.stderr.flush()


def make_server(host: str, port: int) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT to listen on")
    parser.add_argument("--tls-cert", help="serve https with this certificate (a TLS lab)")
    parser.add_argument("--tls-key", help="and this key")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    server = make_server(host, int(port))
    if args.tls_cert:
        serve_tls(server, args.tls_cert, args.tls_key or args.tls_cert)
    sys.stderr.write(f"block-storage stand-in listening on {args.listen}\n")
    sys.stderr.flush()
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
