#!/usr/bin/python
"""Ansible module: keep a cluster CA and what it signs, on the controller.

The CA is created once and never replaced; a certificate is issued again only when it is missing,
no longer matches its key, the CA, its names, organizations or usages, or expires within
`renew_within_days`. Two more kinds of credential live beside the certificates and are made once:
a key pair (the service-account signing key: `<name>.key` and `<name>.pub`) and a kubelet bootstrap
token (`<name>.token`, `[a-z0-9]{6}.[a-z0-9]{16}`, with its expiry in `<name>.token.expires`: made
again when less than half its lifetime is left, by a converge that reaches an API server). Runs delegated to the controller; concurrent
runs (one per host) serialise on a lock in ca_dir.
"""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import os
import secrets
import string
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    HAS_CRYPTOGRAPHY = True
except ImportError:  # pragma: no cover - reported by the module
    HAS_CRYPTOGRAPHY = False

DOCUMENTATION = r"""
module: superkube_cert
short_description: Keep a cluster CA and certificates it signs, on the controller
description:
  - Creates the CA in O(ca_dir) once (never regenerated) and issues O(name).crt / O(name).key.
  - Re-issues a certificate only when it is missing, does not match its key, was not signed by the CA,
    has other names or usages, or expires within O(renew_within_days).
options:
  ca_dir: {type: path, required: true, description: Directory holding ca.crt and ca.key (mode 0700).}
  ca_common_name: {type: str, default: "", description: Subject CN of the CA when it is created (certificates).}
  name: {type: str, required: true, description: File stem of the certificate and key in O(ca_dir).}
  kind:
    type: str
    choices: [certificate, keypair, token]
    default: certificate
    description: What to keep, a certificate signed by the CA, a key pair, or a bootstrap token.
  common_name: {type: str, default: "", description: Subject CN of the certificate (required for certificates).}
  organizations: {type: list, elements: str, default: [], description: Subject O values (Kubernetes groups).}
  ip_addresses: {type: list, elements: str, default: [], description: IP subject alternative names.}
  dns_names: {type: list, elements: str, default: [], description: DNS subject alternative names.}
  usages:
    type: list
    elements: str
    choices: [server, client]
    default: [server, client]
    description: Extended key usages.
  days: {type: int, default: 365, description: Validity of an issued certificate.}
  token_hours:
    type: int
    default: 24
    description: Lifetime of a bootstrap token; a new one is made when less than half is left.
  token_rotate:
    type: bool
    default: true
    description: Whether a token due may be replaced (false when no API server is in the play).
  ca_days: {type: int, default: 3650, description: Validity of the CA when it is created.}
  renew_within_days: {type: int, default: 30, description: Re-issue when fewer days than this remain.}
author: superkube
"""

USAGES = {"server": "SERVER_AUTH", "client": "CLIENT_AUTH"}
TOKEN_ALPHABET = string.ascii_lowercase + string.digits


def _now():
    return datetime.datetime.now(datetime.UTC)


def _write(path, data, mode):
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def _key_pem(key):
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _ensure_ca(ca_dir, common_name, days):
    """(certificate, key, created): the CA in ca_dir, created only if it has never been."""
    crt_path, key_path = ca_dir / "ca.crt", ca_dir / "ca.key"
    if crt_path.exists() and key_path.exists():
        cert = x509.load_pem_x509_certificate(crt_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        return cert, key, False
    if crt_path.exists() or key_path.exists():
        raise ValueError(
            f"{ca_dir} holds only one of ca.crt and ca.key; restore the missing file from your backup "
            "(a new CA would invalidate every certificate it signed)"
        )
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    start = _now() - datetime.timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(key_path, _key_pem(key), 0o600)
    _write(crt_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert, key, True


def _wanted_sans(ips, dns):
    return sorted([f"IP:{ipaddress.ip_address(i)}" for i in ips] + [f"DNS:{d}" for d in dns])


def _sans_of(cert):
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return sorted(
        [f"IP:{i}" for i in ext.get_values_for_type(x509.IPAddress)]
        + [f"DNS:{d}" for d in ext.get_values_for_type(x509.DNSName)]
    )


def _usages_of(cert):
    try:
        ext = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return []
    return sorted(name for name, oid in USAGES.items() if getattr(ExtendedKeyUsageOID, oid) in ext)


def _subject(params):
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in params["organizations"]]
    return x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, params["common_name"])])


def _organizations_of(cert):
    return sorted(a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME))


def _why_reissue(cert, key, ca_cert, params):
    """Why the existing certificate must be issued again, or None if it is still right."""
    if cert.issuer != ca_cert.subject:
        return "not issued by this CA"
    try:
        ca_cert.public_key().verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(hashes.SHA256()))
    except Exception:  # any verification failure means a foreign signature
        return "signature does not verify with this CA"
    if cert.public_key().public_numbers() != key.public_key().public_numbers():
        return "does not match its key"
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not cn or cn[0].value != params["common_name"]:
        return "common name changed"
    if _organizations_of(cert) != sorted(set(params["organizations"])):
        return "organizations changed"
    if _sans_of(cert) != _wanted_sans(params["ip_addresses"], params["dns_names"]):
        return "subject alternative names changed"
    if _usages_of(cert) != sorted(set(params["usages"])):
        return "usages changed"
    if cert.not_valid_after_utc - _now() < datetime.timedelta(days=params["renew_within_days"]):
        return "expires soon"
    return None


def _issue(key, ca_cert, ca_key, params):
    start = _now() - datetime.timedelta(minutes=5)
    sans = [x509.IPAddress(ipaddress.ip_address(i)) for i in params["ip_addresses"]]
    sans += [x509.DNSName(d) for d in params["dns_names"]]
    builder = (
        x509.CertificateBuilder()
        .subject_name(_subject(params))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=params["days"]))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=True,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [getattr(ExtendedKeyUsageOID, USAGES[u]) for u in sorted(set(params["usages"]))]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def _ensure_keypair(ca_dir, name):
    """<name>.key and <name>.pub, made once: every API server and controller-manager shares them."""
    key_path, pub_path = ca_dir / f"{name}.key", ca_dir / f"{name}.pub"
    created = not key_path.exists()
    if created:
        _write(key_path, _key_pem(ec.generate_private_key(ec.SECP256R1())), 0o600)
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    if not pub_path.exists() or pub_path.read_bytes() != public:
        _write(pub_path, public, 0o644)
        created = True
    return {"changed": created, "key": str(key_path), "pub": str(pub_path)}


def _ensure_token(ca_dir, name, hours, now=None, rotate=True):
    """<name>.token, a kubelet bootstrap token id.secret, valid for `hours` from when it was made
    (<name>.token.expires, RFC 3339). A new one is made when it has less than half of that left (or
    no expiry on record: a token of an older superkube never expired), if `rotate` allows: a converge
    that reaches no API server cannot put the new one into the cluster, so it keeps the old."""
    if hours < 1:
        raise ValueError(f"token {name}: token_hours {hours}: a bootstrap token must expire; give 1 or more")
    now = now or datetime.datetime.now(datetime.UTC)
    path, expires_path = ca_dir / f"{name}.token", ca_dir / f"{name}.token.expires"
    if path.exists():
        token = path.read_text().strip()
        if (
            len(token) != 23
            or token[6] != "."
            or any(c not in TOKEN_ALPHABET for c in token.replace(".", ""))
        ):
            raise ValueError(
                f"{path} is not a bootstrap token (6 and 16 of a-z0-9, joined by a dot); remove it"
            )
        try:
            expires = datetime.datetime.strptime(expires_path.read_text().strip(), "%Y-%m-%dT%H:%M:%SZ")
            expires = expires.replace(tzinfo=datetime.UTC)
        except (OSError, ValueError):
            expires = None
        if not rotate or (expires is not None and (expires - now).total_seconds() > hours * 3600 / 2):
            return {
                "changed": False,
                "token_file": str(path),
                "token_id": token[:6],
                "expires": expires.strftime("%Y-%m-%dT%H:%M:%SZ") if expires else None,
            }
    token = "".join(secrets.choice(TOKEN_ALPHABET) for _ in range(6))
    token += "." + "".join(secrets.choice(TOKEN_ALPHABET) for _ in range(16))
    expires = (now + datetime.timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%SZ")
    _write(path, token.encode() + b"\n", 0o600)
    _write(expires_path, expires.encode() + b"\n", 0o644)
    return {"changed": True, "token_file": str(path), "token_id": token[:6], "expires": expires}


def ensure(params):
    """The module's work, importable for tests: returns the result dict."""
    params = {"kind": "certificate", "organizations": [], **params}
    ca_dir = Path(params["ca_dir"])
    ca_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(ca_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if params["kind"] == "keypair":
            return _ensure_keypair(ca_dir, params["name"])
        if params["kind"] == "token":
            return _ensure_token(
                ca_dir, params["name"], params.get("token_hours", 24), rotate=params.get("token_rotate", True)
            )
        if not params["common_name"] or not params["ca_common_name"]:
            raise ValueError(f"certificate {params['name']}: common_name and ca_common_name are required")
        ca_cert, ca_key, ca_created = _ensure_ca(ca_dir, params["ca_common_name"], params["ca_days"])
        crt_path, key_path = ca_dir / f"{params['name']}.crt", ca_dir / f"{params['name']}.key"
        key = None
        reason = None
        if key_path.exists():
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        else:
            key = ec.generate_private_key(ec.SECP256R1())
            _write(key_path, _key_pem(key), 0o600)
            reason = "new key"
        if reason is None:
            if crt_path.exists():
                reason = _why_reissue(
                    x509.load_pem_x509_certificate(crt_path.read_bytes()), key, ca_cert, params
                )
            else:
                reason = "no certificate"
        if reason is not None:
            cert = _issue(key, ca_cert, ca_key, params)
            _write(crt_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return {
        "changed": ca_created or reason is not None,
        "ca_created": ca_created,
        "reissued_because": reason,
        "ca": str(ca_dir / "ca.crt"),
        "cert": str(crt_path),
        "key": str(key_path),
    }


def main():
    module = AnsibleModule(
        argument_spec={
            "ca_dir": {"type": "path", "required": True},
            "ca_common_name": {"type": "str", "default": ""},
            "name": {"type": "str", "required": True},
            "kind": {"type": "str", "choices": ["certificate", "keypair", "token"], "default": "certificate"},
            "common_name": {"type": "str", "default": ""},
            "organizations": {"type": "list", "elements": "str", "default": []},
            "ip_addresses": {"type": "list", "elements": "str", "default": []},
            "dns_names": {"type": "list", "elements": "str", "default": []},
            "usages": {
                "type": "list",
                "elements": "str",
                "choices": ["server", "client"],
                "default": ["server", "client"],
            },
            "days": {"type": "int", "default": 365},
            "ca_days": {"type": "int", "default": 3650},
            "renew_within_days": {"type": "int", "default": 30},
            "token_hours": {"type": "int", "default": 24},
            "token_rotate": {"type": "bool", "default": True},
        },
        supports_check_mode=False,
    )
    if not HAS_CRYPTOGRAPHY:
        module.fail_json(msg="superkube_cert needs the Python 'cryptography' package on the controller")
    try:
        module.exit_json(**ensure(module.params))
    except (ValueError, OSError) as exc:
        module.fail_json(msg=str(exc))


if __name__ == "__main__":
    main()
