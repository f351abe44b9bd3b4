"""`superkube lab apply` offline: what it sends for the layer's one secret, and its one-line refusals.
Applying to a real API server is tests/lab/test_running_control_plane.py."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from typer.testing import CliRunner

from superkube.cli import app
from superkube.lab import hosts as lab
from superkube.lab import layer
from superkube.lab.errors import LabError
from tests import tls


def test_the_webhooks_tls_secret_gets_the_converged_bundle(tmp_path: Path) -> None:
    files = tls.issue(tmp_path)
    bundle = "".join(files[n].read_text() for n in ("cert", "key", "ca"))
    redacted = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls", "data": {}}
    sent = layer._with_secret_data(redacted, bundle)
    decoded = {k: base64.b64decode(v).decode() for k, v in sent["data"].items()}
    assert decoded["tls.crt"].strip() == files["cert"].read_text().strip()
    assert "PRIVATE KEY" in decoded["tls.key"] and "CERTIFICATE" not in decoded["tls.key"]
    # other objects pass untouched; a secret of another kind is one clear refusal, not a guess
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "data": {"k": "v"}}
    assert layer._with_secret_data(config_map, bundle) is config_map
    opaque = {**redacted, "type": "Opaque", "metadata": {"name": "x", "namespace": "n"}}
    with pytest.raises(LabError, match="holds a secret the lab has no value for"):
        layer._with_secret_data(opaque, bundle)


def test_lab_apply_without_a_lab_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lab.Lab, "load", classmethod(lambda cls, state_dir=None: None))
    result = CliRunner().invoke(app, ["lab", "apply"])
    assert result.exit_code == 2  # a usage error, as every command's missing prerequisite
    assert result.stderr.strip().splitlines() == [
        "error: no lab is up; run `superkube lab up` and `superkube converge` first"
    ]


def test_lab_apply_before_converge_says_to_converge(tmp_path: Path) -> None:
    fleet = lab.Lab(
        hosts=[],
        subnets=[],
        state_dir=str(tmp_path),
        base_image="",
        builds={"kubectl": {"path": "/nonexistent/kubectl", "sha256": "", "version": "v1.35.0"}},
    )
    with pytest.raises(LabError, match=r"admin.kubeconfig is missing: run `superkube converge --inventory "):
        layer.kubectl(fleet)
    with pytest.raises(LabError, match="the lab has no kubectl build: run `superkube lab build`"):
        layer.kubectl(lab.Lab(hosts=[], subnets=[], state_dir=str(tmp_path), base_image=""))
