"""The in-cluster layer applied to the lab's real API server (`superkube lab apply`).

In production `pulumi up` creates these objects through pulumi-kubernetes. The lab has no Pulumi
engine, so it applies the very objects the plan holds for them (what `superkube render` writes)
with `kubectl apply --server-side`, component by component in the plan's order, through the API
servers' load-balancer address with the admin kubeconfig converge wrote. A file the server refuses
stops the run with the server's own words; CustomResourceDefinitions must reach Established before
the next file (whose objects may be of their kinds) is applied.
"""

from __future__ import annotations

import base64
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from superkube.cluster import render
from superkube.cluster.render import SECRET
from superkube.lab import agent_pods
from superkube.lab.errors import LabError
from superkube.lab.state import LAB_STACK, SWITCH, Lab
from superkube.model import teams

FIELD_MANAGER = "superkube"
ESTABLISHED_TIMEOUT_S = 60


@dataclass
class Applied:
    file: str
    objects: list[str]  # kind/name as kubectl names them
    established: list[str]  # the CustomResourceDefinitions it waited for
    seconds: float


def admin_kubeconfig(lab: Lab) -> Path:
    path = Path(lab.state_dir) / "pki" / "admin.kubeconfig"
    if not path.is_file():
        raise LabError(f"{path} is missing: run `superkube converge --inventory {lab.inventory}` first")
    return path


def kubectl(lab: Lab) -> list[str]:
    """The lab's own kubectl (the pinned release, from its build) as the admin, run where the hosts
    are reachable: the switch namespace, which holds the load balancer's frontend."""
    if "kubectl" not in lab.builds:
        raise LabError("the lab has no kubectl build: run `superkube lab build`, then lab down and up")
    return [
        "ip",
        "netns",
        "exec",
        SWITCH,
        lab.builds["kubectl"]["path"],
        "--kubeconfig",
        str(admin_kubeconfig(lab)),
    ]


def webhook_bundle(lab: Lab) -> str:
    """The team webhook's certificate, key and CA that converge wrote: in production the operator
    gives it to Pulumi (`pulumi config set --secret`), here the plan is run with it."""
    path = Path(lab.state_dir) / "pki" / "team-webhook.pem"
    if not path.is_file():
        raise LabError(f"{path} is missing: run `superkube converge --inventory {lab.inventory}` first")
    return path.read_text()


def _with_secret_data(obj: dict[str, Any], bundle: str) -> dict[str, Any]:
    """The object as Pulumi would send it: the plan shows a secret's data empty (or SECRET), and the one
    secret the layer holds is the webhook's TLS key pair (a kubernetes.io/tls Secret), from `bundle`."""
    data = obj.get("data")
    held = data in (SECRET, {}) or (isinstance(data, dict) and SECRET in data.values())  # {}: redacted
    if obj.get("kind") != "Secret" or not held:
        return obj
    if obj.get("type") != "kubernetes.io/tls":
        raise LabError(f"{render.name_of(obj)}: holds a secret the lab has no value for")
    cert, key, _ = teams.split_bundle(bundle)
    encoded = {"tls.crt": cert, "tls.key": key}
    return {**obj, "data": {k: base64.b64encode(v.encode()).decode() for k, v in encoded.items()}}


def _run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


def _last_line(proc: subprocess.CompletedProcess[str]) -> str:
    """kubectl's last error line; with none (a kubectl that died), its exit status and what it had done."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    if lines:
        return lines[-1].strip()
    done = [line for line in proc.stdout.splitlines() if line.strip()]
    return f"kubectl exited {proc.returncode} with no error" + (f" after {done[-1].strip()}" if done else "")


def _stood_in(obj: dict[str, Any]) -> bool:
    """An object the lab has no GPUs for, and so leaves out (`agent_pods.left_out`)."""
    return agent_pods.left_out(obj)


def apply(
    lab: Lab, progress: Callable[[str], None], project: Path | None = None, stack: str = LAB_STACK
) -> list[Applied]:
    """Render the stack's in-cluster layer and apply it, file by file; raise LabError on a refusal."""
    from superkube.plan import engine as planning
    from superkube.plan import layer

    client = kubectl(lab)
    bundle = webhook_bundle(lab)
    progress(f"planning stack {stack}")
    plan = planning.run(project or planning.find_project(), stack, secrets={teams.WEBHOOK_TLS_KEY: bundle})
    by_component = {
        c: [_with_secret_data(agent_pods.lab_only(o, lab.images), bundle) for o in objs if not _stood_in(o)]
        for c, objs in layer.objects(plan).items()
    }
    if not by_component:
        raise LabError(f"stack {stack} has no in-cluster layer (superkube:in_cluster_layer is false)")
    found = layer.problems(plan, plan.spec.kubernetes_version)
    if found:
        raise LabError(f"{len(found)} invalid object(s), the first: {found[0]}; see `superkube render`")
    names = layer.file_names(list(by_component))
    done: list[Applied] = []
    with tempfile.TemporaryDirectory(prefix="superkube-layer-") as tmp:
        for component, objs in by_component.items():
            started = time.monotonic()
            path = Path(tmp) / names[component]
            path.write_text(render.to_yaml(objs))
            progress(f"{names[component]}: applying {len(objs)} objects")
            proc = _run(
                [
                    *client,
                    "apply",
                    "--server-side",
                    f"--field-manager={FIELD_MANAGER}",
                    "-o",
                    "name",
                    "-f",
                    str(path),
                ]
            )
            if proc.returncode != 0:
                raise LabError(f"{names[component]}: the API server refused it: {_last_line(proc)}")
            crds = [
                f"crd/{o['metadata']['name']}" for o in objs if o.get("kind") == "CustomResourceDefinition"
            ]
            if crds:
                progress(f"{names[component]}: waiting for {len(crds)} CustomResourceDefinitions")
                wait = _run(
                    [
                        *client,
                        "wait",
                        "--for=condition=Established",
                        f"--timeout={ESTABLISHED_TIMEOUT_S}s",
                        *crds,
                    ],
                    timeout=ESTABLISHED_TIMEOUT_S + 30,
                )
                if wait.returncode != 0:
                    raise LabError(
                        f"{names[component]}: not Established in {ESTABLISHED_TIMEOUT_S} s: {_last_line(wait)}"
                    )
            done.append(
                Applied(
                    names[component],
                    proc.stdout.split(),
                    [c.removeprefix("crd/") for c in crds],
                    time.monotonic() - started,
                )
            )
    return done
