"""One etcd and one kube-apiserver on loopback, from the pinned build: the real API server for tests
and benchmarks that need what the server does (patch semantics, conflicts, RBAC, NodeRestriction,
admission policies and webhooks, evictions) but not a whole lab of hosts. It starts in seconds.

The server runs with the production role's authorization and admission (Node,RBAC; NodeRestriction;
bootstrap tokens; service-account tokens bound to pods, which carry the pod's node name), on
addresses and ports of 127.0.0.1 only. No controller-manager runs: a test creates the service
accounts, nodes and pods it needs, and mints tokens with the TokenRequest API, as the kubelet does
for a pod.

    with apiserver.running(workdir) as api:
        api.kubeconfig            # cluster-admin (system:masters), a client certificate
        api.token_kubeconfig(...) # a service account's identity, bound to a pod on a node
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from superkube.harness import build

SERVICE_CIDR = "10.96.0.0/24"
ISSUER = "https://kubernetes.default.svc"
READY_TIMEOUT_S = 60.0
_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]


# every request, who made it and what it asked (not the bodies): what tests count an agent's requests by
KWOK_NAMESPACE, KWOK_ACCOUNT = "kube-system", "kwok"
KWOK_USER = f"system:serviceaccount:{KWOK_NAMESPACE}:{KWOK_ACCOUNT}"
"""the simulated kubelets' identity (`superkube.harness.kwok`): at thousands of nodes their Lease renewals
would flood the audit log that requests are counted from, so they are not audited"""
ADMIN_USER = "superkube-admin"  # the admin kubeconfig's user, as the audit log names it

AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    users: ["{KWOK_USER}"]
  - level: Metadata
"""


class ApiServerError(Exception):
    """The local control plane could not start: one line, with where its log is."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _openssl(d: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)


def _issue(d: Path, name: str, subject: str, ext: str) -> None:
    _openssl(d, "req", *_KEY, "-subj", subject, "-keyout", f"{name}.key", "-out", f"{name}.csr")
    (d / f"{name}.cnf").write_text(ext)
    _openssl(d, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-extfile", f"{name}.cnf", "-out", f"{name}.crt")  # fmt: skip


def pki(d: Path) -> None:
    """A CA; the server's certificate for 127.0.0.1; an admin client certificate; the service
    account signing key pair."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl(d, "req", "-x509", *_KEY, "-days", "2", "-subj", "/CN=superkube local CA",
             "-keyout", "ca.key", "-out", "ca.crt")  # fmt: skip
    _issue(d, "apiserver", "/CN=kube-apiserver",
           "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")  # fmt: skip
    _issue(d, "admin", f"/O=system:masters/CN={ADMIN_USER}", "extendedKeyUsage=clientAuth\n")
    _openssl(d, "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "sa.key")
    _openssl(d, "pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub")


def kubeconfig(path: Path, url: str, ca: Path, user: dict[str, str]) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": url, "certificate-authority": str(ca)}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "user"}}],
        "current-context": "local",
    }
    path.write_text(json.dumps(doc, indent=2))
    return path


@dataclass
class LocalApi:
    """A running etcd and kube-apiserver (see the module doc)."""

    dir: Path
    url: str
    kubeconfig: Path
    kubectl: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _audited: list[dict[str, Any]] = field(default_factory=list, repr=False)  # the audit log read so far
    _audit_offset: int = field(default=0, repr=False)

    def token_kubeconfig(self, name: str, token: str) -> Path:
        """A kubeconfig that authenticates with `token` (a service account's, a bootstrap token)."""
        return kubeconfig(self.dir / f"{name}.kubeconfig", self.url, self.dir / "pki" / "ca.crt",
                          {"token": token})  # fmt: skip

    def client_kubeconfig(self, name: str, user: str, groups: Sequence[str] = ()) -> Path:
        """A kubeconfig with a client certificate the cluster CA signed for `user` in `groups`."""
        pk = self.dir / "pki"
        subject = "".join(f"/O={g}" for g in groups) + f"/CN={user}"
        _issue(pk, name, subject, "extendedKeyUsage=clientAuth\n")
        return kubeconfig(self.dir / f"{name}.kubeconfig", self.url, pk / "ca.crt",
                          {"client-certificate": str(pk / f"{name}.crt"),
                           "client-key": str(pk / f"{name}.key")})  # fmt: skip

    def start_controller_manager(self, controllers: Sequence[str], flags: Sequence[str] = ()) -> None:
        """kube-controller-manager from the same build, running only `controllers`, as the built-in
        `system:kube-controller-manager` user with each controller as its own service account (as the
        production role runs it), signing with the local CA: e.g. csrapproving and csrsigning, for
        kubelets' TLS bootstrap. `flags`: more of its flags, after these."""
        pk = self.dir / "pki"
        config = self.client_kubeconfig("controller-manager", "system:kube-controller-manager")
        binary = self.kubectl.parent / "kube-controller-manager"
        self.processes.append(_spawn(self.dir, "kube-controller-manager", [
            str(binary), f"--kubeconfig={config}", "--bind-address=127.0.0.1", "--secure-port=0",
            "--leader-elect=false", "--use-service-account-credentials=true",
            f"--controllers={','.join(controllers)}",
            f"--cluster-signing-cert-file={pk / 'ca.crt'}", f"--cluster-signing-key-file={pk / 'ca.key'}",
            "--profiling=false", *flags,
        ]))  # fmt: skip

    def requests(self, user: str) -> list[dict[str, Any]]:
        """The audited requests `user` made (each: verb, uri, code), in order. The log is read on from
        where the last call stopped: a benchmark may ask every tenth of a second of a long run."""
        path = self.dir / "audit.log"
        if path.exists():
            with path.open("rb") as log:
                log.seek(self._audit_offset)
                chunk = log.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]  # a line being written is read next time
            self._audit_offset += len(complete)
            for line in complete.splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                # a watch is counted when it starts (it completes only when it ends), anything else when done
                first = "ResponseStarted" if entry.get("verb") == "watch" else "ResponseComplete"
                if entry.get("stage") == first:
                    self._audited.append({
                        "user": entry.get("user", {}).get("username"),
                        "verb": entry.get("verb"),
                        "uri": entry.get("requestURI", ""),
                        "code": entry.get("responseStatus", {}).get("code"),
                    })  # fmt: skip
        return [{k: v for k, v in r.items() if k != "user"} for r in self._audited if r["user"] == user]

    def stop(self) -> None:
        for p in reversed(self.processes):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.processes):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.processes.clear()


def terminate(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM, then SIGKILL after `timeout_s`; nothing when it has already exited."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def die_with_parent() -> None:
    """In the child: SIGTERM when the process that started it dies, however it dies (a killed test
    run must not leave an API server behind)."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _spawn(d: Path, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
    with (d / f"{name}.log").open("wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=die_with_parent)  # fmt: skip


def _wait_ready(api: LocalApi, deadline: float) -> None:
    pk = api.dir / "pki"
    context = ssl.create_default_context(cafile=str(pk / "ca.crt"))
    context.load_cert_chain(str(pk / "admin.crt"), str(pk / "admin.key"))
    last = ""
    while time.monotonic() < deadline:
        for p in api.processes:
            if p.poll() is not None:
                name = Path(str(next(iter(p.args)))).name  # type: ignore[arg-type]
                raise ApiServerError(f"{name} exited with {p.returncode}; see its log in {api.dir}")
        try:
            with urllib.request.urlopen(f"{api.url}/readyz", context=context, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError) as e:
            last = str(e)
        time.sleep(0.2)
    raise ApiServerError(
        f"the local API server was not ready in {READY_TIMEOUT_S:.0f} s ({last}); see {api.dir}"
    )


def start(
    workdir: Path, progress: Callable[[str], None] = lambda line: None, flags: Sequence[str] = ()
) -> LocalApi:
    """Build (or find in the cache) etcd and Kubernetes at the pinned versions, then start them
    (`flags`: more kube-apiserver flags, after the ones above)."""
    wanted = [c for c in build.components() if c.name in ("etcd", "kubernetes")]
    built = {
        b.component.name: b for b in build.build_all(wanted, lambda label, what: progress(f"{label}: {what}"))
    }
    d = workdir
    pk = d / "pki"
    pki(pk)
    etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
    url = f"https://127.0.0.1:{api_port}"
    api = LocalApi(
        dir=d,
        url=url,
        kubeconfig=kubeconfig(
            d / "admin.kubeconfig",
            url,
            pk / "ca.crt",
            {"client-certificate": str(pk / "admin.crt"), "client-key": str(pk / "admin.key")},
        ),
        kubectl=built["kubernetes"].binary("kubectl"),
    )
    (d / "audit-policy.yaml").write_text(AUDIT_POLICY)
    etcd = f"http://127.0.0.1:{etcd_port}"
    peer = f"http://127.0.0.1:{peer_port}"
    try:  # whatever fails on the way, nothing is left running
        api.processes.append(_spawn(d, "etcd", [
            str(built["etcd"].binary("etcd")), "--name=local", f"--data-dir={d / 'etcd'}",
            f"--listen-client-urls={etcd}", f"--advertise-client-urls={etcd}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=local={peer}", "--unsafe-no-fsync", "--log-level=warn",
        ]))  # fmt: skip
        api.processes.append(_spawn(d, "kube-apiserver", [
            str(built["kubernetes"].binary("kube-apiserver")),
            f"--etcd-servers={etcd}", "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={api_port}",
            f"--tls-cert-file={pk / 'apiserver.crt'}", f"--tls-private-key-file={pk / 'apiserver.key'}",
            f"--client-ca-file={pk / 'ca.crt'}",
            f"--service-account-issuer={ISSUER}", f"--service-account-key-file={pk / 'sa.pub'}",
            f"--service-account-signing-key-file={pk / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            "--enable-bootstrap-token-auth=true", "--allow-privileged=true", "--profiling=false",
            "--endpoint-reconciler-type=none",
            f"--audit-policy-file={d / 'audit-policy.yaml'}", f"--audit-log-path={d / 'audit.log'}",
            "--audit-log-mode=blocking", "--audit-log-format=json", *flags,
        ]))  # fmt: skip
        _wait_ready(api, time.monotonic() + READY_TIMEOUT_S)
    except BaseException:
        api.stop()
        raise
    progress(f"API server ready at {url}")
    return api


@contextlib.contextmanager
def running(
    workdir: Path, progress: Callable[[str], None] = lambda line: None, flags: Sequence[str] = ()
) -> Iterator[LocalApi]:
    api = start(workdir, progress, flags)
    try:
        yield api
    finally:
        api.stop()


def kubectl(api: LocalApi, *args: str, stdin: str | None = None, check: bool = True) -> str:
    """kubectl as the admin; its stdout (raises CalledProcessError with its stderr when `check`)."""
    env = {**os.environ, "KUBECONFIG": str(api.kubeconfig)}
    done = subprocess.run([str(api.kubectl), *args], input=stdin, capture_output=True, text=True,
                          env=env, timeout=60, check=False)  # fmt: skip
    if check and done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, args, done.stdout, done.stderr)
    return done.stdout
