"""A throwaway CA and a serving certificate it signs, made with openssl: what the webhook's tests and
its benchmark serve TLS with, as kube_pki issues it in a cluster (a server certificate for the
webhook's Service names, from the cluster CA)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from superkube.cluster.kube import team_webhook_dns_names

_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]


def _openssl(d: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)


def issue(d: Path, days: int = 2) -> dict[str, Path]:
    """ca.crt, and tls.crt/tls.key for 127.0.0.1 and the team webhook's Service names, under `d`."""
    _openssl(
        d,
        "req",
        "-x509",
        *_KEY,
        "-days",
        str(days),
        "-subj",
        "/CN=test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    )
    names = team_webhook_dns_names()
    _openssl(d, "req", *_KEY, "-subj", f"/CN={names[0]}", "-keyout", "tls.key", "-out", "tls.csr")
    sans = ",".join(["IP:127.0.0.1", *(f"DNS:{n}" for n in names)])
    (d / "ext.cnf").write_text(f"subjectAltName={sans}\nextendedKeyUsage=serverAuth\n")
    _openssl(d, "x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", str(days), "-extfile", "ext.cnf", "-out", "tls.crt")  # fmt: skip
    return {"ca": d / "ca.crt", "cert": d / "tls.crt", "key": d / "tls.key"}
