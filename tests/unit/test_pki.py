"""The peer links' certificates (scoperouter.pki, `scoperouter pki`): a CA and a router's
certificate made once and kept while good, made again when they are not (another address, another
CA, a key that does not match, the last days of their validity), keys mode 0600 and never
printed; a certificate that a TLS client verifying with the CA accepts for its address."""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from scoperouter import pki
from scoperouter.cli import main


def _ca(tmp_path: Path) -> tuple[Path, Path]:
    return pki.make_ca(tmp_path, "ca")


def test_a_ca_is_made_once_and_kept(tmp_path: Path) -> None:
    cert, key = tmp_path / "ca.crt", tmp_path / "ca.key"
    assert pki.ensure_ca(cert, key) == "there is none"
    assert key.stat().st_mode & 0o777 == 0o600
    first = cert.read_bytes(), key.read_bytes()
    assert pki.ensure_ca(cert, key) is None
    assert (cert.read_bytes(), key.read_bytes()) == first
    ca = x509.load_pem_x509_certificate(first[0])
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    left = ca.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    assert left > datetime.timedelta(days=pki.CA_DAYS - 1)
    # one close to its end is made again; a dry run only says so
    cert.write_bytes(pki.new_ca("old", days=10)[0])
    assert pki.ensure_ca(cert, key, dry_run=True) is not None
    assert pki.ensure_ca(cert, key) is not None and cert.read_bytes() != first[0]


def test_a_certificate_is_kept_while_good_and_made_again_when_not(tmp_path: Path) -> None:
    ca = _ca(tmp_path)
    ca_pem, ca_key = ca[0].read_bytes(), ca[1].read_bytes()
    cert, key = tmp_path / "peer.crt", tmp_path / "peer.key"

    def ensure(*addresses: str, **kwargs: Any) -> str | None:
        return pki.ensure_certificate(
            cert, key, ca_cert_pem=ca_pem, ca_key_pem=ca_key, addresses=addresses, **kwargs
        )

    assert ensure("10.0.0.1", "router.example.org") == "there is none"
    assert key.stat().st_mode & 0o777 == 0o600
    made = cert.read_bytes()
    assert ensure("router.example.org", "10.0.0.1") is None and cert.read_bytes() == made
    assert pki.addresses_of(x509.load_pem_x509_certificate(made)) == {
        "10.0.0.1",
        "router.example.org",
    }
    # another address
    assert "not 10.0.0.2" in (ensure("10.0.0.2", dry_run=True) or "")
    assert cert.read_bytes() == made  # a dry run writes nothing
    # a key that is not the certificate's
    key.write_bytes(pki.new_ca("x")[1])
    assert ensure("10.0.0.1", "router.example.org") == "its key does not match it"
    # another CA
    other = pki.make_ca(tmp_path / "other", "ca")
    problem = pki.certificate_problem(
        cert, key, other[0].read_bytes(), ["10.0.0.1", "router.example.org"]
    )
    assert problem == "it is not signed by the CA"
    # its last days
    near, near_key = pki.new_certificate(ca_pem, ca_key, "p", ["10.0.0.1"], days=20)
    cert.write_bytes(near)
    key.write_bytes(near_key)
    assert "expires on" in (ensure("10.0.0.1") or "")
    # force: a rotation
    before = cert.read_bytes()
    assert ensure("10.0.0.1") is None
    assert ensure("10.0.0.1", force=True) == "asked to (--force)" and cert.read_bytes() != before


def test_only_a_ca_signs(tmp_path: Path) -> None:
    ca = _ca(tmp_path)
    leaf = pki.issue(ca, tmp_path, "leaf", ["10.0.0.1"])
    with pytest.raises(pki.PkiError, match="not a CA"):
        pki.new_certificate(leaf[0].read_bytes(), leaf[1].read_bytes(), "x", ["h"])
    other = pki.new_ca("other")
    with pytest.raises(pki.PkiError, match="does not belong"):
        pki.new_certificate(ca[0].read_bytes(), other[1], "x", ["h"])
    with pytest.raises(pki.PkiError, match="not an unencrypted PEM"):
        pki.new_certificate(ca[0].read_bytes(), b"nothing", "x", ["h"])


def test_a_tls_client_trusting_the_ca_accepts_the_certificate(tmp_path: Path) -> None:
    """What a router's peer pool does: verify the peer with the CA, its address checked."""
    ca = _ca(tmp_path)
    cert, key = pki.issue(ca, tmp_path, "peer", ["127.0.0.1"])
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with server.wrap_socket(conn, server_side=True) as tls:
            tls.recv(1)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = ssl.create_default_context(cafile=str(ca[0]))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        client.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        assert tls.version() is not None
        tls.send(b"x")
    thread.join(10)
    listener.close()


def test_cli_makes_keeps_and_checks_without_printing_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ca_cert, ca_key = str(tmp_path / "ca.crt"), str(tmp_path / "ca.key")
    cert, key = str(tmp_path / "p.crt"), str(tmp_path / "p.key")
    printed = []

    def run(*argv: str) -> tuple[int, str, str]:
        status = main(list(argv))
        out, err = capsys.readouterr()
        printed.append(out + err)
        return status, out, err

    assert run("pki", "ca", "--cert", ca_cert, "--key", ca_key)[1].startswith("made ")
    assert run("pki", "ca", "--cert", ca_cert, "--key", ca_key)[1].startswith("kept ")
    issue = ["pki", "issue", "--ca-cert", ca_cert, "--ca-key", ca_key, "--cert", cert]
    assert run(*issue, "--key", key, "10.0.0.1")[1].startswith("made ")
    assert run(*issue, "--key", key, "10.0.0.1")[1].startswith("kept ")
    check = ["pki", "check", "--ca-cert", ca_cert, "--cert", cert, "--key", key]
    status, out, _ = run(*check, "10.0.0.1")
    assert status == 0 and "good: CN=scoperouter peer link for 10.0.0.1" in out
    status, out, _ = run(*check, "10.0.0.2")
    assert status == 1 and "would be made again: it is for 10.0.0.1, not 10.0.0.2" in out
    status, _, err = run("pki", "issue", "--ca-cert", cert, "--ca-key", key, "--cert",
                         str(tmp_path / "x"), "--key", str(tmp_path / "y"), "h")  # fmt: skip
    assert status == 1 and "not a CA" in err
    for secret in (Path(ca_key).read_text(), Path(key).read_text()):
        body = secret.splitlines()[1]
        assert not any(body in text for text in printed)
    assert Path(key).stat().st_mode & 0o777 == 0o600


def test_a_signing_ca_is_read_only_from_a_key_file_its_owner_alone_may_read(
    tmp_path: Path,
) -> None:
    cert, key = _ca(tmp_path)
    assert key.stat().st_mode & 0o777 == 0o600
    ca = pki.load_signing_ca(cert, key)
    assert "PRIVATE" not in repr(ca) and "scoperouter ca" in repr(ca)
    key.chmod(0o400)
    assert pki.load_signing_ca(cert, key).cert == ca.cert
    for mode in (0o640, 0o604, 0o644, 0o660):
        key.chmod(mode)
        with pytest.raises(pki.PkiError) as info:
            pki.load_signing_ca(cert, key)
        assert str(info.value) == (
            f"{key} is mode {mode:04o}: a private key must be readable by its owner only "
            f"(chmod 600 {key})"
        )
    key.chmod(0o600)
    leaf = pki.issue((cert, key), tmp_path, "leaf", ["10.0.0.1"])
    with pytest.raises(pki.PkiError, match="not a CA's certificate"):
        pki.load_signing_ca(*leaf)
    other = tmp_path / "other.key"
    other.write_bytes(pki.new_ca("other")[1])
    other.chmod(0o600)
    with pytest.raises(pki.PkiError, match="does not belong to the CA certificate"):
        pki.load_signing_ca(cert, other)
    with pytest.raises(pki.PkiError, match=r"cannot read .*missing\.key"):
        pki.load_signing_ca(cert, tmp_path / "missing.key")


def test_a_host_certificate_is_for_that_host_signed_by_the_ca(tmp_path: Path) -> None:
    ca = pki.load_signing_ca(*_ca(tmp_path))
    key = pki.new_key()
    for host in ("127.0.1.2", "glance.internal.example"):
        cert = pki.host_certificate(ca, key, host, 7)
        cert.verify_directly_issued_by(ca.cert)
        assert pki.addresses_of(cert) == {host}
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        assert not constraints.ca
        assert cert.public_key() == key.public_key()
        left = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
        assert datetime.timedelta(days=6) < left <= datetime.timedelta(days=7)
