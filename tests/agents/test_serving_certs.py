"""The kubelet serving-certificate approver against the real API server: requests made as a node (the
server records who asked), approved only when the subject is that node and every address is one
its Node has; denied with the reason otherwise; waiting while the Node is not registered; and the
process, as its own service account with the layer's role, allowed to approve nothing but the
kubelet-serving signer's requests."""

from __future__ import annotations

import base64
import ipaddress
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from modules.platform import serving_certs as component
from modules.platform.foundation import NAMESPACE
from superkube.agents import serving_certs as sc
from superkube.agents.kubeapi import Kube
from superkube.cluster.kube import SERVING_CERTS_MODULE
from superkube.harness import apiserver
from superkube.harness.apiserver import LocalApi, free_port
from tests.agents.conftest import admin, apply, identity, make_node, namespace, unique

SERVER_USAGES = ["digital signature", "server auth"]  # what a kubelet asks for with an ECDSA key


def request_pem(cn: str, org: str = sc.NODES_GROUP, ips: tuple[str, ...] = (), dns: tuple[str, ...] = (),
                emails: tuple[str, ...] = ()) -> str:  # fmt: skip
    """A PKCS#10 request as a kubelet makes it (a fresh P-256 key, the node's subject and SANs)."""
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    names += [x509.DNSName(d) for d in dns] + [x509.RFC822Name(e) for e in emails]
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name(
            [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org), x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        )
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode()


def ask(api: LocalApi, pem: str, as_node: str | None, usages: list[str] = SERVER_USAGES,
        signer: str = sc.SIGNER) -> str:  # fmt: skip
    """Create the request as node `as_node` (None: as the admin); its name."""
    name = unique("csr")
    body = {"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
            "metadata": {"name": name},
            "spec": {"request": base64.b64encode(pem.encode()).decode(), "signerName": signer, "usages": usages}}  # fmt: skip
    who = ["--as", f"{sc.NODE_USER}{as_node}", "--as-group", sc.NODES_GROUP] if as_node else []
    apiserver.kubectl(api, "create", "-f", "-", *who, stdin=json.dumps(body))
    return name


def node_with_addresses(api: LocalApi, name: str, ip: str) -> None:
    make_node(api, name)
    status = {
        "status": {
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}]
        }
    }
    admin(api).patch_node_status(name, status)


def state(api: LocalApi, name: str) -> tuple[str, str]:
    """(Approved, Denied or '', its message) as the server holds the request."""
    from kubernetes import client

    csr = client.CertificatesV1Api(admin(api).api_client).read_certificate_signing_request(name)
    for c in csr.status.conditions or []:
        if c.type in ("Approved", "Denied"):
            return c.type, c.message or ""
    return "", ""


def denials(metrics: sc.Metrics) -> dict[str, float | None]:
    """The denials counter's value for each reason."""
    return {
        r: metrics.registry.get_sample_value("superkube_serving_certs_denials_total", {"reason": r})
        for r in sc.DENIALS
    }


@pytest.fixture
def approver(api: LocalApi) -> Iterator[sc.Approver]:
    stop = threading.Event()
    one = sc.Approver(sc.Client(Kube(str(api.kubeconfig)), stop))
    yield one
    stop.set()
    one.client.watch.close()


def test_a_nodes_own_addresses_are_approved(api: LocalApi, approver: sc.Approver) -> None:
    node = unique("kubelet")
    node_with_addresses(api, node, "10.65.0.4")
    name = ask(api, request_pem(f"{sc.NODE_USER}{node}", ips=("10.65.0.4",), dns=(node,)), as_node=node)
    approver.round()
    assert state(api, name) == ("Approved", f"approved: the addresses of node {node}")
    events = admin(api).list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
    assert [e.reason for e in events] == ["ServingCertificateApproved"]


@pytest.mark.parametrize(
    ("case", "words", "reason"),
    [
        ("another node's address", "IP 10.65.0.9 is not one of node", "ip_address"),
        ("another node's name", "DNS name kubelet-elsewhere is not one of node", "dns_name"),
        ("another organization", "is not CN=system:node:", "subject"),
        ("an e-mail address", "other than IP addresses and DNS names", "san_type"),
        ("no address", "names no address", "no_address"),
        ("client usages", "usages ['client auth', 'digital signature'] are not server auth", "usages"),
        ("asked by a user", "not by a node", "requester"),
    ],
)
def test_anything_else_is_denied_with_the_reason(
    api: LocalApi, approver: sc.Approver, case: str, words: str, reason: str
) -> None:
    node = unique("kubelet")
    node_with_addresses(api, node, "10.65.0.4")
    cn, as_node, usages = f"{sc.NODE_USER}{node}", node, SERVER_USAGES
    ips: tuple[str, ...] = ("10.65.0.4",)
    dns: tuple[str, ...] = ()
    emails: tuple[str, ...] = ()
    org = sc.NODES_GROUP
    if case == "another node's address":
        ips = ("10.65.0.4", "10.65.0.9")
    elif case == "another node's name":
        dns = ("kubelet-elsewhere",)
    elif case == "another organization":
        org = "system:masters"
    elif case == "an e-mail address":
        emails = ("root@example.com",)
    elif case == "no address":
        ips = ()
    elif case == "client usages":
        usages = ["digital signature", "client auth"]
    elif case == "asked by a user":
        as_node = None
    name = ask(api, request_pem(cn, org, ips, dns, emails), as_node, usages)
    approver.round()
    kind, message = state(api, name)
    assert kind == "Denied" and words in message, message
    # counted once, under its check's fixed reason
    assert denials(approver.metrics) == {**dict.fromkeys(sc.DENIALS, 0.0), reason: 1.0}


def test_a_request_for_another_nodes_name_is_refused_by_the_server_and_would_be_denied(api: LocalApi) -> None:
    """The server itself refuses a node's request in another node's name (NodeRestriction); the
    approver's check denies it too, for a server without that admission."""
    node = unique("kubelet")
    node_with_addresses(api, node, "10.65.0.4")
    pem = request_pem(f"{sc.NODE_USER}kubelet-elsewhere", ips=("10.65.0.4",))
    with pytest.raises(subprocess.CalledProcessError) as refused:
        ask(api, pem, as_node=node)
    assert f"can only create a node CSR with CN={sc.NODE_USER}{node}" in refused.value.stderr
    csr = {"metadata": {"name": "x"}, "spec": {"signerName": sc.SIGNER, "username": f"{sc.NODE_USER}{node}",
           "groups": [sc.NODES_GROUP], "usages": SERVER_USAGES, "request": base64.b64encode(pem.encode()).decode()}}  # fmt: skip
    assert "is not CN=system:node:" + node in sc.check(csr, Kube(str(api.kubeconfig)).node)


def test_a_request_before_its_node_waits_then_is_approved(api: LocalApi, approver: sc.Approver) -> None:
    node = unique("kubelet")
    name = ask(api, request_pem(f"{sc.NODE_USER}{node}", ips=("10.65.0.5",)), as_node=node)
    approver.round()
    assert state(api, name) == ("", "") and approver.metrics.waiting._value.get() >= 1
    node_with_addresses(api, node, "10.65.0.5")
    approver.round()
    assert state(api, name)[0] == "Approved"


def test_the_process_approves_as_its_own_account_and_only_that_signer(api: LocalApi, tmp_path: Path) -> None:
    """With the layer's role: a kubelet-serving request approved; approving a client certificate's
    request with the same identity is refused by the server (the role names one signer)."""
    from kubernetes import client, config

    if NAMESPACE not in {n.metadata.name for n in admin(api).list_namespace().items}:
        namespace(api, NAMESPACE)
    apply(api, *[m for m in component.manifests(component.ServingCertsArgs()) if m["kind"] != "Deployment"])
    node = unique("kubelet")
    node_with_addresses(api, node, "10.65.0.6")
    name = ask(api, request_pem(f"{sc.NODE_USER}{node}", ips=("10.65.0.6",), dns=(node,)), as_node=node)
    kubeconfig = identity(api, NAMESPACE, component.NAME, node)
    command = [sys.executable, "-m", SERVING_CERTS_MODULE, "--kubeconfig", str(kubeconfig),
               "--metrics-port", str(free_port()), "--metrics-address", "127.0.0.1", "--interval", "0.2",
               "--rounds", "1"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and "refused" not in done.stderr, done.stderr
    assert state(api, name)[0] == "Approved"
    other = ask(api, request_pem(f"{sc.NODE_USER}{node}"), as_node=node, usages=["digital signature", "client auth"],
                signer="kubernetes.io/kube-apiserver-client-kubelet")  # fmt: skip
    certs = client.CertificatesV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
    csr = certs.read_certificate_signing_request(other)
    body = sc.decision(certs.api_client.sanitize_for_serialization(csr), "Approved", "not mine to approve")
    with pytest.raises(client.exceptions.ApiException) as refused:
        certs.replace_certificate_signing_request_approval(other, body)
    assert refused.value.status == 403 and "kube-apiserver-client-kubelet" in refused.value.body


def test_a_decision_the_other_replica_made_first_is_skipped(api: LocalApi, approver: sc.Approver) -> None:
    """Two replicas: the one that read the request before the other approved it writes on a stale
    resourceVersion; the server answers 409 and the round goes on, the request approved once."""
    from kubernetes import client

    node = unique("kubelet")
    node_with_addresses(api, node, "10.65.0.7")
    name = ask(api, request_pem(f"{sc.NODE_USER}{node}", ips=("10.65.0.7",)), as_node=node)
    certs = client.CertificatesV1Api(admin(api).api_client)
    stale = [certs.api_client.sanitize_for_serialization(certs.read_certificate_signing_request(name))]
    approver.round()  # the other replica
    assert state(api, name)[0] == "Approved"

    class AsRead:
        def requests(self) -> list[dict[str, Any]]:
            return stale

        def __getattr__(self, attr: str) -> Any:
            return getattr(approver.client, attr)

    assert sc.Approver(AsRead()).round() == {}
    conditions = certs.read_certificate_signing_request(name).status.conditions
    assert [c.type for c in conditions] == ["Approved"]


def test_a_request_that_cannot_be_read_is_denied_and_the_round_goes_on() -> None:
    """Bytes no certificate library reads are a denial with the reason, never the approver's end."""
    garbage = "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"
    csr = {"metadata": {"name": "x"}, "spec": {"signerName": sc.SIGNER, "username": f"{sc.NODE_USER}n",
           "groups": [sc.NODES_GROUP], "usages": SERVER_USAGES, "request": base64.b64encode(garbage.encode()).decode()}}  # fmt: skip
    assert sc.check(csr, lambda name: None).startswith("its request cannot be read")


class OneRequest:
    """The approver's calls answered from memory: one request, no Node, the decisions it wrote."""

    def __init__(self, csr: dict[str, Any]) -> None:
        self.csr = csr
        self.decided: list[str] = []
        self.events: list[dict[str, Any]] = []

    def requests(self) -> list[dict[str, Any]]:
        return [self.csr] if not self.decided else []

    def node(self, name: str) -> dict[str, Any] | None:
        return None

    def decide(self, name: str, body: dict[str, Any]) -> None:
        self.decided.append(body["status"]["conditions"][-1]["type"])

    def create_event(self, body: dict[str, Any]) -> None:
        self.events.append(body)


def test_an_unreadable_request_is_counted_as_one_denial_of_its_reason() -> None:
    garbage = "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"
    csr = {"metadata": {"name": "x"}, "spec": {"signerName": sc.SIGNER, "username": f"{sc.NODE_USER}n",
           "groups": [sc.NODES_GROUP], "usages": SERVER_USAGES, "request": base64.b64encode(garbage.encode()).decode()}}  # fmt: skip
    client = OneRequest(csr)
    approver = sc.Approver(client)
    assert approver.round() == {"denied": 1} and client.decided == ["Denied"]
    assert denials(approver.metrics) == {**dict.fromkeys(sc.DENIALS, 0.0), "unreadable": 1.0}
    assert (
        approver.metrics.registry.get_sample_value("superkube_serving_certs_total", {"decision": "denied"})
        == 1
    )
    assert approver.round() == {} and denials(approver.metrics)["unreadable"] == 1.0  # decided: not again
    dry = sc.Approver(OneRequest(csr), dry_run=True)  # a dry run decides nothing, so counts nothing
    assert dry.round() == {"denied": 1} and set(denials(dry.metrics).values()) == {0.0}


def test_every_reason_the_checks_give_is_one_of_the_fixed_set() -> None:
    """The denials counter's reason label takes only DENIALS' keys, and each is a check's: the first
    element of every denial `verdict` returns, read from its source."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(sc.verdict)))
    given = {
        node.value.elts[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple)
        and isinstance(node.value.elts[0], ast.Constant)
    }  # fmt: skip
    assert given - {""} == set(sc.DENIALS)
