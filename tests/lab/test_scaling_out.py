"""Scale-out without Ansible, on the lab's real control plane (superkube.lab.scaleout):

- the GPU pool's image is baked by converging a builder host with the node roles and generalizing it
  with generalize.yml over SSH; it carries the
  node software and the imported images, and none of the builder's own state, no join credential
  (kube-proxy's client certificate is still in it: docs/01-operating-on-azure.md says so);
- the join-token publisher, a service converge installed on the API-server hosts (the join_tokens
  role), issues a short-lived token in the real API server from the one host that holds its lease,
  and writes the pool's model: the plan's custom data, from the in-cluster layer's ConfigMap, plus the
  bootstrap kubeconfig. Nothing runs it by hand;
- four instances boot from the image with that custom data alone, back to back: each one's kubelet joins
  by that token (its CSR says so), registers as the plan says, passes preflight and is schedulable,
  and no SSH login ever reached any of them;
- scale-in drains and deletes two: their Nodes are gone and the next instance takes a freed address;
- a node health cordoned for a fatal GPU is returned by name, as remediation deletes its VM, and a
  new instance joins behind preflight in its place.

Shares the control-plane lab (same shape) and runs after test_split_control_plane (tests/lab/conftest.py
orders the modules of a shape).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from superkube.cli import app
from superkube.cluster import cloudinit, join
from superkube.lab import inventory, machines, nodes, processes, scaleout
from superkube.lab.state import PREFIX, Lab
from superkube.model import teams
from superkube.model.spec import PREFLIGHT_TAINT_KEY
from tests.lab.conftest import Labs, get, kubectl, sh
from tests.lab.test_running_the_agents import wait_for

JOINED = ("gpu-1", "cpu-1")
NEW = 4


def gpu_pool(fleet: Lab) -> str:
    return next(h.pool for h in fleet.hosts if h.group == "gpu_nodes")


@pytest.fixture(scope="module")
def baked(labs: Labs, control_plane: Lab) -> dict[str, Any]:
    labs.apply(control_plane)
    nodes.join(control_plane, JOINED)
    pool = gpu_pool(control_plane)
    image = scaleout.bake(control_plane, pool)
    return {"pool": pool, "published": from_the_api_servers(control_plane, pool), "image": image}


def from_the_api_servers(fleet: Lab, pool: str) -> dict[str, Any]:
    """The pool's model as the publisher on the API-server hosts wrote it (a round a minute, once
    `lab apply` made the documents' ConfigMap), and the host that holds the publisher's lease."""
    scale_set = fleet.pools[pool]["scale_set"]
    path = wait_for(
        f"{scale_set}'s model from an API-server host",
        lambda: (lambda p: p if p is not None and "/hosts/apiservers-" in str(p) else None)(
            scaleout.model_path(fleet, scale_set)
        ),
        timeout=240,
    )
    kubeconfig = yaml.safe_load(join.joining_file(cloudinit.decode(path.read_text()))["content"])  # type: ignore[index]
    lease = get(fleet, "lease", "-n", join.PUBLISHER_NAMESPACE, join.PUBLISHER)
    return {
        "path": path,
        "scale_set": scale_set,
        "token_id": join.Token.parse(kubeconfig["users"][0]["user"]["token"]).id,
        "holder": lease["spec"]["holderIdentity"],
    }


@pytest.fixture(scope="module")
def scaled(control_plane: Lab, baked: dict[str, Any]) -> dict[str, Any]:
    before = {h.name for h in control_plane.hosts}
    result = CliRunner().invoke(app, ["lab", "scale", baked["pool"], f"+{NEW}", "--output", "json"])
    assert result.exit_code == 0, result.output
    instances = json.loads(result.stdout)
    fleet = Lab.load()
    assert fleet is not None
    return {"instances": instances, "fleet": fleet, "new": sorted({h.name for h in fleet.hosts} - before)}


def test_the_baked_image_holds_the_node_software_and_nothing_of_the_builder(
    control_plane: Lab, baked: dict[str, Any]
) -> None:
    root = baked["image"] / "root"
    assert (root / "usr/local/bin/kubelet").is_file()
    config = yaml.safe_load((root / "var/lib/kubelet/config.yaml").read_text())
    assert config["kind"] == "KubeletConfiguration" and config["serverTLSBootstrap"] is True
    assert (root / "etc/kubernetes/pki/ca.crt").is_file()
    assert (baked["image"] / "containerd").is_dir() and any((baked["image"] / "containerd").iterdir())
    # none of the builder's own state, no credential, and none of cloud-init's files (each instance's)
    assert not (root / cloudinit.BOOTSTRAP_KUBECONFIG.lstrip("/")).exists()
    assert not list((root / "etc/ssh").glob("ssh_host_*"))
    assert (root / "etc/machine-id").read_text() == ""
    assert not (root / "var/lib/kubelet/pki").exists()  # the builder's kubelet certificates, if any
    for path in control_plane.cloud_init[baked["pool"]]:
        assert not (root / path.lstrip("/")).exists(), path
    assert all(h.name != f"builder-{baked['pool']}" for h in control_plane.hosts)  # the builder is gone
    # generalize.yml removed all that over SSH on the running builder, as it does on Azure (where no
    # sweep follows): the capture's own sweep found nothing left, not even the shutdown's journal
    swept = json.loads((baked["image"] / "image.json").read_text())["swept_after_capture"]
    assert swept == [], swept


def test_the_publisher_on_the_api_servers_wrote_an_expiring_token_into_the_pools_model(
    control_plane: Lab, baked: dict[str, Any]
) -> None:
    published = baked["published"]
    apiservers = [h.name for h in control_plane.hosts if h.group == "apiservers"]
    assert published["holder"] in apiservers
    # the lease holder wrote it, into its own folder; no other host did
    assert f"/hosts/{published['holder']}/root/" in str(published["path"])
    for other in set(apiservers) - {published["holder"]}:
        assert not list(
            (machines.host_dir(control_plane, control_plane.host(other)) / "root").glob(
                inventory.PUBLISHED_MODELS.lstrip("/") + "/*"
            )
        ), other
    assert oct(os.stat(published["path"]).st_mode & 0o777) == "0o600"
    doc = cloudinit.decode(published["path"].read_text())
    # the plan's document, as the in-cluster layer's ConfigMap holds it, plus the one file
    planned = get(control_plane, "configmap", "-n", join.PUBLISHER_NAMESPACE, join.DOCUMENTS_CONFIGMAP)
    plan = yaml.safe_load(planned["data"][published["scale_set"]])
    assert doc["runcmd"] == plan["runcmd"] and doc["write_files"][:-1] == plan["write_files"]
    secret = get(
        control_plane,
        "secret",
        "-n",
        join.TOKEN_NAMESPACE,
        f"bootstrap-token-{published['token_id']}",
    )
    left = (join.expiration(secret) - join.now()).total_seconds()  # type: ignore[operator]
    assert 0 < left <= join.DEFAULT_TTL_S
    # the service the role runs
    unit = sh(control_plane, published["holder"], "systemctl is-active superkube-join-tokens.service")
    assert unit.strip() == "active"


def test_new_instances_join_from_the_image_and_their_custom_data_alone(
    baked: dict[str, Any], scaled: dict[str, Any]
) -> None:
    fleet: Lab = scaled["fleet"]
    new = scaled["new"]
    assert len(new) == NEW and {i["node"] for i in scaled["instances"]} == set(new)
    for i in scaled["instances"]:
        assert 0 < i["boot_to_ready_s"] <= i["boot_to_schedulable_s"], i
    token_user = f"system:bootstrap:{baked['published']['token_id']}"
    csrs = json.loads(kubectl(fleet, "get", "csr", "-o", "json").stdout)["items"]
    by_token = {c["metadata"]["name"] for c in csrs if c["spec"]["username"] == token_user}
    assert len(by_token) >= NEW, "each new kubelet asked for its certificate with the published token"
    for name in new:
        node = get(fleet, "node", name)
        taints = {(t["key"], t.get("value")) for t in node["spec"].get("taints") or []}
        assert (teams.TEAM_KEY, teams.ANY) in taints and PREFLIGHT_TAINT_KEY not in {k for k, _ in taints}
        assert node["metadata"]["labels"]["kubernetes.io/hostname"] == name
        host = fleet.host(name)
        assert host.image == str(baked["image"] / "root")
        assert scaleout.logins(fleet, host) == [], f"{name}: an SSH login reached it"
        events = get(fleet, "events", "-A", f"--field-selector=involvedObject.name={name}")["items"]
        assert "PreflightPassed" in {e["reason"] for e in events}, name


def test_scale_in_drains_and_deletes_and_the_next_instance_takes_a_freed_address(
    scaled: dict[str, Any], baked: dict[str, Any]
) -> None:
    fleet = Lab.load()
    assert fleet is not None
    result = CliRunner().invoke(app, ["lab", "scale", baked["pool"], "-2"])
    assert result.exit_code == 0, result.output
    gone = scaled["new"][-2:]
    freed = {fleet.host(n).address for n in gone}
    after = Lab.load()
    assert after is not None and not {h.name for h in after.hosts} & set(gone)
    names = {n["metadata"]["name"] for n in get(after, "nodes")["items"]}
    assert not names & set(gone)
    # nothing of them is left on this machine: no namespace, no root, no mount, no veth
    namespaces = processes.lab_namespaces()
    mounts = Path("/proc/mounts").read_text()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    for name in gone:
        assert f"{PREFIX}-{name}" not in namespaces
        assert not (Path(after.state_dir) / "hosts" / name).exists()
        assert f"/hosts/{name}/" not in mounts
    assert not [line for line in links.splitlines() if " skl" in line]  # every veth end is in a namespace
    again = scaleout.scale_out(after, baked["pool"], 1)
    assert after.host(again[0].name).address in freed


def test_a_fatal_instance_leaves_and_a_new_one_joins_behind_preflight_in_its_place(
    scaled: dict[str, Any], baked: dict[str, Any]
) -> None:
    """The end of the health loop on real instances: a node whose GPU falls off the bus is cordoned
    by health, its instance is returned by name (what remediation's delete does to a scale set), and
    a new instance from the pool's image joins, passes preflight and is schedulable."""
    from superkube.agents import node_health as health
    from superkube.lab import faults

    fleet = Lab.load()
    assert fleet is not None
    sick = scaled["new"][0]
    faults.inject(fleet, sick, "gpu-fatal")
    wait_for(f"{sick}: cordoned by health", lambda: (lambda n: n["spec"].get("unschedulable") and health.ANNOTATION
             in (n["metadata"].get("annotations") or {}))(get(fleet, "node", sick)), timeout=120)  # fmt: skip
    result = CliRunner().invoke(app, ["lab", "scale", baked["pool"], "-1", "--name", sick])
    assert result.exit_code == 0, result.output
    after = Lab.load()
    assert after is not None and sick not in {h.name for h in after.hosts}
    assert sick not in {n["metadata"]["name"] for n in get(after, "nodes")["items"]}
    (new,) = scaleout.scale_out(after, baked["pool"], 1)
    node = get(after, "node", new.name)
    assert not node["spec"].get("unschedulable")
    assert PREFLIGHT_TAINT_KEY not in {t["key"] for t in node["spec"].get("taints") or []}
    events = get(after, "events", "-A", f"--field-selector=involvedObject.name={new.name}")["items"]
    assert "PreflightPassed" in {e["reason"] for e in events}
