"""``scoperouter pki ca|issue|check``: the certificates of the peer links."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from scoperouter.cli.common import positive_int, usage
from scoperouter.pki import CA_DAYS, RENEW_DAYS, VALID_DAYS

if TYPE_CHECKING:
    from scoperouter.cli.common import Subparsers

DESCRIPTION = """\
The certificates of the peer links (the router-to-router hops, TLS verified with the
federation's CA; the manual: docs/router/peer-links.md): one CA per federation, and for each
router a certificate for the host of its peer link url, signed by that CA. Files are kept while
they are good, so running the same command again changes nothing; keys are written mode 0600
and never printed.

example (a CA, then CloudOne's router's certificate for its peer link at
https://router.cloudone.example.org:9443):
  scoperouter pki ca --cert ca.crt --key ca.key
  scoperouter pki issue --ca-cert ca.crt --ca-key ca.key \\
      --cert cloudone-peer.crt --key cloudone-peer.key router.cloudone.example.org
  scoperouter pki check --ca-cert ca.crt --cert cloudone-peer.crt --key cloudone-peer.key \\
      router.cloudone.example.org
"""


def register(sub: Subparsers) -> argparse.ArgumentParser:
    pki = sub.add_parser(
        "pki",
        help="the certificates of the peer links: a federation CA, a router's certificate",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    pki_sub = pki.add_subparsers(title="commands", metavar="COMMAND")
    ca = pki_sub.add_parser(
        "ca",
        help="make a federation CA (kept when it is valid)",
        description="Make a CA in --cert and --key (mode 0600), or keep the one there while "
        "it is valid for more than --renew-days. Prints what it did, never the key.",
        epilog="example:\n  scoperouter pki ca --cert ca.crt --key ca.key\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ca.add_argument("--cert", required=True, metavar="FILE", help="the CA certificate")
    ca.add_argument("--key", required=True, metavar="FILE", help="its key (mode 0600)")
    ca.add_argument("--name", default="federation CA", help="its subject: CN=scoperouter NAME")
    ca.add_argument("--days", type=positive_int, default=CA_DAYS, help="default %(default)s")
    ca.add_argument("--renew-days", type=int, default=RENEW_DAYS, help="default %(default)s")
    ca.set_defaults(func=run_ca)
    iss = pki_sub.add_parser(
        "issue",
        help="make a router's peer-link certificate, signed by the CA (kept when valid)",
        description="Make a key (mode 0600) and a TLS server certificate for ADDRESS... (the "
        "host of the router's peer link url: an IP or a DNS name) signed by the CA; or keep "
        "them while they are signed by that CA, for exactly these addresses, their key matches "
        "and they are valid for more than --renew-days. Prints what it did, never a key.",
        epilog="example (CloudOne's router, its peer link at https://10.0.1.11:9443):\n"
        "  scoperouter pki issue --ca-cert ca.crt --ca-key ca.key \\\n"
        "      --cert cloudone-peer.crt --key cloudone-peer.key 10.0.1.11\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    iss.add_argument("--ca-cert", required=True, metavar="FILE", help="the CA certificate")
    iss.add_argument("--ca-key", required=True, metavar="FILE", help="its key (- for stdin)")
    iss.add_argument("--cert", required=True, metavar="FILE", help="the certificate to make")
    iss.add_argument("--key", required=True, metavar="FILE", help="its key (mode 0600)")
    iss.add_argument("--name", default="peer link", help="its subject: CN=scoperouter NAME")
    iss.add_argument("--days", type=positive_int, default=VALID_DAYS, help="default %(default)s")
    iss.add_argument("--renew-days", type=int, default=RENEW_DAYS, help="default %(default)s")
    iss.add_argument("--force", action="store_true", help="make them anew (a rotation)")
    iss.add_argument("addresses", nargs="+", metavar="ADDRESS")
    iss.set_defaults(func=run_issue)
    chk = pki_sub.add_parser(
        "check",
        help="say whether a certificate is still good (exit 1: it would be made again)",
        description="Exit 0 when `pki issue` with these arguments would keep the certificate; "
        "else print why and exit 1 (for monitoring: a certificate within --renew-days of its "
        "end fails).",
        epilog="example:\n  scoperouter pki check --ca-cert ca.crt --cert cloudone-peer.crt \\\n"
        "      --key cloudone-peer.key 10.0.1.11 || echo renew it\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    chk.add_argument("--ca-cert", required=True, metavar="FILE", help="the CA certificate")
    chk.add_argument("--cert", required=True, metavar="FILE", help="the certificate")
    chk.add_argument("--key", required=True, metavar="FILE", help="its key")
    chk.add_argument("--renew-days", type=int, default=RENEW_DAYS, help="default %(default)s")
    chk.add_argument("addresses", nargs="+", metavar="ADDRESS")
    chk.set_defaults(func=run_check)
    pki.set_defaults(func=lambda _args: usage(pki))
    return pki


def _pki_error(exc: Exception) -> int:
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    where = f" ({exc.filename})" if isinstance(exc, OSError) and exc.filename else ""
    print(f"scoperouter pki: {text}{where}", file=sys.stderr)
    return 1


def _pki_done(cert: Path, made: str | None, about: str) -> int:
    """What `pki ca` / `pki issue` did (`made`: why it was made; None: kept), never a key."""
    print(f"{'made' if made else 'kept'} {cert}: {about}" + (f" (was: {made})" if made else ""))
    return 0


def run_ca(args: argparse.Namespace) -> int:
    from scoperouter import pki

    cert, key = Path(args.cert), Path(args.key)
    try:
        made = pki.ensure_ca(cert, key, name=args.name, days=args.days, renew_days=args.renew_days)
        about = pki.describe(cert.read_bytes())
    except (OSError, pki.PkiError) as exc:
        return _pki_error(exc)
    return _pki_done(cert, made, about)


def run_issue(args: argparse.Namespace) -> int:
    from scoperouter import pki

    cert, key = Path(args.cert), Path(args.key)
    try:
        ca_cert = Path(args.ca_cert).read_bytes()
        ca_key = sys.stdin.buffer.read() if args.ca_key == "-" else Path(args.ca_key).read_bytes()
        made = pki.ensure_certificate(
            cert,
            key,
            ca_cert_pem=ca_cert,
            ca_key_pem=ca_key,
            addresses=args.addresses,
            name=args.name,
            days=args.days,
            renew_days=args.renew_days,
            force=args.force,
        )
        about = pki.describe(cert.read_bytes())
    except (OSError, pki.PkiError) as exc:
        return _pki_error(exc)
    return _pki_done(cert, made, about)


def run_check(args: argparse.Namespace) -> int:
    from scoperouter import pki

    cert = Path(args.cert)
    try:
        ca_cert = Path(args.ca_cert).read_bytes()
        problem = pki.certificate_problem(
            cert, Path(args.key), ca_cert, args.addresses, args.renew_days
        )
        about = None if problem else pki.describe(cert.read_bytes())
    except (OSError, pki.PkiError) as exc:
        return _pki_error(exc)
    if problem:
        print(f"{cert}: would be made again: {problem}")
        return 1
    print(f"{cert}: good: {about}")
    return 0
