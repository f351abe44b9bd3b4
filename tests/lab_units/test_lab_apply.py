"""`superkube lab apply` offline: what it sends for the layer's one secret, what it changes for the
lab's GPU-less nodes, and its one-line refusals.
Applying to a real API server is tests/lab/test_running_control_plane.py."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from modules.platform import gpu_devices, node_health, serving_certs
from superkube.agents import AGENTS_IMAGE, GPU_TESTS_IMAGE, gpu_probe
from superkube.cli import app
from superkube.lab import agent_pods, layer
from superkube.lab.errors import LabError
from superkube.lab.state import Lab
from superkube.plan import layer as plan_layer
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
    monkeypatch.setattr(Lab, "load", classmethod(lambda cls, state_dir=None: None))
    result = CliRunner().invoke(app, ["lab", "apply"])
    assert result.exit_code == 2  # a usage error, as every command's missing prerequisite
    assert result.stderr.strip().splitlines() == [
        "error: no lab is up; run `superkube lab up` and `superkube converge` first"
    ]


def test_lab_apply_before_converge_says_to_converge(tmp_path: Path) -> None:
    fleet = Lab(
        hosts=[],
        subnets=[],
        state_dir=str(tmp_path),
        base_image="",
        builds={"kubectl": {"path": "/nonexistent/kubectl", "sha256": "", "version": "v1.35.0"}},
    )
    with pytest.raises(LabError, match=r"admin.kubeconfig is missing: run `superkube converge --inventory "):
        layer.kubectl(fleet)
    with pytest.raises(LabError, match="the lab has no kubectl build: run `superkube lab build`"):
        layer.kubectl(Lab(hosts=[], subnets=[], state_dir=str(tmp_path), base_image=""))


IMAGES = {agent_pods.DEVICE_PLUGIN: {"ref": "superkube.local/lab-device-plugin:0123456789abcdef"}}


def test_a_lab_without_the_device_plugins_image_is_told_to_come_up_again(flagship_plan: Any) -> None:
    (plugin,) = [o for o in plan_layer.objects(flagship_plan)["gpu-devices"] if o["kind"] == "DaemonSet"]
    with pytest.raises(LabError, match="the lab has no lab-device-plugin image: run `superkube lab down`"):
        agent_pods.lab_only(plugin, {})


def test_the_lab_runs_the_layers_agents_with_only_its_listed_stand_ins(flagship_plan: Any) -> None:
    """superkube.lab.agent_pods' list, and nothing more: the GPU readings from a host file, preflight
    without the burn on the agents' image, rounds of seconds, the breaker for a two-node pool, no
    periodic GPU test. Every other object goes to the lab's API server as the plan holds it."""
    objects = [o for objs in plan_layer.objects(flagship_plan).values() for o in objs]
    changed = {}
    for obj in objects:
        lab_obj = agent_pods.lab_only(obj, IMAGES)
        if lab_obj != obj:
            changed[obj["metadata"]["name"]] = (obj, lab_obj)
    pools = [p.name for p in flagship_plan.spec.node_pools if p.role == "gpu"]
    cpu_pools = [p.name for p in flagship_plan.spec.node_pools if p.role == "cpu"]
    assert set(changed) == {
        node_health.HEALTH_CONTROLLER,
        *(f"{a}-{p}" for a in (node_health.HEALTH, node_health.PREFLIGHT) for p in pools),
        *(f"{node_health.HEALTH}-{p}" for p in cpu_pools),
        *(f"balloon-{p.name}" for p in flagship_plan.spec.node_pools),
        *(f"{gpu_devices.NAME}-{p}" for p in pools),
        serving_certs.NAME,
    }
    before, after = changed[serving_certs.NAME]  # the approver: one replica, and nothing else
    assert before["spec"]["replicas"] == 2 and after["spec"]["replicas"] == 1
    assert {**after, "spec": {**after["spec"], "replicas": 2}} == before
    for p in flagship_plan.spec.node_pools:  # balloons: the replicas, and nothing else
        before, after = changed[f"balloon-{p.name}"]
        assert before["spec"]["replicas"] == p.nodes and after["spec"]["replicas"] == 0
        assert {**after, "spec": {**after["spec"], "replicas": p.nodes}} == before
    for p in cpu_pools:  # a CPU pool's health agent: its rounds, and no GPU reading
        before, after = changed[f"{node_health.HEALTH}-{p}"]
        (container,) = after["spec"]["template"]["spec"]["containers"]
        assert f"--interval={agent_pods.ROUND_S}" in container["command"]
        assert not [c for c in container["command"] if c.startswith("--reading")]
        assert after["spec"]["template"]["spec"]["volumes"] == before["spec"]["template"]["spec"]["volumes"]
    left = {o["metadata"]["name"] for o in objects if agent_pods.left_out(o)}
    assert left == {f"{node_health.GPU_TEST}-{p}" for p in pools}
    for pool in pools:
        before, after = changed[f"{node_health.PREFLIGHT}-{pool}"]
        (container,) = after["spec"]["template"]["spec"]["containers"]
        assert before["spec"]["template"]["spec"]["containers"][0]["image"] == GPU_TESTS_IMAGE
        assert container["image"] == AGENTS_IMAGE
        assert container["resources"] == node_health.AGENT_RESOURCES
        flags = [c for c in container["command"] if c.startswith("--")]
        assert "--burn-seconds=0" in flags and f"--interval={agent_pods.ROUND_S}" in flags
        assert len([f for f in flags if f.startswith("--burn-seconds")]) == 1
        reading = f"--reading={agent_pods.MOUNT}/{Path(agent_pods.READING).name}"
        _, health = changed[f"{node_health.HEALTH}-{pool}"]
        for ds in (after, health):
            pod = ds["spec"]["template"]["spec"]
            assert reading in pod["containers"][0]["command"]
            assert {
                "name": "lab-reading",
                "hostPath": {"path": agent_pods.READING_DIR, "type": "DirectoryOrCreate"},
            } in pod["volumes"]
        # what it changed, and only that: the rest of the pod template is the plan's
        for ds_before, ds_after in (
            changed[f"{node_health.PREFLIGHT}-{pool}"],
            changed[f"{node_health.HEALTH}-{pool}"],
        ):
            keep = {
                k: v
                for k, v in ds_before["spec"]["template"]["spec"].items()
                if k not in ("containers", "volumes")
            }
            assert {k: ds_after["spec"]["template"]["spec"][k] for k in keep} == keep
            assert ds_after["metadata"] == ds_before["metadata"]
    # NVIDIA's device plugin: the lab's, on the node's reading, in the plan's pod otherwise
    before, after = changed[f"{gpu_devices.NAME}-{pools[0]}"]
    (plugin,) = after["spec"]["template"]["spec"]["containers"]
    assert before["spec"]["template"]["spec"]["containers"][0]["image"] == gpu_devices.IMAGE
    assert plugin["image"] == IMAGES[agent_pods.DEVICE_PLUGIN]["ref"]  # the one lab up built
    assert f"--reading={agent_pods.MOUNT}/{Path(agent_pods.READING).name}" in plugin["command"]
    assert plugin["securityContext"]["runAsUser"] == 0
    pod_before, pod_after = before["spec"]["template"]["spec"], after["spec"]["template"]["spec"]
    assert {k: v for k, v in pod_after.items() if k not in ("containers", "volumes")} == {
        k: v for k, v in pod_before.items() if k not in ("containers", "volumes")
    }
    assert plugin["volumeMounts"][0] == before["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]
    _, controller = changed[node_health.HEALTH_CONTROLLER]
    assert (
        f"--max-cordoned-share={agent_pods.BREAKER_SHARE}"
        in controller["spec"]["template"]["spec"]["containers"][0]["command"]
    )


@pytest.mark.parametrize(
    ("fault", "level"), [("healthy", "healthy"), ("gpu-missing", "fatal"), ("xid-79", "fatal")]
)
def test_a_lab_gpu_nodes_reading_is_one_the_agents_accept_and_judge(
    fault: str, level: str, tmp_path: Path
) -> None:
    agent_pods.write_reading(tmp_path, "gpu-1", "Standard_ND96isr_H100_v5", 8, fault)
    reading = gpu_probe.load_reading(tmp_path / agent_pods.READING.lstrip("/"))
    assert gpu_probe.verdict(reading).level == level
    with pytest.raises(ValueError, match="fault 'melted': one of healthy, gpu-missing, xid-79"):
        agent_pods.reading("gpu-1", "Standard_ND96isr_H100_v5", 8, "melted")
