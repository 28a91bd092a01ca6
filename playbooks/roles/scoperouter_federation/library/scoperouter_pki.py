#!/usr/bin/python
# The peer links' certificates, made on the Ansible controller (delegate_to: localhost), where
# the federation's CA stays: scoperouter's own PKI code (scoperouter/pki.py, which
# module_utils/scoperouter_pki.py links to; standard library and `cryptography` only, which
# ansible-core itself requires), the same as `scoperouter pki` and the lab's.
from __future__ import annotations

DOCUMENTATION = r"""
module: scoperouter_pki
short_description: A scoperouter federation's CA, or a router's peer-link certificate
description:
  - kind=ca makes a CA in cert and key, or keeps the one there while it is valid for more than
    renew_days.
  - kind=certificate makes a key and a TLS server certificate for addresses signed by the CA
    (ca_cert, ca_key_content), or keeps them while they are signed by that CA, for exactly
    these addresses, the key matches and they are valid for more than renew_days.
  - Keys are written mode 0600; no key is ever returned. Supports check mode.
options:
  kind: {type: str, choices: [ca, certificate], default: certificate, description: What to make.}
  cert: {type: path, required: true, description: The certificate file.}
  key: {type: path, required: true, description: Its key file.}
  ca_cert: {type: path, description: The CA certificate (kind=certificate).}
  ca_key_content: {type: str, description: The CA key, PEM (kind=certificate; never logged).}
  addresses: {type: list, elements: str, default: [], description: IPs and DNS names (kind=certificate).}
  name: {type: str, default: peer link, description: "The subject: CN=scoperouter NAME."}
  days: {type: int, description: "Validity (default: 3650 for a CA, 365 for a certificate)."}
  renew_days: {type: int, default: 30, description: Made again this close to its end.}
"""

RETURN = r"""
reason: {description: Why it was made (or would be, in check mode); empty when kept., type: str}
certificate: {description: "Subject, addresses, issuer and end of the certificate (no secret).", type: str}
"""

from pathlib import Path  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

try:
    import cryptography
    from ansible.module_utils.scoperouter_pki import (
        CA_DAYS,
        VALID_DAYS,
        PkiError,
        describe,
        ensure_ca,
        ensure_certificate,
    )
except ImportError as exc:  # no cryptography in the controller's Python
    IMPORT_ERROR: str | None = str(exc)
else:
    IMPORT_ERROR = None


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "kind": {"type": "str", "choices": ["ca", "certificate"], "default": "certificate"},
            "cert": {"type": "path", "required": True},
            "key": {"type": "path", "required": True, "no_log": False},
            "ca_cert": {"type": "path"},
            "ca_key_content": {"type": "str", "no_log": True},
            "addresses": {"type": "list", "elements": "str", "default": []},
            "name": {"type": "str", "default": "peer link"},
            "days": {"type": "int"},
            "renew_days": {"type": "int", "default": 30},
        },
        required_if=[("kind", "certificate", ("ca_cert", "ca_key_content", "addresses"))],
        supports_check_mode=True,
    )
    if IMPORT_ERROR is not None:
        module.fail_json(msg=f"the controller's Python needs cryptography: {IMPORT_ERROR}")
    major = int(cryptography.__version__.split(".")[0])
    if major < 42:
        module.fail_json(
            msg=f"the controller's Python has cryptography {cryptography.__version__}; "
            "scoperouter's PKI needs 42 or later (playbooks/requirements.txt)"
        )
    params = module.params
    cert, key = Path(params["cert"]), Path(params["key"])
    try:
        if params["kind"] == "ca":
            reason = ensure_ca(
                cert,
                key,
                name=params["name"],
                days=params["days"] or CA_DAYS,
                renew_days=params["renew_days"],
                dry_run=module.check_mode,
            )
        else:
            reason = ensure_certificate(
                cert,
                key,
                ca_cert_pem=Path(params["ca_cert"]).read_bytes(),
                ca_key_pem=params["ca_key_content"].encode(),
                addresses=params["addresses"],
                name=params["name"],
                days=params["days"] or VALID_DAYS,
                renew_days=params["renew_days"],
                dry_run=module.check_mode,
            )
        about = describe(cert.read_bytes()) if cert.exists() else ""
    except (OSError, PkiError) as exc:
        module.fail_json(msg=f"{cert}: {exc}")
    module.exit_json(changed=reason is not None, reason=reason or "", certificate=about)


if __name__ == "__main__":
    main()
