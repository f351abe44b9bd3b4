"""The scheduling harness with the workload controllers asked for (`gang.WORKLOAD_CONTROLLERS`): a
Deployment's pods are made and placed on kwok nodes, and a PodDisruptionBudget gets the status that
the Eviction API and cluster-autoscaler's scale-down read (what bench/scale_down.py stands on)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from superkube.harness import apiserver, kwok
from superkube.harness import gang as gang_lab
from superkube.plan import checks
from superkube.plan.engine import Plan

NAMESPACE = "guarded"
WAIT_S = 120.0


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, flagship_plan: Plan) -> Iterator[apiserver.LocalApi]:
    work: Path = tmp_path_factory.mktemp("workload-controllers")
    config, flags = gang_lab.scheduler(checks.plan_wiring(flagship_plan))
    controllers = (*gang_lab.CONTROLLER_MANAGER, *gang_lab.WORKLOAD_CONTROLLERS)
    with (
        apiserver.running(work / "api") as running,
        gang_lab.scheduling(running, work / "sched", gang_lab.default_profile(config), flags,
                            controllers=controllers),
        kwok.running(running.kubeconfig, work / "kwok"),
    ):  # fmt: skip
        gang_lab.register(running, [gang_lab.cpu_node(f"cpu-{i}") for i in range(2)])
        apiserver.kubectl(running, "create", "namespace", NAMESPACE)
        yield running


def get(api: apiserver.LocalApi, *args: str) -> Any:
    return json.loads(apiserver.kubectl(api, "get", *args, "-o", "json"))


def test_a_deployments_pods_are_placed_and_its_budget_refuses_an_eviction(api: apiserver.LocalApi) -> None:
    labels = {"app": "guarded"}
    objects = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "guarded", "namespace": NAMESPACE},
         "spec": {"replicas": 2, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels},
                               "spec": {"automountServiceAccountToken": False,
                                        "containers": [{"name": "c", "image": "pause",
                                                        "resources": {"requests": {"cpu": "1"}}}]}}}},
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "guarded", "namespace": NAMESPACE},
         "spec": {"maxUnavailable": 0, "selector": {"matchLabels": labels}}},
    ]  # fmt: skip
    apiserver.kubectl(api, "create", "serviceaccount", "default", "-n", NAMESPACE)  # no controller makes it
    apiserver.kubectl(api, "create", "-f", "-",
                      stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))  # fmt: skip

    def placed() -> list[str]:
        pods = get(api, "pods", "-n", NAMESPACE)["items"]
        names = [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")]
        return names if len(names) == 2 else []

    names = gang_lab.wait_for("the Deployment's two pods bound", placed, WAIT_S)
    status = gang_lab.wait_for(
        "the budget's status",
        lambda: (
            (get(api, "pdb", "guarded", "-n", NAMESPACE).get("status") or {}).get("expectedPods") == 2
            and get(api, "pdb", "guarded", "-n", NAMESPACE)["status"]
        ),
        WAIT_S,
    )
    assert status["disruptionsAllowed"] == 0
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": names[0], "namespace": NAMESPACE},
    }
    with pytest.raises(subprocess.CalledProcessError) as refused:
        apiserver.kubectl(api, "create", "--raw", f"/api/v1/namespaces/{NAMESPACE}/pods/{names[0]}/eviction",
                          "-f", "-", stdin=json.dumps(eviction))  # fmt: skip
    assert "disruption budget" in refused.value.stderr
