"""The Azure capture job (superkube.fleet.capture) against a loopback Resource Manager that keeps
Azure's rules (tests/fleet/resource_manager.py): the builder is made in the pool's subnet with the
pool's inventory tags, converged with the bake's variables and generalized with generalize.yml while
it runs, then deallocated, generalized and captured, and deleted with its NIC and disk, also when a
step fails; a version that exists is refused before anything is made; a stopped capture resumes.

The converge steps are recorded here, not run: they are the playbooks the lab's bake runs for real
over SSH (tests/lab/test_scaling_out.py). Azure itself cannot be reached from this machine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from superkube.cli import app
from superkube.cluster import bake
from superkube.fleet import arm, capture
from superkube.plan import engine as planning
from tests.fleet.resource_manager import TOKEN, ResourceManager

ROOT = Path(__file__).resolve().parents[2]
SUBSCRIPTION = "00000000-1111-2222-3333-444444444444"


@pytest.fixture(scope="module")
def dev() -> tuple[Any, Any, tuple[str, ...]]:
    _, spec, addresses = planning.load(ROOT, "dev")
    return spec, addresses, capture.pool_files(planning.run(ROOT, "dev"), "gpu")


@pytest.fixture
def rm() -> Iterator[ResourceManager]:
    with ResourceManager() as server:
        yield server


def client(rm: ResourceManager) -> arm.Arm:
    return arm.Arm(token=lambda: TOKEN, base=rm.url, poll_s=0.0, sleep=lambda s: None)


def azure_as_pulumi_left_it(rm: ResourceManager, t: capture.Target) -> str:
    """The pool's scale set, its subnet and the kind's image definition, as `pulumi up` makes them."""
    subnet = f"{t.group}/providers/Microsoft.Network/virtualNetworks/vnet-spoke/subnets/snet-{t.pool}"
    rm.add(subnet, {"properties": {"addressPrefix": "10.1.0.0/20"}})
    nic = {"name": "nic", "properties": {"ipConfigurations": [{"name": "primary", "properties": {"subnet": {"id": subnet}}}]}}  # fmt: skip
    rm.add(
        t.scale_set_path,
        {
            "location": "southcentralus",
            "zones": ["2"],
            "tags": {"cluster": "dev", "superkube-role": "gpu_nodes", "superkube-pool": t.pool, "max": "4"},
            "sku": {"name": "Standard_ND96isr_H100_v5"},
            "properties": {
                "virtualMachineProfile": {"networkProfile": {"networkInterfaceConfigurations": [nic]}}
            },
        },
    )
    rm.add(t.definition, {"properties": {"osState": "Generalized", "hyperVGeneration": "V2"}})
    return subnet


class Recorder:
    """The converge steps: what they were asked, and the builder's state when they ran."""

    def __init__(self, rm: ResourceManager, t: capture.Target, fail_on: str = "") -> None:
        self.rm, self.t, self.fail_on = rm, t, fail_on
        self.calls: list[tuple[str, str, dict[str, Any], str]] = []
        self.builder: dict[str, Any] = {}  # the builder VM as Resource Manager held it then

    def __call__(self, playbook: str, limit: str, extra_vars: dict[str, Any]) -> None:
        vm = self.rm.get(self.t.vm)
        self.builder = self.builder or dict(vm or {})
        self.calls.append((playbook, limit, extra_vars, vm["_power"] if vm else "absent"))
        if playbook == self.fail_on:
            raise capture.CaptureError(f"{playbook} on {limit} failed (a task failed)")


def test_a_capture_converges_generalizes_and_captures_the_builder_then_deletes_it(
    dev: Any, rm: ResourceManager
) -> None:
    spec, addresses, files = dev
    t = capture.target(spec, addresses, SUBSCRIPTION, "gpu", "1.4.0", files)
    subnet = azure_as_pulumi_left_it(rm, t)
    converge = Recorder(rm, t)
    lines: list[str] = []
    made = capture.capture(client(rm), t, converge, lines.append)
    made_vm = converge.builder
    # the builder: the pool's size and base image, in its subnet and zone, with the inventory's tags
    props = made_vm["properties"]
    assert props["hardwareProfile"]["vmSize"] == "Standard_ND96isr_H100_v5"
    assert props["storageProfile"]["imageReference"] == {
        "publisher": "microsoft-dsvm", "offer": "ubuntu-hpc", "sku": "2204", "version": "latest"
    }  # fmt: skip
    nic = props["networkProfile"]["networkInterfaceConfigurations"][0]["properties"]
    assert nic["ipConfigurations"][0]["properties"]["subnet"]["id"] == subnet
    assert made_vm["zones"] == ["2"] and made_vm["location"] == "southcentralus"
    assert made_vm["tags"] == {
        "cluster": "dev", "superkube-role": "gpu_nodes", "superkube-pool": "gpu", capture.BUILDER_TAG: "1.4.0"
    }  # fmt: skip
    assert "customData" not in props["osProfile"]  # an image build has no custom data, no join credential
    assert props["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"][0]["keyData"] == spec.ssh_public_key
    # the same two playbooks and variables as the lab's bake, on the running builder alone
    assert [(c[0], c[1], c[3]) for c in converge.calls] == [
        ("site.yml", t.builder, "running"),
        ("generalize.yml", t.builder, "running"),
    ]
    assert converge.calls[0][2] == bake.BAKE_VARS
    generalized = converge.calls[1][2]["superkube_generalized_paths"]
    assert generalized[: len(bake.GENERALIZED)] == list(bake.GENERALIZED)
    assert set(files) <= set(generalized) and "/etc/default/kubelet" in files
    # Resource Manager saw the steps in order, and the builder is gone with its NIC and disk
    assert rm.writes() == [
        ("PUT", t.vm),
        ("POST", f"{t.vm}/deallocate"),
        ("POST", f"{t.vm}/generalize"),
        ("PUT", t.image_version),
        ("DELETE", t.vm),
    ]
    version = rm.get(t.image_version)
    assert version and version["properties"]["provisioningState"] == "Succeeded"
    assert version["properties"]["storageProfile"]["source"]["virtualMachineId"] == t.vm
    assert not [p for p in rm.resources if t.builder.lower() in p]
    assert made["image"] == "gallery:1.4.0" and made["builder_deleted"] is True
    assert any("deleting the builder" in line for line in lines)


def test_a_version_that_exists_is_refused_before_anything_is_made(dev: Any, rm: ResourceManager) -> None:
    spec, addresses, files = dev
    t = capture.target(spec, addresses, SUBSCRIPTION, "gpu", "1.4.0", files)
    azure_as_pulumi_left_it(rm, t)
    rm.add(t.image_version, {"properties": {"provisioningState": "Succeeded"}})
    with pytest.raises(capture.CaptureError, match=r"gallery:1.4.0 of the gpu node image exists already"):
        capture.capture(client(rm), t, Recorder(rm, t))
    assert rm.writes() == []


def test_no_definition_means_pulumi_up_first(dev: Any, rm: ResourceManager) -> None:
    spec, addresses, files = dev
    t = capture.target(spec, addresses, SUBSCRIPTION, "gpu", "1.4.0", files)
    with pytest.raises(capture.CaptureError, match="run pulumi up first"):
        capture.capture(client(rm), t, Recorder(rm, t))
    assert rm.writes() == []


def test_a_failed_converge_deletes_the_builder_and_makes_no_version(dev: Any, rm: ResourceManager) -> None:
    spec, addresses, files = dev
    t = capture.target(spec, addresses, SUBSCRIPTION, "gpu", "1.4.1", files)
    azure_as_pulumi_left_it(rm, t)
    with pytest.raises(capture.CaptureError, match=r"site\.yml on bld-dev-gpu-1-4-1 failed"):
        capture.capture(client(rm), t, Recorder(rm, t, fail_on="site.yml"))
    assert rm.writes() == [("PUT", t.vm), ("DELETE", t.vm)]
    assert rm.get(t.image_version) is None and not [p for p in rm.resources if t.builder.lower() in p]


def test_a_builder_whose_creation_failed_is_deleted(dev: Any, rm: ResourceManager) -> None:
    """Azure had no capacity for the size, say: the VM's creation ends Failed, and what it left (the
    VM, its NIC, its disk) is deleted all the same."""
    spec, addresses, files = dev
    t = capture.target(spec, addresses, SUBSCRIPTION, "gpu", "1.4.4", files)
    azure_as_pulumi_left_it(rm, t)
    rm.fail_next = "AllocationFailed"
    with pytest.raises(arm.ArmError, match=r"creating builder .*: Failed: AllocationFailed: "):
        capture.capture(client(rm), t, Recorder(rm, t))
    assert rm.writes() == [("PUT", t.vm), ("DELETE", t.vm)]
    assert not [p for p in rm.resources if t.builder.lower() in p]


def test_a_capture_that_fails_past_deallocation_keeps_the_builder_and_goes_on_from_it(
    dev: Any, rm: ResourceManager
) -> None:
    """The version's replication fails: the builder's disk is the image, so it is kept (deallocated),
    and the same command deletes the failed version and captures again, with no second converge."""
    spec, addresses, files = dev
    t = capture.target(spec, addresses, SUBSCRIPTION, "gpu", "1.4.5", files)
    azure_as_pulumi_left_it(rm, t)
    rm.fail_version = "ReplicationFailed"
    lines: list[str] = []
    with pytest.raises(arm.ArmError, match=r"capturing gallery:1\.4\.5: Failed: ReplicationFailed"):
        capture.capture(client(rm), t, Recorder(rm, t), lines.append)
    assert rm.get(t.vm) is not None and rm.get(t.vm)["_power"] == "deallocated"  # type: ignore[index]
    assert any("kept, deallocated" in line for line in lines)
    assert rm.get(t.image_version)["properties"]["provisioningState"] == "Failed"  # type: ignore[index]
    rm.requests.clear()
    converge = Recorder(rm, t)
    made = capture.capture(client(rm), t, converge)
    assert converge.calls == [] and made["builder_deleted"] is True
    assert rm.writes() == [("DELETE", t.image_version), ("PUT", t.image_version), ("DELETE", t.vm)]
    assert rm.get(t.image_version)["properties"]["provisioningState"] == "Succeeded"  # type: ignore[index]


def test_a_deallocated_builder_goes_on_to_be_generalized(dev: Any, rm: ResourceManager) -> None:
    spec, addresses, files = dev
    t = capture.target(spec, addresses, SUBSCRIPTION, "gpu", "1.4.6", files)
    azure_as_pulumi_left_it(rm, t)
    cli = client(rm)
    cli.put(t.vm, capture.COMPUTE_API, capture.builder_body(t, rm.get(t.scale_set_path) or {}), "builder")
    cli.post(f"{t.vm}/deallocate", capture.COMPUTE_API, "deallocate")
    rm.requests.clear()
    converge = Recorder(rm, t)
    capture.capture(cli, t, converge)
    assert converge.calls == []
    assert rm.writes() == [("POST", f"{t.vm}/generalize"), ("PUT", t.image_version), ("DELETE", t.vm)]


def test_a_stopped_capture_resumes_from_its_generalized_builder(dev: Any, rm: ResourceManager) -> None:
    """A capture stopped after generalizing (its version's replication failed, say) goes straight to
    the capture with the builder it left: no second converge of a generalized disk."""
    spec, addresses, files = dev
    t = capture.target(spec, addresses, SUBSCRIPTION, "gpu", "1.4.2", files)
    azure_as_pulumi_left_it(rm, t)
    cli = client(rm)
    body = capture.builder_body(t, rm.get(t.scale_set_path) or {})
    cli.put(t.vm, capture.COMPUTE_API, body, "a builder of an earlier run")
    cli.post(f"{t.vm}/deallocate", capture.COMPUTE_API, "deallocate")
    cli.post(f"{t.vm}/generalize", capture.COMPUTE_API, "generalize")
    rm.requests.clear()
    converge = Recorder(rm, t)
    capture.capture(cli, t, converge)
    assert converge.calls == []
    assert rm.writes() == [("PUT", t.image_version), ("DELETE", t.vm)]


def test_a_vm_of_that_name_not_made_by_a_capture_is_left_alone(dev: Any, rm: ResourceManager) -> None:
    spec, addresses, files = dev
    t = capture.target(spec, addresses, SUBSCRIPTION, "gpu", "1.4.3", files)
    azure_as_pulumi_left_it(rm, t)
    rm.add(t.vm, {"tags": {"owner": "someone"}, "properties": {}, "_power": "running"})
    with pytest.raises(capture.CaptureError, match="is not this capture's builder: delete it"):
        capture.capture(client(rm), t, Recorder(rm, t))
    assert rm.writes() == [] and rm.get(t.vm) is not None


def test_the_resource_managers_rules_the_order_rests_on(dev: Any, rm: ResourceManager) -> None:
    """Generalize before deallocate is refused, and so is a version from a VM not generalized: the
    order the job keeps is the only one Resource Manager takes."""
    spec, addresses, files = dev
    t = capture.target(spec, addresses, SUBSCRIPTION, "gpu", "1.5.0", files)
    azure_as_pulumi_left_it(rm, t)
    cli = client(rm)
    cli.put(t.vm, capture.COMPUTE_API, capture.builder_body(t, rm.get(t.scale_set_path) or {}), "builder")
    with pytest.raises(arm.ArmError, match=r"HTTP 409: OperationNotAllowed: .* since the VM is running"):
        cli.post(f"{t.vm}/generalize", capture.COMPUTE_API, "generalizing")
    with pytest.raises(arm.ArmError, match=r"HTTP 400: BadRequest: .*\['Specialized'\] than the parent"):
        cli.put(t.image_version, capture.GALLERY_API, capture.version_body(t, "southcentralus"), "capturing")


def test_the_client_waits_out_throttling_and_a_refused_token_once(rm: ResourceManager) -> None:
    tokens = iter(["stale", TOKEN])
    cli = arm.Arm(token=lambda: next(tokens), base=rm.url, poll_s=0.0, sleep=lambda s: None)
    path = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/rg-dev/providers/Microsoft.Compute/galleries/g"
    rm.add(path, {"properties": {}})
    rm.throttle = 2
    assert cli.get(path, "2024-03-03")["name"] == "g"  # 401 -> a new token; 429 twice -> waited out
    rm.throttle = 9
    with pytest.raises(arm.ArmError, match=r"^GET .*/galleries/g: HTTP 429: TooManyRequests: throttled$"):
        cli.get(path, "2024-03-03")


# --- the command line ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["gpu", "--version", "1.4"], "--version '1.4': write a gallery version as major.minor.patch"),
        (["tpu", "--version", "1.4.0"], "pool 'tpu': the stack has no such pool (pools: cpu, gpu)"),
        (["gpu", "--version", "1.4.0", "--subscription", "mine"], "--subscription 'mine': give the subscription's ID"),
    ],
    ids=["version", "pool", "subscription"],
)  # fmt: skip
def test_bad_input_is_one_line_before_anything_runs(args: list[str], says: str, tmp_path: Path) -> None:
    inventory = tmp_path / "dev.azure_rm.yml"
    inventory.write_text("plugin: azure.azcollection.azure_rm\n")
    env = {"AZURE_SUBSCRIPTION_ID": SUBSCRIPTION}
    result = CliRunner().invoke(app, ["image", "capture", *args, "-i", str(inventory), "-s", "dev"], env=env)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == f"error: {says}" or result.stderr.strip().startswith(f"error: {says}")
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_gallery_pool_needs_a_base_image(write_stack: Any, tmp_path: Path) -> None:
    config = yaml_stack(ROOT / "stacks" / "Pulumi.dev.yaml")
    pools = config["superkube:node_pools"].replace(
        "image: microsoft-dsvm:ubuntu-hpc:2204:latest", "image: gallery:1.0.0"
    )
    stack = write_stack({**config, "superkube:node_pools": pools})
    inventory = tmp_path / "dev.azure_rm.yml"
    inventory.write_text("plugin: azure.azcollection.azure_rm\n")
    args = ["image", "capture", "gpu", "--version", "1.1.0", "-i", str(inventory), "-s", str(stack)]
    result = CliRunner().invoke(app, [*args, "--subscription", SUBSCRIPTION])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: pool gpu boots gallery:1.0.0: set its base_image to the marketplace image a bake starts "
        "from (publisher:offer:sku:version)"
    )


def test_the_command_runs_the_real_converge_and_cleans_up_when_no_host_answers(
    rm: ResourceManager, tmp_path: Path
) -> None:
    """End to end through the command line and ansible-runner: the builder is made, but the
    inventory here reaches no Azure, so site.yml matches no host; the capture stops with one line,
    exit 1, and the builder is deleted."""
    _, spec, addresses = planning.load(ROOT, "dev")
    t = capture.target(spec, addresses, SUBSCRIPTION, "gpu", "2.0.0")
    azure_as_pulumi_left_it(rm, t)
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all:\n  hosts: {}\n")
    env = {"AZURE_SUBSCRIPTION_ID": SUBSCRIPTION, "AZURE_ACCESS_TOKEN": TOKEN, "SUPERKUBE_ARM_URL": rm.url}
    args = ["image", "capture", "gpu", "--version", "2.0.0", "-i", str(inventory), "-s", "dev"]
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 1, result.output
    last = result.stderr.strip().splitlines()[-1]
    assert (
        last
        == f"error: site.yml reached no host {t.builder}: is it in the inventory (tagged, running, reachable)?"
    )
    assert rm.writes() == [("PUT", t.vm), ("DELETE", t.vm)]
    assert rm.get(t.vm) is None


def yaml_stack(path: Path) -> dict[str, Any]:
    import yaml

    return dict(yaml.safe_load(path.read_text())["config"])
