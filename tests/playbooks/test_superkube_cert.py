"""The controller-side PKI module: a CA made once and kept, certificates re-issued only for cause."""

from __future__ import annotations

import importlib.util
import ssl
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

ROOT = Path(__file__).resolve().parents[2]


def _load() -> Any:
    spec = importlib.util.spec_from_file_location(
        "superkube_cert", ROOT / "playbooks/library/superkube_cert.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["superkube_cert"] = module
    spec.loader.exec_module(module)
    return module


cert_module = _load()


def params(tmp: Path, **over: Any) -> dict[str, Any]:
    base = {
        "ca_dir": str(tmp / "pki"),
        "ca_common_name": "test etcd CA",
        "name": "main-etcd-1",
        "common_name": "etcd-1",
        "ip_addresses": ["10.0.0.5", "127.0.0.1"],
        "dns_names": ["etcd-1", "localhost"],
        "usages": ["server", "client"],
        "days": 365,
        "ca_days": 3650,
        "renew_within_days": 30,
    }
    return {**base, **over}


def read(path: str) -> bytes:
    return Path(path).read_bytes()


def test_first_run_makes_the_ca_and_a_cert_that_verifies(tmp_path: Path) -> None:
    result = cert_module.ensure(params(tmp_path))
    assert result["changed"] and result["ca_created"]
    ca = x509.load_pem_x509_certificate(read(result["ca"]))
    cert = x509.load_pem_x509_certificate(read(result["cert"]))
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sorted(str(i) for i in sans.get_values_for_type(x509.IPAddress)) == ["10.0.0.5", "127.0.0.1"]
    assert oct(Path(result["key"]).stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / "pki" / "ca.key").stat().st_mode & 0o777) == "0o600"
    # the pair is usable as TLS material
    ssl.create_default_context().load_cert_chain(result["cert"], result["key"])


def test_a_second_run_changes_nothing(tmp_path: Path) -> None:
    first = cert_module.ensure(params(tmp_path))
    before = {p: read(first[p]) for p in ("ca", "cert", "key")}
    again = cert_module.ensure(params(tmp_path))
    assert not again["changed"] and again["reissued_because"] is None
    assert {p: read(again[p]) for p in ("ca", "cert", "key")} == before


def test_changed_names_reissue_the_cert_but_keep_the_ca_and_key(tmp_path: Path) -> None:
    first = cert_module.ensure(params(tmp_path))
    ca, key, cert = read(first["ca"]), read(first["key"]), read(first["cert"])
    moved = cert_module.ensure(params(tmp_path, ip_addresses=["10.0.0.6", "127.0.0.1"]))
    assert moved["changed"] and not moved["ca_created"]
    assert moved["reissued_because"] == "subject alternative names changed"
    assert read(moved["ca"]) == ca and read(moved["key"]) == key and read(moved["cert"]) != cert


def test_a_cert_near_expiry_is_renewed(tmp_path: Path) -> None:
    cert_module.ensure(params(tmp_path, days=10))
    renewed = cert_module.ensure(params(tmp_path, days=365))
    assert renewed["reissued_because"] == "expires soon"


def test_a_cert_from_another_ca_is_replaced(tmp_path: Path) -> None:
    other = cert_module.ensure(params(tmp_path, ca_dir=str(tmp_path / "other"), ca_common_name="another CA"))
    cert_module.ensure(params(tmp_path))
    target = tmp_path / "pki" / "main-etcd-1"
    target.with_suffix(".crt").write_bytes(read(other["cert"]))
    target.with_suffix(".key").write_bytes(read(other["key"]))
    fixed = cert_module.ensure(params(tmp_path))
    assert fixed["reissued_because"] == "not issued by this CA"


def test_half_a_ca_is_refused_rather_than_replaced(tmp_path: Path) -> None:
    cert_module.ensure(params(tmp_path))
    (tmp_path / "pki" / "ca.key").unlink()
    with pytest.raises(ValueError, match="restore the missing file"):
        cert_module.ensure(params(tmp_path))


def test_concurrent_runs_share_one_ca(tmp_path: Path) -> None:
    results: list[dict[str, Any]] = []
    threads = [
        threading.Thread(
            target=lambda i=i: results.append(cert_module.ensure(params(tmp_path, name=f"m{i}")))
        )
        for i in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r["ca_created"] for r in results) == 1
    ca = x509.load_pem_x509_certificate(read(results[0]["ca"]))
    for r in results:
        x509.load_pem_x509_certificate(read(r["cert"])).verify_directly_issued_by(ca)


def test_organizations_are_the_kubernetes_groups_and_a_change_reissues(tmp_path: Path) -> None:
    first = cert_module.ensure(
        params(tmp_path, name="admin", common_name="superkube-admin", organizations=["system:masters"])
    )
    cert = x509.load_pem_x509_certificate(read(first["cert"]))
    groups = [a.value for a in cert.subject.get_attributes_for_oid(x509.oid.NameOID.ORGANIZATION_NAME)]
    assert groups == ["system:masters"]
    assert not cert_module.ensure(
        params(tmp_path, name="admin", common_name="superkube-admin", organizations=["system:masters"])
    )["changed"]
    again = cert_module.ensure(params(tmp_path, name="admin", common_name="superkube-admin"))
    assert again["reissued_because"] == "organizations changed"


def test_a_key_pair_is_made_once_and_its_public_half_matches(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    first = cert_module.ensure(params(tmp_path, kind="keypair", name="service-account"))
    assert first["changed"]
    key = serialization.load_pem_private_key(read(first["key"]), password=None)
    public = serialization.load_pem_public_key(read(first["pub"]))
    assert key.public_key().public_numbers() == public.public_numbers()  # type: ignore[union-attr]
    again = cert_module.ensure(params(tmp_path, kind="keypair", name="service-account"))
    assert not again["changed"] and read(again["key"]) == read(first["key"])
    assert oct(Path(first["key"]).stat().st_mode & 0o777) == "0o600"


def test_a_bootstrap_token_expires_and_is_made_again_when_half_its_life_is_gone(tmp_path: Path) -> None:
    import datetime

    utc = datetime.UTC
    start = datetime.datetime(2026, 11, 27, 12, 0, tzinfo=utc)
    pki = tmp_path / "pki"
    pki.mkdir()
    first = cert_module._ensure_token(pki, "bootstrap", 24, now=start)
    assert first["changed"] and first["expires"] == "2026-11-28T12:00:00Z"
    assert (pki / "bootstrap.token.expires").read_text().strip() == "2026-11-28T12:00:00Z"
    later = cert_module._ensure_token(pki, "bootstrap", 24, now=start + datetime.timedelta(hours=11))
    assert not later["changed"] and later["token_id"] == first["token_id"]
    # with less than half of its day left, a converge that reaches an API server makes the next one
    due = start + datetime.timedelta(hours=13)
    kept = cert_module._ensure_token(pki, "bootstrap", 24, now=due, rotate=False)
    assert not kept["changed"] and kept["token_id"] == first["token_id"]
    rotated = cert_module._ensure_token(pki, "bootstrap", 24, now=due)
    assert rotated["changed"] and rotated["token_id"] != first["token_id"]
    assert rotated["expires"] == "2026-11-29T01:00:00Z"
    # a token an older release made has no expiry on record: it is replaced at once
    (pki / "bootstrap.token.expires").unlink()
    again = cert_module._ensure_token(pki, "bootstrap", 24, now=start + datetime.timedelta(hours=14))
    assert again["changed"] and again["token_id"] != rotated["token_id"]
    with pytest.raises(ValueError, match="a bootstrap token must expire"):
        cert_module._ensure_token(pki, "bootstrap", 0)


def test_a_bootstrap_token_is_made_once_in_the_kubernetes_form(tmp_path: Path) -> None:
    import re

    first = cert_module.ensure(params(tmp_path, kind="token", name="bootstrap"))
    token = Path(first["token_file"]).read_text().strip()
    assert re.fullmatch(r"[a-z0-9]{6}\.[a-z0-9]{16}", token) and first["token_id"] == token[:6]
    assert not cert_module.ensure(params(tmp_path, kind="token", name="bootstrap"))["changed"]
    Path(first["token_file"]).write_text("not-a-token\n")
    with pytest.raises(ValueError, match="not a bootstrap token"):
        cert_module.ensure(params(tmp_path, kind="token", name="bootstrap"))
